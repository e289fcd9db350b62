"""The real thing: ``flwr run . --stream`` on a managed local SuperLink with Ray simulation.

Runs in its own Flower home (``FLWR_HOME``) so it starts — and afterwards stops — its own
SuperLink, with runtime dependency installation off (the app runs in this environment).
"""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLWR = Path(sys.executable).with_name("flwr")


def _stop_superlink(flwr_home: Path) -> None:
    """Kill the SuperLink (and its children) that this test's ``flwr run`` started."""
    out = subprocess.run(["pgrep", "-f", str(flwr_home)], capture_output=True, text=True).stdout.split()
    for pid in out:
        try:
            os.killpg(os.getpgid(int(pid)), signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass


@pytest.mark.skipif(not FLWR.exists(), reason="flwr CLI not installed next to this Python")
def test_flwr_run_stream_end_to_end(tmp_path):
    if subprocess.run(["pgrep", "-f", "flower-superlink"], capture_output=True).returncode == 0:
        pytest.fail("a flower-superlink is already running: stop it (pkill -f flower-superlink) so this "
                    "test can start its own on the local ports")
    home = tmp_path / "flwr-home"
    out = tmp_path / "out"
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    run_config = (f"method='fedup' scenario='class' pretrain-rounds=2 continue-rounds=1 local-epochs=1 "
                  f"fedup-epochs=20 mia-max-samples=30 cache-dir='{tmp_path / 'cache'}' outputs-dir='{out}'")
    try:
        proc = subprocess.run(
            [str(FLWR), "run", ".", "--stream", "--federation-config",
             "num-supernodes=3 client-resources-num-cpus=1", "--run-config", run_config],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    finally:
        _stop_superlink(home)
    log = proc.stdout + proc.stderr
    match = re.search(r"fedunlearn results folder: (\S+)", log)
    assert match, log[-3000:]
    results = json.loads((Path(match.group(1)) / "results.json").read_text())
    assert results["run"]["num_clients"] == 3 and results["run"]["method"] == "fedup"
    assert results["models"]["restored"]["equals_original"] is True
    assert 0.0 <= results["models"]["unlearned"]["forget_acc"] <= 1.0
    assert results["cost"]["unlearn"]["rounds"] == 1 and results["cost"]["unlearn"]["bytes_up"] > 0
