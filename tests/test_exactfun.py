"""Exact-Fun (Xiong et al.): the quantised mean, the first changed round, and exactness on a small run."""

from __future__ import annotations

import json
import os

import pytest
import torch

from core.config import ConfigError
from server_app.inprocess import run_inprocess
from strategies.exactfun.maths import first_changed_round, quantise, quantised_mean
from strategies.run_config import parse_config


def test_quantise_rounds_floats_to_the_grid_and_leaves_integers():
    out = quantise({"w": torch.tensor([0.0014, -0.0026, 0.0101]), "n": torch.tensor(3)}, 0.001)
    assert torch.allclose(out["w"], torch.tensor([0.001, -0.003, 0.010]), atol=1e-9) and out["n"].item() == 3
    with pytest.raises(ValueError, match="> 0"):
        quantise({"w": torch.zeros(1)}, 0.0)


def test_first_changed_round_skips_rounds_the_leaving_client_does_not_move():
    step = 0.1
    def model(v):
        return {"w": torch.tensor([v])}
    # round 1: the leaving client (2) sits at the others' mean, so dropping it changes nothing
    r1 = {"global": model(0.0), "clients": {0: model(0.2), 1: model(0.4), 2: model(0.3)}, "counts": {0: 1, 1: 1, 2: 1}}
    after1 = quantised_mean([model(0.2), model(0.4), model(0.3)], [1, 1, 1], step)
    # round 2: it pulls the mean up by a whole grid step
    r2 = {"global": after1, "clients": {0: model(0.3), 1: model(0.3), 2: model(0.9)}, "counts": {0: 1, 1: 1, 2: 1}}
    final = quantised_mean([model(0.3), model(0.3), model(0.9)], [1, 1, 1], step)
    changed = first_changed_round({1: r1, 2: r2}, final, {2}, step)
    assert changed is not None and changed[0] == 2
    assert torch.allclose(changed[1]["w"], torch.tensor([0.3]))
    assert first_changed_round({1: r1}, after1, {2}, step) is None  # nothing to recompute: already exact


def test_unlearned_model_equals_quantised_retraining_without_the_client_bit_for_bit(tmp_path):
    run = {"method": "exact-fun", "scenario": "client", "smoke": True, "cache-dir": str(tmp_path / "c"),
           "outputs-dir": str(tmp_path / "o")}  # smoke: exactfun.verify on
    with open(os.path.join(run_inprocess(run, 3), "results.json")) as handle:
        results = json.load(handle)
    details = results["method"]
    assert details["equals_quantised_retrain"] is True
    assert details["recomputed_rounds"] + details["rounds_reused"] + (details["first_changed_round"] is not None) == 2
    assert results["run"]["own_original"] == {"exact-fun-quantised-step": 0.001}  # not the shared original
    assert results["cost"]["verify"]["rounds"] == 2 and results["cost"]["verify"]["seconds"] > 0
    with pytest.raises(ConfigError, match="'fraction-train'=0.5 is not allowed for method 'exact-fun'"):
        parse_config({"method": "exact-fun", "scenario": "client", "fraction-train": 0.5})
