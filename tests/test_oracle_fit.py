"""The retrain oracle trains on until it fits its training data as the original does
(``Experiment.fit_oracle``): its stopping rule on scripted fits, then a real run."""

import time

import pytest
import torch
from flwr.app import ArrayRecord

import server_app.experiment as experiment
from server_app.experiment import ORACLE_FIT_TOLERANCE, Experiment
from strategies.common.base import ModelState
from strategies.common.federation import PhaseCost
from tasks.config import parse_config
from test_experiment import run

ORIGINAL_FIT = 0.95


def model(step: int) -> ArrayRecord:
    """A stand-in model that carries the number of FedAvg rounds trained on after the oracle's own."""
    return ArrayRecord({"step": torch.tensor([float(step)])})


def scripted(monkeypatch, fits: list[float], limit: int = 20):
    """An experiment whose original fits ``ORIGINAL_FIT`` of two nodes' 100 samples each and whose
    oracle, after k more rounds, fits ``fits[k]``; it records the rounds it is asked to train."""
    exp = Experiment.__new__(Experiment)
    exp.cfg, exp.started, exp.fed = parse_config({"retrain-fit-rounds": limit}), time.perf_counter(), None
    exp._original = ModelState(ArrayRecord({"original": torch.zeros(1)}))
    asked = []

    def counts(fed, arrays, round_no):
        share = ORIGINAL_FIT if "original" in arrays else fits[int(arrays["step"].numpy()[0])]
        return {1: (round(100 * share), 100), 2: (round(100 * share), 100)}

    def fedavg(arrays, role, rounds, label, *, first_round, round_lr):
        asked.append((role, rounds, first_round, round_lr(first_round)))
        return model(int(arrays["step"].numpy()[0]) + 1)

    monkeypatch.setattr(experiment, "retained_counts", counts)
    exp.fedavg = fedavg
    return exp, asked


def steps(arrays: ArrayRecord) -> int:
    return int(arrays["step"].numpy()[0])


def test_an_oracle_that_fits_as_the_original_does_is_left_alone(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.94])  # 0.01 below the original's 0.95
    cost = PhaseCost()
    assert steps(exp.fit_oracle(model(0), 60, cost, lr=0.05)) == 0
    assert asked == [] and "fit" not in cost.as_dict()


def test_an_oracle_below_the_original_trains_on_until_it_fits_and_says_so(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.80, 0.90, 0.88, 0.95, 0.99])
    cost = PhaseCost()
    kept = exp.fit_oracle(model(0), 60, cost, lr=0.02)
    assert steps(kept) == 3  # the first within 0.01 of the original's 0.95; a fourth round is never played
    assert asked == [("retain", 1, 61, 0.02), ("retain", 1, 62, 0.02), ("retain", 1, 63, 0.02)]
    assert cost.as_dict()["fit"] == {"original": 0.95, "start": 0.80, "kept": 0.95, "kept_round": 3, "rounds": 3,
                                     "within": True}


def test_an_oracle_that_never_fits_keeps_its_best_model_within_the_cap(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.80, 0.85, 0.70, 0.84], limit=20)
    cost = PhaseCost()
    kept = exp.fit_oracle(model(0), 3, cost, lr=0.05)  # the cap: no more rounds than the oracle's own 3
    assert steps(kept) == 1 and len(asked) == 3
    assert cost.fit == {"original": 0.95, "start": 0.80, "kept": 0.85, "kept_round": 1, "rounds": 3, "within": False}


def test_the_retrain_oracle_of_a_real_run_fits_its_training_data_as_the_original(tmp_path):
    """4 clients, class scenario: the original trains 6 rounds, the oracle 2. On its own the oracle fits less
    of its training data than the original; trained on (at most 2 more rounds) it reports the shares its
    evaluation measures, and a run with the rule off builds and caches another oracle."""
    settings = {"method": "retrain", "scenario": "class", "pretrain-rounds": 6, "retrain-rounds": 2}
    fitted, _, _ = run(tmp_path, **settings, **{"retrain-fit-rounds": 20})
    plain, _, _ = run(tmp_path, **settings)
    fit = fitted["cost"]["built"]["retrain"]["fit"]
    assert plain["models"]["original"] == fitted["models"]["original"]
    assert plain["models"]["unlearned"]["retain_acc"] == pytest.approx(fit["start"])
    assert fit["original"] == pytest.approx(fitted["models"]["original"]["retain_acc"])
    assert fit["start"] < fit["original"] - ORACLE_FIT_TOLERANCE and 1 <= fit["rounds"] <= 2
    assert fitted["models"]["unlearned"]["retain_acc"] == pytest.approx(fit["kept"]) and fit["kept"] > fit["start"]
    assert fitted["cost"]["unlearn"]["fit"] == fit
    assert fitted["cost"]["built"]["retrain"]["rounds"] >= 2 + fit["rounds"]
    assert plain["cost"]["built"]["retrain"]["rounds"] == 2 and "fit" not in plain["cost"]["built"]["retrain"]
