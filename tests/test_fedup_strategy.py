"""FedUP strategy through the in-process federation: the paper's defaults (DP at epsilon 10 with delta 1/n_i,
forget features dropped or relabelled), noise reaches uploads, bad uploads, stacking."""

import dataclasses
import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import strategies.fedup.client as fedup_client
import strategies.fedup.settings as fedup_settings
from server_app.inprocess import InProcessGrid
from strategies.common.base import ModelState, UnlearnContext
from strategies.common.federation import Federation
from strategies.fedup.strategy import FedUP, NoUsableCentroids
from strategies.run_config import parse_config
from tasks.registry import task_for
from tasks.requests import build_client_data

RUN = {"scenario": "class", "forget-class": 2, "fedup.epochs": 5, "mia-max-samples": 20}


def context(run=RUN, clients=3, original=None):
    grid = InProcessGrid(clients, run)
    fed = Federation(grid, round_timeout=60, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    fed.hello(ConfigRecord({}))
    cfg = parse_config(run, num_clients=clients)
    original = original or ModelState(ArrayRecord(task_for(cfg["task"]).build_model([], seed=0).state_dict()))
    return UnlearnContext(fed, cfg, original, model_factory=lambda p: task_for(cfg["task"]).build_model(p, seed=0),
                          retrain=lambda: None)


def release(extra, client=0, clients=3):
    images = task_for("digits-lenet5").load_images()
    model = task_for("digits-lenet5").build_model([], seed=0)
    cfg = parse_config({**RUN, **extra}, num_clients=clients)
    data = build_client_data(cfg, images, client, clients)
    record = fedup_client.centroid_release(cfg, data, model)
    return record["centroids"], record["metrics"], data


def test_noise_reaches_the_uploaded_centroids():
    clean, clean_metrics, _ = release({"fedup.epsilon": math.inf})
    noisy, noisy_metrics, _ = release({"fedup.sigma": 0.5})
    calibrated, calibrated_metrics, _ = release({"fedup.epsilon": 5.0})
    assert math.isinf(clean_metrics["epsilon"]) and noisy_metrics["sigma"] == 0.5
    assert (noisy["centroids"] - clean["centroids"]).std().item() == pytest.approx(0.5, rel=0.15)
    assert calibrated_metrics["epsilon"] == pytest.approx(5.0, rel=1e-3) and calibrated_metrics["sigma"] > 0
    assert not torch.equal(calibrated["centroids"], clean["centroids"])


def test_defaults_are_the_papers():
    cfg = parse_config({})
    assert cfg["fedup.epsilon"] == 10.0 and cfg["fedup.delta"] == 0.0 and cfg["fedup.dp-bound"] == "eq21"
    assert cfg["fedup.alpha"] == 0.5 and cfg["fedup.forget-centroids"] == "paper"
    assert (cfg["fedup.optimizer"], cfg["fedup.epochs"], cfg["fedup.batch-size"]) == ("sgd", 50, 10)
    assert cfg["fedup.filter"] == "official" and math.isinf(cfg["fedup.clip"])
    assert fedup_settings.filter_lr(cfg) == cfg["lr"] and fedup_settings.filter_lr(parse_config({"fedup.lr": 0.1})) == 0.1


def test_default_release_is_noised_at_epsilon_10_with_delta_one_over_its_own_count():
    _, metrics, data = release({})
    n = len(data.retain_y) + len(data.forget_y)  # class scenario: the forgotten class is relabelled, not dropped
    assert metrics["num-examples"] == n
    assert metrics["delta"] == pytest.approx(1 / n)
    assert metrics["epsilon"] == pytest.approx(10.0, rel=1e-3) and metrics["sigma"] > 0
    assert metrics["sensitivity"] == pytest.approx(metrics["diameter"] / n)  # eq. 21


def test_a_default_run_is_private_per_client_with_delta_one_over_n_i(monkeypatch):
    calls = []
    real = fedup_client.centroid_release

    def spy(cfg, data, model):
        record = real(cfg, data, model)
        calls.append((data.client_id, len(data.retain_y) + len(data.forget_y), record["centroids"]["centroids"]))
        return record

    monkeypatch.setattr("strategies.fedup.client.centroid_release", spy)
    result = FedUP().unlearn(context())
    clients = result.details["privacy"]["clients"]
    assert result.details["max_epsilon"] == pytest.approx(10.0, rel=1e-3)
    assert sorted(clients) == sorted(c for c, _, _ in calls) == [0, 1, 2]
    for client, n, _ in calls:
        assert clients[client]["delta"] == pytest.approx(1 / n) and clients[client]["num-examples"] == n
    assert len({round(c["delta"], 12) for c in clients.values()}) == 3  # each its own n_i
    assert result.details["forget_features"] == "relabel" and result.details["num_forget_centroids"] == 0


def test_class_scenario_relabels_the_forgotten_class_on_the_client():
    uploaded, metrics, data = release({"fedup.epsilon": math.inf})
    assert len(data.forget_y) > 0 and bool((data.forget_y == RUN["forget-class"]).all())
    assert metrics["relabelled"] == len(data.forget_y) and metrics["dropped"] == 0
    assert not bool((uploaded["labels"] == RUN["forget-class"]).any())  # no centroid keeps the forgotten label
    assert int(uploaded["counts"].sum()) == len(data.retain_y) + len(data.forget_y)  # all features, relabelled
    assert not bool(uploaded["forget"].any())


@pytest.mark.parametrize("client", [0, 1, 2])
def test_sample_scenario_uploads_nothing_of_the_forget_samples(client):
    run = {"scenario": "sample", "forget-client": 1, "fedup.epsilon": math.inf}
    uploaded, metrics, data = release(run, client=client)
    assert metrics["num-examples"] == len(data.retain_y) == int(uploaded["counts"].sum())
    assert metrics["dropped"] == len(data.forget_y) and (len(data.forget_y) > 0) == (client == 1)
    # the release is exactly the one of the client without its forget samples
    cfg = parse_config({**RUN, **run}, num_clients=3)
    without = dataclasses.replace(data, forget_x=data.forget_x[:0], forget_y=data.forget_y[:0])
    alone = fedup_client.centroid_release(cfg, without, task_for("digits-lenet5").build_model([], seed=0))
    assert torch.equal(alone["centroids"]["centroids"], uploaded["centroids"])
    _, divert_metrics, _ = release({**run, "fedup.forget-centroids": "divert"}, client=client)
    assert divert_metrics["num-examples"] == len(data.retain_y) + len(data.forget_y)  # the non-default alternative


@pytest.mark.parametrize("mode, asked", [("paper", [0, 2]), ("divert", [0, 1, 2])])
def test_the_leaving_client_is_not_asked_in_the_client_scenario(monkeypatch, mode, asked):
    run = {**RUN, "scenario": "client", "forget-client": 1, "fedup.forget-centroids": mode}
    seen = []
    real = fedup_client.centroid_release

    def spy(cfg, data, model):
        seen.append(data.client_id)
        return real(cfg, data, model)

    monkeypatch.setattr("strategies.fedup.client.centroid_release", spy)
    result = FedUP().unlearn(context(run=run))
    assert sorted(seen) == asked and sorted(result.details["privacy"]["clients"]) == asked


def test_malformed_upload_is_dropped_and_the_filter_still_trains(monkeypatch, caplog):
    real = fedup_client.centroid_release

    def nan_for_client_1(cfg, data, model):
        record = real(cfg, data, model)
        if data.client_id == 1:
            record["centroids"]["centroids"][0, 0] = float("nan")
        return record

    monkeypatch.setattr("strategies.fedup.client.centroid_release", nan_for_client_1)
    result = FedUP().unlearn(context())
    assert "NaN" in result.details["privacy"]["dropped"][1]
    assert set(result.details["privacy"]["clients"]) == {0, 2}
    assert "dropping the upload of client 1" in caplog.text


def test_no_usable_upload_stops_with_a_message(monkeypatch):
    def wrong_width(cfg, data, model):
        record = real(cfg, data, model)
        record["centroids"]["centroids"] = record["centroids"]["centroids"][:, :5]
        return record

    real = fedup_client.centroid_release
    monkeypatch.setattr("strategies.fedup.client.centroid_release", wrong_width)
    with pytest.raises(NoUsableCentroids, match="no retained client sent usable centroids"):
        FedUP().unlearn(context())


def test_second_request_stacks_and_restore_pops_exactly_one_filter():
    first = FedUP().unlearn(context()).model
    second_run = {**RUN, "forget-class": 5}
    second = FedUP().unlearn(context(run=second_run, original=first)).model
    assert len(second.plugins) == 2
    restored = FedUP().restore(second, None)
    assert restored.plugins == first.plugins
    a, b = restored.arrays.to_torch_state_dict(), first.arrays.to_torch_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    base = {k: v for k, v in a.items() if not k.startswith("plugins.")}
    original = context().original.arrays.to_torch_state_dict()
    assert all(torch.equal(base[k], original[k]) for k in base)


def test_a_one_sample_client_releases_nothing_under_noise_and_its_point_without():
    """delta = 1/n and eq. 21's diameter / n are undefined for one sample: the client sends an empty upload,
    which the server drops like any unusable one; without noise it sends its point."""
    _, _, data = release({})
    one = dataclasses.replace(data, retain_x=data.retain_x[:1], retain_y=data.retain_y[:1],
                              forget_x=data.forget_x[:0], forget_y=data.forget_y[:0])
    model = task_for("digits-lenet5").build_model([], seed=0)
    noised = fedup_client.centroid_release(parse_config(RUN, num_clients=3), one, model)
    assert noised["centroids"]["centroids"].shape == (0, model.feature_dim) and noised["metrics"]["skipped"] == 1
    plain = fedup_client.centroid_release(parse_config({**RUN, "fedup.epsilon": math.inf}, num_clients=3), one, model)
    assert plain["centroids"]["centroids"].shape == (1, model.feature_dim) and plain["metrics"]["sigma"] == 0.0
