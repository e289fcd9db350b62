#!/usr/bin/env bash
# Install fedunlearn and everything it needs into the current Python environment.
# PyTorch first, pinned, so pip takes the local wheels where the machine has them; then the app.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install "torch==2.14.1" "torchvision==0.29.1"
python -m pip install -e ".[llm,text,test]"
