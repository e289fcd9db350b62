"""The app over Flower's Deployment Engine: a SuperLink and 3 SuperNodes as separate processes, TLS
and SuperNode authentication on, brought up by ``scripts/launch_federation.py``; the SuperLink
listens on all interfaces and the nodes connect to this machine's network address, as from other
hosts (loopback where the machine has no other address).

One federation serves the whole module (starting one costs seconds); the tests run in file order:
an unregistered node is refused, ``retrain`` and ``fedup`` give simulation's metrics (every node
prepared before the first run by ``client_app.prepare``, whose stored view both runs read; every
message's ClientApp forked from the launcher's fork server), two requests answered from an
operator's own model, a node killed while unlearning, a node killed while pretraining, and no
process left behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from launch_federation import BIN, LocalFederation, group_members, own_address  # noqa: E402
from results_metrics import metric_differences  # noqa: E402

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (BIN / "flower-superlink").exists(),
                                 reason="flower-superlink not installed (next to this Python or on PATH)")]

TINY = "scenario='class' pretrain-rounds=2 continue-rounds=1 local-epochs=1 fedup.epochs=20 mia-max-samples=30"
NUM_NODES = 3


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """The running federation, an unregistered intruder node, and what the tests hand on. The
    SuperLink listens on all interfaces and the nodes connect to this machine's own network
    address (loopback only where it has none), as SuperNodes on other hosts would. Every folder
    that holds Flower's commands is taken off PATH, as when an interpreter is run by its full path
    without its environment activated: the SuperLink and the nodes start ``flower-superexec`` and
    ``flwr-clientapp`` by name, and the launcher must give them the folder itself."""
    work = tmp_path_factory.mktemp("deployment")
    without_flower = [folder for folder in os.environ.get("PATH", "").split(os.pathsep)
                      if folder and not any((Path(folder) / name).exists() for name in ("flower-superexec", "flwr-clientapp"))]
    with pytest.MonkeyPatch.context() as patch:  # for the federation's whole life: nodes start later too
        patch.setenv("PATH", os.pathsep.join(without_flower))
        federation = LocalFederation(work / "federation", NUM_NODES, host=own_address(), run_dir=work)
        with federation:
            intruder = federation.start_node(NUM_NODES, register=False, name="intruder")
            yield {"federation": federation, "intruder": intruder, "work": work}


def _run_config(work: Path, method: str, extra: str = "") -> str:
    return f"method='{method}' {TINY} cache-dir='{work / 'cache'}' outputs-dir='{work / 'out'}' {extra}".strip()


def _results(folder: str) -> dict:
    return json.loads((Path(folder) / "results.json").read_text())


def test_supernode_without_a_registered_key_cannot_join(deployment):
    federation, intruder = deployment["federation"], deployment["intruder"]
    try:
        intruder.wait(timeout=90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the unregistered SuperNode is still running: {federation.log_of('intruder')[-800:]}")
    assert intruder.returncode != 0
    assert len(federation.online_nodes()) == NUM_NODES


def test_retrain_and_fedup_over_tls_give_simulations_metrics(deployment, tmp_path):
    from server_app.inprocess import parse_overrides, run_inprocess

    federation, work = deployment["federation"], deployment["work"]
    for method in ("retrain", "fedup"):
        result = federation.run(_run_config(work, method), timeout=900)
        assert result.status == "finished:completed" and result.folder, result.log[-3000:]
        assert f"federation: {NUM_NODES} clients" in result.log
        deployed = _results(result.folder)
        assert deployed["run"]["method"] == method and deployed["run"]["num_clients"] == NUM_NODES
        deployment.setdefault("folders", []).append(result.folder)
        federation.prepare = False  # the fedup run reads the view prepared for the retrain run (same key)
        if method == "fedup":
            assert deployed["models"]["restored"]["equals_original"] is True
            assert deployed["cost"]["unlearn"]["rounds"] == 1 and deployed["cost"]["unlearn"]["bytes_up"] > 0
        simulated_config = parse_overrides(_run_config(tmp_path, method))
        simulated = _results(run_inprocess(simulated_config, NUM_NODES))  # its own cache: trained afresh
        differences = metric_differences(deployed, simulated)
        assert differences and max(differences.values()) <= 0.01, differences
    # every message's ClientApp was forked from the launcher's fork server (hello, pretraining ... per node)
    assert federation.log_of("clientapp-forkserver").count("forked ") >= 2 * NUM_NODES * (2 + 1 + 1)
    for i in range(NUM_NODES):  # each node was prepared before the first run (client_app.prepare) ...
        assert f"prepared client {i}" in federation.log_of(f"prepare-supernode-{i}")
        views = sorted((work / "federation" / f"supernode-{i}" / "views").glob("view-*.npz"))
        assert len(views) == 1, views  # ... and both runs' messages read that view: no other was built


def test_two_requests_from_a_given_model(deployment):
    """FedUP answers ``class:3`` then ``class:5`` from an operator's model file, named by a path relative
    to the SuperLink's folder (where the ServerApp runs): the nodes run in other folders, as on other
    hosts, and never read it. Nothing is pretrained, and the receipt verifies."""
    import hashlib

    from safetensors.torch import save_file

    from strategies.run_config import parse_config

    federation, work = deployment["federation"], deployment["work"]
    cfg = parse_config({})
    state = cfg.task.server_model(cfg, []).state_dict()
    save_file({k: v.contiguous() for k, v in state.items()}, str(work / "operator-model.safetensors"))
    extra = "requests='class:3;class:5' original-model='operator-model.safetensors' retrain-oracle=false"
    result = federation.run(_run_config(work, "fedup", extra), timeout=900)
    assert result.status == "finished:completed" and result.folder, result.log[-3000:]
    results = _results(result.folder)
    given = results["run"]["original_model"]
    assert given["path"] == str(work / "operator-model.safetensors")
    assert given["sha256"] == hashlib.sha256((work / "operator-model.safetensors").read_bytes()).hexdigest()
    assert results["cost"]["pretrain"]["rounds"] == 0
    assert [entry["request"]["target"] for entry in results["requests"]] == [3, 5]
    assert (Path(result.folder) / "receipt.json").is_file()
    verified = subprocess.run([sys.executable, "-m", "server_app.receipt", "verify", result.folder], check=False, cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
    assert verified.returncode == 0, verified.stdout + verified.stderr


def test_supernode_killed_while_unlearning(deployment):
    federation, work = deployment["federation"], deployment["work"]
    cached = {p: p.read_bytes() for p in (work / "cache").rglob("*") if p.is_file()}  # the models and the clients' kept ones
    earlier = {f: (Path(f) / "results.json").read_bytes() for f in deployment.get("folders", [])}
    assert cached and earlier, "runs after the retrain/fedup test: its cache and results are checked"
    killed_at = []

    def kill_on_unlearn(line: str) -> None:
        if "unlearn: method" in line and not killed_at:
            killed_at.append(time.monotonic())
            federation.kill("supernode-2")

    result = federation.run(_run_config(work, "fedup", "round-timeout=30.0"), on_line=kill_on_unlearn,
                            timeout=900)
    assert killed_at, result.log[-3000:]
    if result.folder:  # the run went on with the other nodes
        assert result.status == "finished:completed", result.log[-3000:]
        results = _results(result.folder)
        assert results["run"]["num_clients"] == NUM_NODES
        assert results["cost"]["unlearn"]["rounds"] == 1
    else:  # or it stopped, saying which phase lost which node
        assert "run stopped" in result.log and "phase" in result.log, result.log[-3000:]
    assert "phase unlearn" in result.log and "client 2" in result.log, result.log[-3000:]
    assert {p: p.read_bytes() for p in cached} == cached  # the cached original (and retrain) untouched
    assert {f: (Path(f) / "results.json").read_bytes() for f in earlier} == earlier


def _online_ids(federation: LocalFederation) -> set:
    return {node["node-id"] for node in federation.online_nodes()}


def test_supernode_killed_while_pretraining(deployment):
    """A node lost in round 3 of 6 of pretraining: the other two finish the run; the loss is named
    once, with its node and client id, round and what noticed it, and the original is listed as a
    model that saw fewer clients."""
    federation, work = deployment["federation"], deployment["work"]
    federation.kill("supernode-2")  # the test before killed it already (then this does nothing)
    before = _online_ids(federation)
    federation.start_node(2)  # back with a fresh key, as a new node id
    deadline = time.monotonic() + 120
    while not (len(now := _online_ids(federation)) == NUM_NODES and now - before):
        assert time.monotonic() < deadline, f"online: {now}, before the restart: {before}"
        time.sleep(1.0)
    killed_at = []

    def kill_after_round_2(line: str) -> None:
        if "[original] round 2/6" in line and not killed_at:
            killed_at.append(time.monotonic())
            federation.kill("supernode-2")

    config = _run_config(work, "fedup", "retrain-oracle=false round-timeout=20.0").replace("pretrain-rounds=2",
                                                                                        "pretrain-rounds=6")
    result = federation.run(config, on_line=kill_after_round_2, timeout=900)
    assert killed_at, result.log[-3000:]
    assert result.status == "finished:completed" and result.folder, result.log[-3000:]
    results = _results(result.folder)
    assert results["cost"]["pretrain"]["rounds"] == 6
    lost = results["cost"]["pretrain"]["failures"]
    assert len(lost) == 1, lost
    assert lost[0]["client_id"] == 2 and isinstance(lost[0]["node_id"], int) and lost[0]["phase"] == "pretrain"
    assert lost[0]["round"] >= 3 and lost[0]["noticed_by"] in ("heartbeat", "round-timeout"), lost[0]
    for phase, cost in results["cost"].items():  # a lost node is named once per phase
        nodes = [failure["node_id"] for failure in cost.get("failures", [])]
        assert len(nodes) == len(set(nodes)), (phase, cost["failures"])
    assert [(m["client_id"], m["node_id"]) for m in results["saw_fewer_clients"]["original"]] == \
        [(2, lost[0]["node_id"])]


def test_no_process_left_behind(deployment):
    federation = deployment["federation"]
    groups = federation.pids()
    assert len(groups) >= 2 + NUM_NODES  # SuperLink, SuperNodes, intruder, flwr run
    socket_dir = federation.socket_dir
    assert socket_dir is not None and socket_dir.is_dir()  # the fork server's socket folder, while it runs
    federation.stop()
    assert {pgid: group_members(pgid) for pgid in groups} == {pgid: [] for pgid in groups}
    assert not socket_dir.exists()  # nothing left behind on disk either
