"""``python -m client_app.prepare``: a node's data checked and its view stored before it joins."""

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from client_app import prepare, state
from tasks import partition
from tasks.vision.task import VisionTask

ROOT = Path(__file__).resolve().parents[1]
RUN_OVERRIDES = "scenario='class' forget-class=3"


def _flower_context(node_config: str, overrides: str) -> Context:
    """The Context a SuperNode's ClientApp gets: Flower's own fusion of the app's pyproject defaults
    with the run's overrides, and Flower's own parse of ``--node-config``."""
    run = get_fused_config_from_dir(ROOT, parse_config_args([overrides]))
    return Context(run_id=1, node_id=7, state=RecordDict(), run_config=run, node_config=parse_config_args([node_config]))


def test_a_prepared_node_answers_its_first_message_from_the_stored_view(tmp_path, monkeypatch):
    node = f"partition-id=1 num-partitions=4 view-cache-dir='{tmp_path}'"
    # a fresh process, as on a node: an earlier test in this worker may hold the same assignment in memory
    partition._dirichlet_indices.cache_clear()
    state._view.cache_clear()
    line = prepare.prepare(node, RUN_OVERRIDES)
    assert line.startswith("prepared client 1 (task 'digits-lenet5', scenario 'class')") and str(tmp_path) in line
    assert len(list(tmp_path.glob("view-*.npz"))) == 1 and len(list(tmp_path.glob("partition-*.npz"))) == 1
    _, prepared = state.client_view(_flower_context(node, RUN_OVERRIDES))

    state._view.cache_clear()  # a new ClientApp process: nothing in memory ...

    def no_pool(*_args):
        raise AssertionError("the pool was loaded: the first message did not read the prepared view")

    monkeypatch.setattr(VisionTask, "load_images", no_pool)  # ... and the pool may not be read
    cfg, data = state.client_view(_flower_context(node, RUN_OVERRIDES))
    assert cfg["scenario"] == "class" and data.client_id == 1
    assert data.counts() == prepared.counts() and data.counts()["n-forget"] > 0
    assert np.array_equal(data.retain_y.numpy(), prepared.retain_y.numpy())
    assert len(list(tmp_path.glob("view-*.npz"))) == 1  # nothing new was built


def test_prepare_checks_a_nodes_own_files(tmp_path):
    folder = tmp_path / "node"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("test", 10)):
        np.savez(folder / f"{split}.npz", x=rng.integers(0, 256, (n, 32, 32), dtype=np.uint8), y=np.arange(n) % 10)
    line = prepare.prepare(f"data-path='{folder}' partition-id=4 view-cache-dir='{tmp_path / 'views'}'", RUN_OVERRIDES)
    assert line.startswith("prepared client 4") and "40 training samples, 4 to forget" in line


@pytest.mark.parametrize("node, overrides, message", [
    ("partition-id=5 num-partitions=3", "", "node config 'partition-id'=5 must be in 0..2"),
    ("num-partitions=3", "", "node config needs 'partition-id' and 'num-partitions'"),
    ("data-path=/data/unquoted partition-id=1", "", "--node-config: The provided configuration string is in an invalid"),
    ("partition-id=0 num-partitions=3", "seeds=3", "--run-config: Key 'seeds' is not present"),
    ("partition-id=0 num-partitions=3", "scenario='bogus'", "'scenario'='bogus' is not allowed"),
])
def test_bad_input_is_one_line_naming_the_setting(node, overrides, message, tmp_path, capsys):
    argv = ["--node-config", f"{node} view-cache-dir='{tmp_path}'"] + (["--run-config", overrides] if overrides else [])
    assert prepare.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("prepare: ") and message in err and err.count("\n") == 1, err
    assert not list(tmp_path.glob("view-*.npz"))


def test_a_missing_data_path_is_named(tmp_path, capsys):
    argv = ["--node-config", f"data-path='{tmp_path / 'absent'}' partition-id=1", "--run-config", RUN_OVERRIDES]
    assert prepare.main(argv) == 2
    err = capsys.readouterr().err
    assert "node config 'data-path'=" in err and "absent" in err and err.count("\n") == 1, err
