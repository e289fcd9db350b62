"""PGA (Halimi et al.): the reference model, the ball projection, and the leaving client's ascent."""

from __future__ import annotations

import pytest
import torch

from strategies.pga.client import pga_query
from strategies.pga.maths import project_to_ball, reference_model, squared_distance
from strategies.run_config import parse_config
from tasks.registry import task_for
from tasks.requests import build_client_data


def test_reference_model_is_the_mean_of_the_other_clients():
    others = [{"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([3.0, -2.0])}]
    own = {"w": torch.tensor([10.0, 10.0])}
    counts = [1, 3, 4]  # the two others, then the leaving client
    models = [*others, own]
    total = sum(counts)
    global_model = {"w": sum(c / total * m["w"] for c, m in zip(counts, models))}
    reference = reference_model(global_model, own, counts[-1] / total)
    expected = (counts[0] * others[0]["w"] + counts[1] * others[1]["w"]) / (counts[0] + counts[1])
    assert torch.allclose(reference["w"], expected, atol=1e-6)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        reference_model(global_model, own, 1.0)


def test_projection_lands_on_the_sphere_and_leaves_inside_points_alone():
    center = {"a": torch.zeros(3), "b": torch.zeros(2)}
    far = {"a": torch.tensor([3.0, 0.0, 0.0]), "b": torch.tensor([0.0, 4.0])}
    projected = project_to_ball(far, center, radius_sq=1.0)
    assert squared_distance(projected, center) == pytest.approx(1.0)
    assert torch.allclose(projected["b"] / projected["a"][0], far["b"] / far["a"][0])  # same direction
    near = {"a": torch.tensor([0.1, 0.0, 0.0]), "b": torch.zeros(2)}
    assert project_to_ball(near, center, radius_sq=1.0) is near


def test_leaving_client_ascends_inside_the_ball_around_the_reference():
    task = task_for("digits-lenet5")
    cfg = parse_config({"method": "pga", "scenario": "client", "forget-client": 0, "local-epochs": 1,
                        "pga.epochs": 2, "pga.random-models": 2}, num_clients=3)
    data = build_client_data(cfg, task.load_images(), 0, 3)
    model = task.build_model([], seed=0)
    reply = pga_query(task, cfg, data, model, {"weight": 0.3}, seed=5)
    metrics = reply["metrics"]
    assert metrics["steps"] >= 1 and metrics["num-examples"] == len(data.forget_y)
    assert metrics["distance-to-own"] > metrics["distance-reference-own"]  # the ascent moved away from w_i
    assert 0 < metrics["distance-to-reference"] <= metrics["radius-sq"] * (1 + 1e-6)  # and stayed in the ball
    assert metrics["stopped-at-distance"] == 1 or metrics["steps"] == 2 * -(-len(data.forget_y) // 128)
    unlearned = {k: v for k, v in reply["arrays"].items() if k in dict(model.named_parameters())}
    assert all(torch.isfinite(v).all() for v in unlearned.values())


def test_kept_local_models_round_trip_per_client_and_original(tmp_path):
    from client_app.kept_models import keep, kept

    cfg = parse_config({"method": "pga", "cache-dir": str(tmp_path / "cache")})
    state = {"w": torch.arange(4.0)}
    keep({}, cfg, 2, "0123456789abcdef", state)
    assert torch.equal(kept({}, cfg, 2, "0123456789abcdef")["w"], state["w"])
    assert kept({}, cfg, 3, "0123456789abcdef") is None  # another client kept nothing
    assert kept({}, cfg, 2, "fedcba9876543210") is None  # nor for another original
    node = {"state-dir": str(tmp_path / "node")}  # a SuperNode's own folder wins
    keep(node, cfg, 2, "0123456789abcdef", {"w": torch.ones(1)})
    assert torch.equal(kept(node, cfg, 2, "0123456789abcdef")["w"], torch.ones(1))
    with pytest.raises(ValueError, match="16 hex digits"):
        kept({}, cfg, 2, "../../etc/passwd")


def test_pga_ascends_from_the_model_each_holder_kept_in_the_last_pretraining_round(tmp_path):
    import json
    import os

    from server_app.inprocess import run_inprocess

    folder = run_inprocess({"method": "pga", "scenario": "class", "smoke": True, "cache-dir": str(tmp_path / "c"),
                            "outputs-dir": str(tmp_path / "o")}, 3)
    with open(os.path.join(folder, "results.json")) as handle:
        details = json.load(handle)["method"]
    holders = details["ascending_clients"]
    assert len(holders) >= 2  # class scenario: every client holding the class ascends
    assert all(details["ascent"][str(c)]["own-model-kept"] == 1 for c in holders)
    kept_files = sorted(os.listdir(tmp_path / "c" / "kept"))
    assert len(kept_files) == 3 and all(f.startswith("last-local-") for f in kept_files)
