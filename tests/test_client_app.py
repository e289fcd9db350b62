"""ClientApp handlers called directly with a Message and a Context."""

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from server_app.inprocess import InProcessGrid  # noqa: F401  (sets Flower's task identity)
from client_app.app import app
from tasks.config import parse_config
from tasks.plugins import specs_to_json
from tasks.registry import build_model

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


def test_hello_reports_client_id_and_counts():
    reply = app(_message("query.hello"), _context(pid=1))
    hello = reply.content["hello"]
    assert hello["client-id"] == 1 and hello["n-forget"] > 0 and hello["n-retain"] == 0
    other = app(_message("query.hello"), _context(pid=2)).content["hello"]
    assert other["n-forget"] == 0 and other["n-retain"] > 0 and other["n-all"] == other["n-retain"]


def test_train_changes_weights_and_reports_examples():
    model = build_model("digits-lenet5", [], seed=0)
    arrays = ArrayRecord(model.state_dict())
    reply = app(_message("train", arrays, role="retain", epochs=1, lr=0.05), _context(pid=2))
    trained = reply.content["arrays"].to_torch_state_dict()
    assert reply.content["metrics"]["num-examples"] > 0
    assert any(not torch.equal(trained[k], v) for k, v in model.state_dict().items())


def test_train_for_two_roles_returns_one_update_per_role_from_the_same_model():
    run = {"scenario": "sample", "forget-client": 1, "mia-max-samples": 20}
    model = build_model("digits-lenet5", [], seed=0)
    arrays = ArrayRecord(model.state_dict())
    message = _message("train", arrays, role="forget+retain", epochs=1, lr=0.05, **{"report-loss-before": True})
    reply = app(message, _context(pid=1, run=run)).content
    assert set(reply.keys()) == {"arrays.forget", "metrics.forget", "arrays.retain", "metrics.retain"}
    forget, retain = reply["arrays.forget"].to_torch_state_dict(), reply["arrays.retain"].to_torch_state_dict()
    assert any(not torch.equal(forget[k], retain[k]) for k in forget)
    assert reply["metrics.forget"]["num-examples"] > 0 and reply["metrics.retain"]["num-examples"] > 0
    assert "loss-before" in reply["metrics.forget"] and "loss-before" not in reply["metrics.retain"]
    # each role trained from the received model: the retain half equals a retain-only request
    alone = app(_message("train", arrays, role="retain", epochs=1, lr=0.05), _context(pid=1, run=run))
    assert all(torch.equal(v, retain[k]) for k, v in alone.content["arrays"].to_torch_state_dict().items())


def test_train_plugins_scope_uploads_only_the_adapter():
    plugins = [{"kind": "lethe-adapter", "seed": 0}]
    model = build_model("digits-lenet5", plugins, seed=0)
    reply = app(_message("train", ArrayRecord(model.state_dict()), role="forget", objective="adapter-ascent",
                         scope="plugins", plugins=specs_to_json(plugins), lr=0.01, **{"max-steps": 3}),
                _context(pid=1))
    keys = set(reply.content["arrays"].keys())
    assert keys and all(k.startswith("plugins.") for k in keys)


def test_evaluate_returns_counts_and_confidences():
    model = build_model("digits-lenet5", [], seed=0)
    reply = app(_message("evaluate", ArrayRecord(model.state_dict())), _context(pid=1))
    metrics = reply.content["metrics"]
    assert metrics["forget-n"] > 0 and 0 <= metrics["forget-correct"] <= metrics["forget-n"]
    assert 0 < len(metrics["conf-forget"]) <= 20


def test_missing_partition_in_node_config_is_a_clear_error():
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=RUN, node_config={})
    with pytest.raises(ValueError, match="partition-id"):
        app(_message("query.hello"), context)


def test_bad_run_config_fails_before_any_work():
    with pytest.raises(ValueError, match="'lr'"):
        app(_message("query.hello"), _context(run={"lr": -1.0}))


def test_config_is_parsed_like_the_server():
    assert parse_config(RUN, num_clients=4)["forget-client"] == 1
