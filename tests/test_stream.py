"""A stream of deletion requests (run-config ``requests``): parsing and its one-line errors, each
request's client view, FedUP's stacked filters removed one by one, and two requests end to end."""

import json
import os

import pytest
import torch
from flwr.app import ArrayRecord

from core.config import ConfigError
from server_app.inprocess import run_inprocess
from strategies.common.base import ModelState, without_plugins
from strategies.fedup.filter import FILTER_KIND
from strategies.run_config import parse_config
from tasks.registry import task_for
from tasks.requests import build_client_data
from tasks.stream import Request, parse_requests, request_config


def test_requests_parse_in_order_and_default_to_the_scenario():
    cfg = parse_config({"requests": " class:3; client:4 ;sample:2; class", "forget-class": 7, "poison": "label-flip"},
                       num_clients=5)
    assert parse_requests(cfg) == [Request("class", 3), Request("client", 4), Request("sample", 2), Request("class", 7)]
    assert parse_requests(parse_config({"scenario": "class", "forget-class": 6})) == [Request("class", 6)]
    assert parse_requests(parse_config({"scenario": "client", "forget-client": 1})) == [Request("client", 1)]


@pytest.mark.parametrize("run, clients, words", [
    ({"requests": "klass:3"}, None, "unknown scenario 'klass'"),
    ({"requests": "class:10"}, None, "class 10 is outside task"),
    ({"requests": "class:x"}, None, "must be an integer"),
    ({"requests": "class:3;;class:5"}, None, "an empty request"),
    ({"requests": "client:3"}, 3, "client 3 (client:3) is outside the federation"),
    ({"requests": "class:3;class:3"}, None, "class 3 is named twice"),
    ({"requests": "sample:1;client:2"}, None, "both plant the backdoor trigger"),
    ({"requests": "class:3", "method": "fedosd"}, None, "not supported by method 'fedosd'"),
    ({"requests": "class:3", "task": "llm-tofu", "method": "lethe"}, None, "not supported on task 'llm-tofu'"),
])
def test_bad_requests_are_one_line_naming_the_key(run, clients, words):
    with pytest.raises(ConfigError) as err:
        parse_config(run, num_clients=clients)
    text = str(err.value)
    assert words in text and "\n" not in text and "'requests'" in text


def test_label_flip_clients_may_share_a_stream():
    cfg = parse_config({"requests": "sample:1;client:2", "poison": "label-flip"}, num_clients=5)
    assert [r.scenario for r in parse_requests(cfg)] == ["sample", "client"]


def _view(run: dict, index: int, client: int, clients: int = 5):
    cfg = parse_config(run, num_clients=clients)
    return build_client_data(request_config(cfg, index), task_for("digits-lenet5").load_images(), client, clients)


def test_a_one_request_stream_sees_what_the_single_request_sees():
    cfg = parse_config({"scenario": "class", "forget-class": 3}, num_clients=5)
    single = build_client_data(cfg, task_for("digits-lenet5").load_images(), 1, 5)
    streamed = _view({"requests": "class:3"}, 1, 1)
    for name in ("retain_y", "forget_y", "test_y", "forget_test_y", "removed_y"):
        assert torch.equal(getattr(single, name), getattr(streamed, name)), name


def test_each_request_sees_what_earlier_ones_left():
    run = {"requests": "class:3;sample:1;class:5"}
    before, first, second, third = (_view(run, k, 1) for k in range(4))
    assert not (first.retain_y == 3).any() and (first.forget_y == 3).all() and len(first.forget_y)
    assert not (first.test_y == 3).any() and (first.forget_test_y == 3).all()
    # the triggered samples are in the federation from the start, and the sample request finds them
    assert len(before.forget_y) >= len(second.forget_y) > 0
    assert (second.forget_y == 0).all() and not (second.removed_y == 3).any() and len(second.triggered_test_y)
    assert len(second.retain_y) == len(first.retain_y) - len(second.forget_y)
    assert not torch.isin(third.retain_y, torch.tensor([3, 5])).any() and (third.forget_y == 5).all()
    assert not torch.isin(third.test_y, torch.tensor([3, 5])).any() and (third.forget_test_y == 5).all()
    # view 0 trains on everything: the clean data plus the triggered samples
    assert len(before.retain_y) + len(before.forget_y) == len(first.retain_y) + len(first.forget_y)


def _filter_spec(seed: int) -> dict:
    return {"kind": FILTER_KIND, "bottleneck": 8, "shape": "official", "seed": seed}


def test_removing_a_filter_gives_exactly_the_model_without_it():
    task = task_for("digits-lenet5")
    stacked = task.build_model([_filter_spec(1), _filter_spec(2), _filter_spec(3)], seed=0)
    with torch.no_grad():
        for p in stacked.plugins.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    model = ModelState(ArrayRecord(stacked.state_dict()), [_filter_spec(1), _filter_spec(2), _filter_spec(3)])
    without_first = without_plugins(model, [0])
    assert without_first.plugins == [_filter_spec(2), _filter_spec(3)]
    alone = task.build_model(without_first.plugins, seed=0)
    alone.load_state_dict(without_first.arrays.to_torch_state_dict())
    expected = task.build_model([], seed=0)
    expected.load_state_dict({k: v for k, v in stacked.state_dict().items() if not k.startswith("plugins.")})
    x = torch.rand(6, 1, 32, 32)
    stacked.eval(), alone.eval(), expected.eval()
    with torch.no_grad():
        z = expected.embed(x)
        for plugin in (stacked.plugins[1], stacked.plugins[2]):
            z = plugin(z)
        assert torch.equal(alone(x), expected.head(z))
    state, before = without_first.arrays.to_torch_state_dict(), stacked.state_dict()
    assert torch.equal(state["plugins.0.encoder.weight"], before["plugins.1.encoder.weight"])
    assert torch.equal(state["plugins.1.decoder.weight"], before["plugins.2.decoder.weight"])
    assert not any(k.startswith("plugins.2.") for k in state)


def _stream(tmp_path, method: str, **extra) -> dict:
    run = {"method": method, "smoke": True, "requests": "class:3;class:5", "seed": 3,
           "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out"), **extra}
    folder = run_inprocess(run, 3)
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle) | {"folder": folder}


@pytest.mark.slow
def test_fedup_answers_two_requests_with_one_filter_each(tmp_path):
    results = _stream(tmp_path, "fedup")
    first, second = results["requests"]
    assert [(e["request"]["scenario"], e["request"]["target"]) for e in (first, second)] == [("class", 3), ("class", 5)]
    assert all(sum(c["removed"] for c in e["request"]["clients"]) > 0 for e in (first, second))
    with open(os.path.join(results["folder"], "receipt.json")) as handle:  # one entry per request, chained
        receipt = json.load(handle)
    assert [e["request"]["target"] for e in receipt["requests"]] == [3, 5]
    assert receipt["requests"][0]["models"]["before"]["path"] == results["model_files"]["original"]["path"]
    assert receipt["requests"][1]["models"]["before"] == \
        {k: first["model_files"].get("continued", first["model_files"]["unlearned"])[k] for k in ("path", "sha256")}
    for entry in (first, second):
        assert entry["models"]["unlearned"]["restore_equals_start"] is True
        assert set(entry["models"]["restored"]["forget_acc_by_request"]) == {"1", "2"}
        assert {"unlearned", "continued", "fedup-filter"} <= set(entry["model_files"])
        assert entry["cost"]["unlearn"]["rounds"] == 1
    # the first request's resurfacing is measured after its own phases and after the second's
    assert [(a["request"], a["phase"]) for a in first["resurfacing"]["after"]] == [
        (1, "unlearn"), (1, "continue"), (2, "unlearn"), (2, "continue")]
    assert first["model_files"]["fedup-filter"]["path"] == os.path.join("models", "request-1-fedup-filter.safetensors")
    assert results["models"]["unlearned"] == second["models"]["unlearned"]
    from server_app.model_files import read_model

    unlearned = read_model(os.path.join(results["folder"], second["model_files"]["unlearned"]["path"]))
    assert len(unlearned.plugins) == 2


@pytest.mark.slow
def test_a_method_without_plug_ins_runs_each_request_on_the_current_model(tmp_path):
    results = _stream(tmp_path, "not")
    first, second = results["requests"]
    assert "restored" not in first["models"] and second["request"]["target"] == 5
    assert second["models"]["start"]["forget_acc"] != first["models"]["start"]["forget_acc"]
    assert len(first["resurfacing"]["after"]) == 4 and results["cost"]["pretrain"]["rounds"] >= 1


def test_a_stream_without_the_oracle_trains_none_and_says_what_it_cannot_give(tmp_path):
    results = _stream(tmp_path, "fedup", **{"retrain-oracle": False})
    assert results["cost"]["retrain"]["rounds"] == 0
    for entry in results["requests"]:
        assert entry["resurfacing"]["kr_retrain"] is None
        assert "resurfacing.kr_retrain" in [m["figure"] for m in entry["validity"]["missing"]]


def _trained_digits_model() -> ModelState:
    """A LeNet-5 that knows every digit: a few epochs of central training on the digits pool (seconds)."""
    from tasks.training import train_local

    images = task_for("digits-lenet5").load_images()
    model = task_for("digits-lenet5").build_model([], seed=0)
    train_local(model, images.x, images.y, epochs=8, batch_size=32, lr=0.05, momentum=0.9, seed=0)
    return ModelState(ArrayRecord(model.state_dict()))


def _class_accuracy(state: ModelState, label: int) -> float:
    from tasks.training import predict_proba

    images = task_for("digits-lenet5").load_images()
    model = task_for("digits-lenet5").build_model(state.plugins, seed=0)
    model.load_state_dict(state.arrays.to_torch_state_dict())
    rows = images.y == label
    return float((predict_proba(model, images.x[rows]).argmax(1) == label).float().mean())


def test_removing_the_first_fedup_filter_alone_brings_its_class_back():
    """Two class requests answered by stacked FedUP filters (the fedup-robust recipe, which removes a
    class): the later filter leaves the first request's forget features as it finds them, so
    unplugging the first filter alone gives its class back while the second class stays removed."""
    from flwr.app import ConfigRecord

    from server_app.inprocess import InProcessGrid
    from strategies.common.base import UnlearnContext
    from strategies.common.federation import Federation
    from strategies.fedup.strategy import FedUP

    run = {"requests": "class:3;class:5", "recipe": "fedup-robust", "mia-max-samples": 20}
    cfg = parse_config(run, num_clients=3)
    fed = Federation(InProcessGrid(3, run), round_timeout=60, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    method, model = FedUP(), _trained_digits_model()
    assert _class_accuracy(model, 3) > 0.9 and _class_accuracy(model, 5) > 0.9
    for index in (1, 2):
        fed.request_index = index
        fed.hello(ConfigRecord({}))
        ctx = UnlearnContext(fed, request_config(cfg, index), model, retrain=lambda: None,
                             model_factory=lambda plugins: task_for("digits-lenet5").build_model(plugins, seed=0))
        model = method.unlearn(ctx).model
    unlearned = {label: _class_accuracy(model, label) for label in (3, 5)}
    without_first = method.unplug(model, [0])
    assert unlearned[3] < 0.1 and unlearned[5] < 0.1
    assert _class_accuracy(without_first, 3) > unlearned[3] + 0.7
    assert _class_accuracy(without_first, 5) < 0.1
