"""The Ray simulation over a Ray cluster of several nodes (the README's "several hosts" recipe).

``ray_cluster.RayCluster`` starts a head with no CPU (a SuperLink host runs no ClientApp) and two
joined nodes of one CPU each, all on this machine; ``flwr run`` on a local SuperLink whose
environment names the cluster (``RAY_ADDRESS``) must then place its ClientApps on the joined nodes,
give the run's metrics that one process gives, and leave no Ray process behind.
"""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from launch_federation import LocalSimulation  # noqa: E402
from ray_cluster import RayCluster  # noqa: E402
from results_metrics import metric_differences  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(shutil.which("ray", path=str(Path(sys.executable).parent)) is None,
                                 reason="the ray CLI is not installed next to this Python")]

CLIENTS = 4
TINY = ("method='fedup' scenario='class' pretrain-rounds=2 continue-rounds=1 local-epochs=1 fedup.epochs=20 "
        "mia-max-samples=30")


def test_flwr_run_places_clientapps_on_the_joined_nodes_of_a_ray_cluster(tmp_path):
    from server_app.inprocess import parse_overrides, run_inprocess

    run_config = f"{TINY} cache-dir='{tmp_path / 'cache'}' outputs-dir='{tmp_path / 'out'}'"
    with RayCluster(node_cpus=(1, 1), head_cpus=0, stop_timeout=10) as cluster:
        nodes = cluster.nodes()
        joined = {n["node_id"] for n in nodes if not n["head"]}
        assert len(nodes) == 3 and len(joined) == 2 and all(n["cpus"] == (0 if n["head"] else 1) for n in nodes)
        with LocalSimulation(tmp_path / "flwr-home", env=cluster.env()) as simulation:
            proc = simulation.flwr("run", ".", "--stream", "--federation-config",
                                   f"num-supernodes={CLIENTS} client-resources-num-cpus=1", "--run-config", run_config,
                                   timeout=900)
        actors = cluster.actors("ClientAppActor")
        assert cluster.pids()
    assert cluster.pids() == []  # every process of the cluster stopped by its group
    assert not Path(cluster.temp_dir).exists()
    # One ClientApp actor per joined node's CPU, on both joined nodes and never on the CPU-less head: the
    # simulation joined this cluster (a Ray of its own would have no such nodes).
    assert {a["node_id"] for a in actors} == joined and len(actors) == 2, actors

    log = proc.stdout + proc.stderr
    match = re.search(r"fedunlearn results folder: (\S+)", log)
    assert match, log[-3000:]
    on_cluster = json.loads((Path(match.group(1)) / "results.json").read_text())
    assert on_cluster["run"]["num_clients"] == CLIENTS and on_cluster["models"]["restored"]["equals_original"]
    folder = run_inprocess(parse_overrides(f"{TINY} cache-dir='{tmp_path / 'cache2'}' outputs-dir='{tmp_path / 'out2'}'"),
                           CLIENTS)
    in_process = json.loads((Path(folder) / "results.json").read_text())
    differences = metric_differences(on_cluster, in_process)
    assert differences and max(differences.values()) <= 0.01, differences
