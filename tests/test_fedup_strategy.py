"""FedUP strategy through the in-process federation: noise reaches uploads, bad uploads, stacking."""

import math

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord

import strategies.fedup.client as fedup_client
from server_app.inprocess import InProcessGrid
from strategies.common.base import ModelState, UnlearnContext
from strategies.common.federation import Federation
from strategies.fedup.strategy import FedUP, NoUsableCentroids
from tasks.config import parse_config
from tasks.registry import task_for
from tasks.requests import build_client_data

RUN = {"scenario": "class", "forget-class": 2, "fedup-epochs": 5, "mia-max-samples": 20}


def context(run=RUN, clients=3, original=None):
    grid = InProcessGrid(clients, run)
    fed = Federation(grid, round_timeout=60, min_reply_fraction=0.5)
    fed.start_phase("unlearn")
    fed.hello(ConfigRecord({}))
    cfg = parse_config(run, num_clients=clients)
    original = original or ModelState(ArrayRecord(task_for(cfg["task"]).build_model([], seed=0).state_dict()))
    return UnlearnContext(fed, cfg, original, model_factory=lambda p: task_for(cfg["task"]).build_model(p, seed=0),
                          retrain=lambda: None)


def test_noise_reaches_the_uploaded_centroids():
    images = task_for("digits-lenet5").load_images()
    model = task_for("digits-lenet5").build_model([], seed=0)

    def release(extra):
        cfg = parse_config({**RUN, **extra}, num_clients=3)
        record = fedup_client.centroid_release(cfg, build_client_data(cfg, images, 0, 3), model)
        return record["centroids"]["centroids"], record["metrics"]

    clean, clean_metrics = release({})
    noisy, noisy_metrics = release({"fedup-sigma": 0.5})
    calibrated, calibrated_metrics = release({"fedup-epsilon": 5.0})
    assert math.isinf(clean_metrics["epsilon"]) and noisy_metrics["sigma"] == 0.5
    assert (noisy - clean).std().item() == pytest.approx(0.5, rel=0.15)
    assert calibrated_metrics["epsilon"] == pytest.approx(5.0, rel=1e-3) and calibrated_metrics["sigma"] > 0
    assert not torch.equal(calibrated, clean)


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
