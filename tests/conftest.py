"""Shared test setup: one torch thread (CI has 2 cores), and small helpers."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def digits_config():
    """Run-config overrides for a tiny, fast federation on the offline default task."""
    return {"pretrain-rounds": 2, "continue-rounds": 1, "local-epochs": 1, "mia-max-samples": 50}
