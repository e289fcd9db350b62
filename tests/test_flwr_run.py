"""The real thing: ``flwr run . --stream`` on a managed local SuperLink with Ray simulation.

Runs in its own Flower home (``FLWR_HOME``) and on its own free local ports
(``FLWR_LOCAL_SUPERLINK_HTTP_API_PORT``, ``FLWR_LOCAL_CONTROL_API_PORT``) through
``launch_federation.LocalSimulation``, which starts the managed SuperLink with Flower's command line
but a start-up wait that a busy CI machine does not exceed, and afterwards stops it by its pid.
Runtime dependency installation is off (the app runs in this environment).
"""

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLWR = Path(sys.executable).with_name("flwr")
sys.path.insert(0, str(ROOT / "scripts"))

from launch_federation import LocalSimulation, local_superlink_pids  # noqa: E402


@pytest.mark.slow
@pytest.mark.skipif(not FLWR.exists(), reason="flwr CLI not installed next to this Python")
def test_flwr_run_stream_end_to_end(tmp_path):
    home = tmp_path / "flwr-home"
    out = tmp_path / "out"
    # local-epochs=3 is the global default, which digits-lenet5's preset (1) would replace were it not given
    run_config = (f"method='fedup' scenario='class' pretrain-rounds=2 continue-rounds=1 local-epochs=3 "
                  f"fedup.epochs=20 mia-max-samples=30 cache-dir='{tmp_path / 'cache'}' outputs-dir='{out}'")
    with LocalSimulation(home) as simulation:
        assert local_superlink_pids(home)
        proc = simulation.flwr("run", ".", "--stream", "--federation-config",
                               "num-supernodes=3 client-resources-num-cpus=1", "--run-config", run_config)
    assert not local_superlink_pids(home)
    log = proc.stdout + proc.stderr
    match = re.search(r"fedunlearn results folder: (\S+)", log)
    assert match, log[-3000:]
    results = json.loads((Path(match.group(1)) / "results.json").read_text())
    assert results["run"]["num_clients"] == 3 and results["run"]["method"] == "fedup"
    assert results["run"]["config"]["local-epochs"] == 3 and "local-epochs" not in results["run"]["presets"]
    assert results["run"]["config"]["fedup.epochs"] == 20  # a namespaced key, set as Flower parses it
    assert results["models"]["restored"]["equals_original"] is True
    assert 0.0 <= results["models"]["unlearned"]["forget_acc"] <= 1.0
    assert results["cost"]["unlearn"]["rounds"] == 1 and results["cost"]["unlearn"]["bytes_up"] > 0
