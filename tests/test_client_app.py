"""ClientApp handlers called directly with a Message and a Context."""

from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from client_app.app import app
from server_app.inprocess import InProcessGrid  # noqa: F401  (sets Flower's task identity)
from strategies.run_config import parse_config
from tasks.plugins import specs_to_json
from tasks.registry import task_for
from tasks.vision.task import VisionTask

ROOT = Path(__file__).resolve().parents[1]

RUN = {"scenario": "client", "forget-client": 1, "mia-max-samples": 20}


def _context(pid=1, n=4, run=RUN):
    return Context(run_id=1, node_id=7, state=RecordDict(), run_config=run,
                   node_config={"partition-id": pid, "num-partitions": n})


def _message(kind, arrays=None, **config):
    InProcessGrid(4, RUN)
    content = {"config": ConfigRecord(config)}
    if arrays is not None:
        content["arrays"] = arrays
    return Message(RecordDict(content), dst_node_id=7, message_type=kind)


def test_a_node_parses_the_full_run_config_with_the_keys_the_server_says_the_user_set():
    """Under ``flwr run`` a node gets every key; hello tells it which the user set, it keeps them in its
    state, and a key set at its default (local-epochs=3) wins over digits' preset (1) there too."""
    from flwr.common.config import get_fused_config_from_dir

    from client_app.state import GIVEN_KEYS, client_view
    from strategies.run_config import all_settings

    full = get_fused_config_from_dir(ROOT, {**RUN, "local-epochs": 3})
    assert set(full) == {s.key for s in all_settings()}
    told = _context(run=full)
    app(_message("query.hello", **{GIVEN_KEYS: " ".join([*RUN, "local-epochs"])}), told)
    later = Context(run_id=1, node_id=7, state=told.state, run_config=full, node_config=told.node_config)
    assert client_view(later)[0]["local-epochs"] == 3
    nothing_set = _context(run=full)
    app(_message("query.hello", **{GIVEN_KEYS: ""}), nothing_set)
    assert client_view(nothing_set)[0]["local-epochs"] == 1  # the preset, as the server parses it


def test_hello_reports_client_id_and_counts():
    reply = app(_message("query.hello"), _context(pid=1))
    hello = reply.content["hello"]
    assert hello["client-id"] == 1 and hello["n-forget"] > 0 and hello["n-retain"] == 0
    other = app(_message("query.hello"), _context(pid=2)).content["hello"]
    assert other["n-forget"] == 0 and other["n-retain"] > 0 and other["n-all"] == other["n-retain"]
    # label counts per class (digits: 10): what each node keeps and what the request removes
    assert len(other["class-n-retain"]) == 10 and sum(other["class-n-retain"]) == other["n-retain"]
    assert sum(other["class-n-removed"]) == 0 and sum(hello["class-n-retain"]) == 0
    # the leaving backdoor client's samples by their true labels, not its triggered copies (all backdoor-target 0)
    removed = hello["class-n-removed"]
    assert sum(removed) > hello["n-forget"] > 0 and removed[0] < hello["n-forget"]


def test_train_changes_weights_and_reports_examples():
    model = task_for("digits-lenet5").build_model([], seed=0)
    arrays = ArrayRecord(model.state_dict())
    reply = app(_message("train", arrays, role="retain", epochs=1, lr=0.05), _context(pid=2))
    trained = reply.content["arrays"].to_torch_state_dict()
    assert reply.content["metrics"]["num-examples"] > 0
    assert any(not torch.equal(trained[k], v) for k, v in model.state_dict().items())


def test_train_for_two_roles_returns_one_update_per_role_from_the_same_model():
    run = {"scenario": "sample", "forget-client": 1, "mia-max-samples": 20}
    model = task_for("digits-lenet5").build_model([], seed=0)
    arrays = ArrayRecord(model.state_dict())
    message = _message("train", arrays, role="forget+retain", epochs=1, lr=0.05, **{"report-loss-before": "forget"})
    reply = app(message, _context(pid=1, run=run)).content
    assert set(reply.keys()) == {"arrays.forget", "metrics.forget", "arrays.retain", "metrics.retain"}
    forget, retain = reply["arrays.forget"].to_torch_state_dict(), reply["arrays.retain"].to_torch_state_dict()
    assert any(not torch.equal(forget[k], retain[k]) for k in forget)
    assert reply["metrics.forget"]["num-examples"] > 0 and reply["metrics.retain"]["num-examples"] > 0
    assert "loss-before" in reply["metrics.forget"] and "loss-before" not in reply["metrics.retain"]
    # each role trained from the received model: the retain half equals a retain-only request
    alone = app(_message("train", arrays, role="retain", epochs=1, lr=0.05), _context(pid=1, run=run))
    assert all(torch.equal(v, retain[k]) for k, v in alone.content["arrays"].to_torch_state_dict().items())
    # both roles asked: the retain half reports the received model's loss on the retained data,
    # the same with zero epochs (a report without training: the upload is the received model)
    both = app(_message("train", arrays, role="forget+retain", epochs=1, lr=0.05,
                        **{"report-loss-before": "forget,retain"}), _context(pid=1, run=run)).content
    still = app(_message("train", arrays, role="retain", epochs=0, lr=0.05, **{"report-loss-before": "retain"}),
                _context(pid=1, run=run)).content
    assert both["metrics.retain"]["loss-before"] == pytest.approx(still["metrics"]["loss-before"])
    assert still["metrics"]["loss-before"] > 0
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in still["arrays"].to_torch_state_dict().items())


def test_a_forget_all_data_message_trains_the_leaving_clients_clean_copies_too():
    """``forget-all-data`` (Lethe's client-level forget stream): the backdoor client's forget role
    trains its triggered samples and the clean copies it also trained; its forget-set role fewer."""
    run = {**RUN, "poison": "backdoor"}
    arrays = ArrayRecord(task_for("digits-lenet5").build_model([], seed=0).state_dict())

    def examples(**config):
        reply = app(_message("train", arrays, role="forget", epochs=1, lr=0.05, **config), _context(pid=1, run=run))
        return reply.content["metrics"]["num-examples"]

    hello = app(_message("query.hello"), _context(pid=1, run=run)).content["hello"]
    assert examples() == hello["n-forget"] < examples(**{"forget-all-data": True})


def test_train_plugins_scope_uploads_only_the_adapter():
    plugins = [{"kind": "lethe-adapter", "seed": 0}]
    model = task_for("digits-lenet5").build_model(plugins, seed=0)
    reply = app(_message("train", ArrayRecord(model.state_dict()), role="forget", objective="adapter-ascent",
                         scope="plugins", plugins=specs_to_json(plugins), lr=0.01, **{"max-steps": 3}),
                _context(pid=1))
    keys = set(reply.content["arrays"].keys())
    assert keys and all(k.startswith("plugins.") for k in keys)


def test_evaluate_returns_counts_and_confidences():
    model = task_for("digits-lenet5").build_model([], seed=0)
    reply = app(_message("evaluate", ArrayRecord(model.state_dict())), _context(pid=1))
    metrics = reply.content["metrics"]
    assert metrics["forget-n"] > 0 and 0 <= metrics["forget-correct"] <= metrics["forget-n"]
    assert 0 < len(metrics["conf-forget"]) <= 20


def test_one_evaluate_message_for_several_models_gives_each_models_own_metrics():
    first = ArrayRecord(task_for("digits-lenet5").build_model([], seed=0).state_dict())
    second = ArrayRecord(task_for("digits-lenet5").build_model([], seed=1).state_dict())
    content = RecordDict({"config": ConfigRecord({"models": "a,b"}),
                          "arrays.a": first, "config.a": ConfigRecord({"features": True}),
                          "arrays.b": second, "config.b": ConfigRecord({"features": False})})
    InProcessGrid(4, RUN)
    both = app(Message(content, dst_node_id=7, message_type="evaluate"), _context(pid=1)).content
    assert set(both.keys()) == {"metrics.a", "features.a", "metrics.b"}
    alone_a = app(_message("evaluate", first, features=True), _context(pid=1)).content
    alone_b = app(_message("evaluate", second), _context(pid=1)).content
    assert dict(both["metrics.a"]) == dict(alone_a["metrics"])
    assert dict(both["metrics.b"]) == dict(alone_b["metrics"]) != dict(alone_a["metrics"])
    sample, alone = both["features.a"].to_torch_state_dict(), alone_a["features"].to_torch_state_dict()
    assert sample.keys() == alone.keys() and all(torch.equal(sample[k], alone[k]) for k in sample)


def test_a_train_message_can_also_measure_the_model_it_received():
    """``evaluate-received``: the reply also holds the received model's metrics, equal to an evaluate
    message's, and the training it carries is the same as without the flag."""
    received = ArrayRecord(task_for("digits-lenet5").build_model([], seed=3).state_dict())
    config = {"role": "all", "epochs": 1, "lr": 0.05, "server-round": 2}
    plain = app(_message("train", received, **config), _context(pid=2)).content
    both = app(_message("train", received, **config, **{"evaluate-received": True}), _context(pid=2)).content
    alone = app(_message("evaluate", received), _context(pid=2)).content
    assert "metrics.received" not in plain
    assert dict(both["metrics.received"]) == dict(alone["metrics"])
    trained, again = plain["arrays"].to_torch_state_dict(), both["arrays"].to_torch_state_dict()
    assert trained.keys() == again.keys() and all(torch.equal(trained[k], again[k]) for k in trained)
    assert dict(both["metrics"]) == dict(plain["metrics"])


def test_missing_partition_in_node_config_is_a_clear_error():
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=RUN, node_config={})
    with pytest.raises(ValueError, match="partition-id"):
        app(_message("query.hello"), context)


def test_bad_run_config_fails_before_any_work():
    with pytest.raises(ValueError, match="'lr'"):
        app(_message("query.hello"), _context(run={"lr": -1.0}))


def test_client_parses_the_config_like_the_server_presets_included():
    from client_app.state import client_view

    run = {**RUN, "smoke": True, "local-epochs": 2}
    cfg, _ = client_view(_context(run=run))
    server = parse_config(run, num_clients=4)
    assert cfg.as_dict() == server.as_dict() and cfg.presets == server.presets
    assert cfg["pretrain-rounds"] == 2 and cfg["local-epochs"] == 2  # smoke preset; an explicit key wins


# --- the per-node view cache and a node's own data (data-path) --------------------------------------

def _cached_context(cache, pid=1, n=4, run=RUN, **node):
    return Context(run_id=1, node_id=7, state=RecordDict(), run_config=run,
                   node_config={"partition-id": pid, "num-partitions": n, "view-cache-dir": str(cache), **node})


def _fresh_process(monkeypatch):
    """Forget the in-memory views (a new ClientApp process) and fail if the pool is loaded again."""
    from client_app import state

    state._view.cache_clear()

    def no_pool(*_args):
        raise AssertionError("the pool was loaded: the view did not come from the node cache")

    monkeypatch.setattr(VisionTask, "load_images", no_pool)


def test_view_cache_gives_the_built_view_in_a_new_process_without_loading_the_pool(tmp_path, monkeypatch):
    from client_app.state import client_view

    _, built = client_view(_cached_context(tmp_path))
    assert len(list(tmp_path.glob("view-*.npz"))) == 1
    _fresh_process(monkeypatch)
    _, cached = client_view(_cached_context(tmp_path))
    assert cached.client_id == built.client_id
    for name in ("retain_x", "retain_y", "forget_x", "forget_y", "test_x", "test_y", "triggered_test_x"):
        assert torch.equal(getattr(cached, name), getattr(built, name)), name


def test_view_cache_key_follows_the_request_and_a_damaged_file_is_rebuilt(tmp_path, monkeypatch):
    from client_app import state

    state.client_view(_cached_context(tmp_path))
    state.client_view(_cached_context(tmp_path, run={**RUN, "forget-client": 2}))
    files = sorted(tmp_path.glob("view-*.npz"))
    assert len(files) == 2  # another forget client is another view
    files[0].write_bytes(b"not an npz")
    state._view.cache_clear()
    for ctx in (_cached_context(tmp_path), _cached_context(tmp_path, run={**RUN, "forget-client": 2})):
        _, data = state.client_view(ctx)
        assert data.client_id == 1
    _fresh_process(monkeypatch)  # both files are whole again: nothing loads the pool
    state.client_view(_cached_context(tmp_path))
    state.client_view(_cached_context(tmp_path, run={**RUN, "forget-client": 2}))


def _write_node_files(folder, n_train=40, n_test=10, channels=None):
    import numpy as np

    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", n_train), ("test", n_test)):
        shape = (n, 32, 32) if channels is None else (n, channels, 32, 32)
        np.savez(folder / f"{split}.npz", x=rng.integers(0, 256, shape, dtype=np.uint8),
                 y=np.arange(n, dtype=np.int64) % 10)


def test_data_path_node_reads_its_own_files_and_applies_the_request(tmp_path):
    _write_node_files(tmp_path / "node")
    run = {"scenario": "class", "forget-class": 3, "mia-max-samples": 20}
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run,
                      node_config={"data-path": str(tmp_path / "node"), "partition-id": 5,
                                   "view-cache-dir": str(tmp_path / "views")})
    hello = app(_message("query.hello"), context).content["hello"]
    assert hello["client-id"] == 5 and hello["n-forget"] == 4 and hello["n-retain"] == 36
    assert hello["n-test"] == 9 and hello["n-forget-test"] == 1
    model = task_for("digits-lenet5").build_model([], seed=0)
    reply = app(_message("train", ArrayRecord(model.state_dict()), role="retain", epochs=1, lr=0.05), context)
    assert reply.content["metrics"]["num-examples"] == 36


def test_a_node_with_its_own_files_reports_their_content_id_in_hello(tmp_path):
    """The server keys its model cache by it: other files, other id; the same files, the same id."""
    def hello_of(folder, seed_files):
        import numpy as np

        _write_node_files(folder)
        if seed_files:
            with np.load(folder / "train.npz") as data:
                x, y = data["x"].copy(), data["y"]
            x[0, 0, 0] ^= 1
            np.savez(folder / "train.npz", x=x, y=y)
        context = Context(run_id=1, node_id=7, state=RecordDict(), run_config={"scenario": "class"},
                          node_config={"data-path": str(folder), "partition-id": 1,
                                       "view-cache-dir": str(tmp_path / f"views-{folder.name}")})
        return app(_message("query.hello"), context).content["hello"]

    first, same, other = hello_of(tmp_path / "a", False), hello_of(tmp_path / "b", False), hello_of(tmp_path / "c", True)
    assert first["data-id"] == same["data-id"] > 0
    assert other["data-id"] != first["data-id"]
    shared = app(_message("query.hello"), Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                                                  node_config={"partition-id": 0, "num-partitions": 3,
                                                               "view-cache-dir": str(tmp_path / "v")}))
    assert "data-id" not in shared.content["hello"]


@pytest.mark.parametrize("damage, match", [
    ("missing", r"'data-path'=.*neither train\.npz .* nor an image folder train/<label>/"),
    ("not-npz", r"'data-path'=.*train\.npz is not a readable \.npz file"),
    ("rgb", r"'data-path'=.*'x' has shape \(40, 3, 32, 32\)"),
    ("labels", r"'data-path'=.*'y' must be integers in 0\.\.9"),
])
def test_malformed_data_path_is_a_one_line_error_naming_it(tmp_path, damage, match):
    import numpy as np

    folder = tmp_path / "node"
    if damage == "rgb":
        _write_node_files(folder, channels=3)
    elif damage != "missing":
        _write_node_files(folder)
    if damage == "not-npz":
        (folder / "train.npz").write_bytes(b"garbage")
    if damage == "labels":
        np.savez(folder / "train.npz", x=np.zeros((40, 32, 32), np.uint8), y=np.full(40, 10))
    _assert_hello_fails_in_one_line(folder, tmp_path, match)


def _assert_hello_fails_in_one_line(folder, tmp_path, match):
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config={"scenario": "class"},
                      node_config={"data-path": str(folder), "partition-id": 0,
                                   "view-cache-dir": str(tmp_path / "views")})
    with pytest.raises(ValueError, match=match) as error:
        app(_message("query.hello"), context)
    assert "\n" not in str(error.value)


def _write_image_folder(folder, n_train=40, n_test=10, size=28, mode="L"):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(1)
    for split, n in (("train", n_train), ("test", n_test)):
        for i in range(n):
            label_dir = folder / split / str(i % 10)
            label_dir.mkdir(parents=True, exist_ok=True)
            shape = (size, size) if mode == "L" else (size, size, 3)
            Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode=mode).save(label_dir / f"{i:03d}.png")


def test_image_folder_node_reads_labels_from_folder_names_resized_to_the_task_size(tmp_path):
    from tasks.node_data import load_image_folder, split_files

    _write_image_folder(tmp_path / "node", mode="RGB")  # 28x28 RGB for a grey 32x32 task
    x, y = load_image_folder(str(tmp_path / "node"), "train", num_classes=10, channels=1)
    assert x.shape == (40, 1, 32, 32) and x.dtype == torch.float32 and 0 <= x.min() and x.max() <= 1
    assert sorted(y.tolist()) == sorted(i % 10 for i in range(40))
    assert len(split_files(str(tmp_path / "node"))) == 50  # every image identifies the node's view
    run = {"scenario": "class", "forget-class": 3, "mia-max-samples": 20}
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run,
                      node_config={"data-path": str(tmp_path / "node"), "partition-id": 5,
                                   "view-cache-dir": str(tmp_path / "views")})
    hello = app(_message("query.hello"), context).content["hello"]
    assert hello["n-forget"] == 4 and hello["n-retain"] == 36 and hello["n-forget-test"] == 1


@pytest.mark.parametrize("damage, match", [
    ("name", r"'data-path'=.*train/cat: class folders must be named by their label, an integer in 0\.\.9"),
    ("range", r"'data-path'=.*train/10: class folders"),
    ("image", r"'data-path'=.*train/0/bad\.png is not a readable image"),
    ("empty", r"'data-path'=.*the image folder test/ holds no PNG"),
])
def test_malformed_image_folder_is_a_one_line_error_naming_it(tmp_path, damage, match):
    folder = tmp_path / "node"
    _write_image_folder(folder)
    if damage in ("name", "range"):
        (folder / "train" / ("cat" if damage == "name" else "10")).mkdir()
    if damage == "image":
        (folder / "train" / "0" / "bad.png").write_bytes(b"not a png")
    if damage == "empty":
        for image in (folder / "test").rglob("*.png"):
            image.unlink()
    _assert_hello_fails_in_one_line(folder, tmp_path, match)


def test_data_path_needs_a_named_forget_client_for_client_requests(tmp_path):
    _write_node_files(tmp_path / "node")
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config={"scenario": "client"},
                      node_config={"data-path": str(tmp_path / "node"), "partition-id": 0,
                                   "view-cache-dir": str(tmp_path / "views")})
    with pytest.raises(ValueError, match="'forget-client'=-1"):
        app(_message("query.hello"), context)


def test_vision_client_app_imports_no_llm_or_plotting_stack():
    import subprocess
    import sys

    code = ("import sys, client_app.app; heavy = [m for m in ('transformers', 'peft', 'matplotlib', 'sklearn', "
            "'datasets', 'dp_accounting', 'tasks.llm.task', 'tasks.llm.model', 'strategies.fedup.client', "
            "'strategies.fedup.strategy', 'strategies.lethe.strategy') if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_view_cache_key_covers_every_setting_the_view_code_reads():
    import re

    from tasks.stream import view_key_part
    from tasks.vision.views import ROOT, VIEW_CODE, VIEW_KEYS

    read = {key for name in VIEW_CODE for key in re.findall(r'cfg\["([a-z0-9-]+)"\]', (ROOT / name).read_text())}
    not_data = {"download", "poison-epochs"}  # fetches files (their fingerprint is keyed) / epochs, not data
    keyed = {*VIEW_KEYS, *view_key_part(parse_config({"requests": "class:1;class:2"}))}  # a stream's part too
    assert read and read - not_data <= keyed, read - not_data - keyed
