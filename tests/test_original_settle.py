"""The original trains on where its last rounds lost the fit it had (``Experiment.settle_original``): its
stopping rule on scripted fits, then real runs, one of them a method that replays pretraining's rounds."""

import glob
import json
import os
import time

import pytest
import torch
from flwr.app import ArrayRecord

import server_app.experiment as experiment
from server_app.experiment import SETTLE_TOLERANCE, Experiment
from server_app.inprocess import run_inprocess
from strategies.common.fedavg_rounds import recorded_lr
from strategies.common.federation import PhaseCost
from tasks.config import parse_config
from test_experiment import run

REFERENCE_FIT = 0.99
TRAINING = {"last_round_config": {"keep-model-as": "abc"}, "on_replies": None, "aggregate": None,
            "extra_config": None}


def model(step: int) -> ArrayRecord:
    """A stand-in original that carries the number of FedAvg rounds trained on after its own."""
    return ArrayRecord({"step": torch.tensor([float(step)])})


def steps(arrays: ArrayRecord) -> int:
    return int(arrays["step"].numpy()[0])


def scripted(monkeypatch, fits: list[float], limit: int = 10):
    """An experiment whose reference model (step -1) fits ``REFERENCE_FIT`` of two nodes' 100 samples each
    and whose original, after k more rounds, fits ``fits[k]``; it records the rounds it is asked to train."""
    exp = Experiment.__new__(Experiment)
    exp.cfg, exp.started, exp.fed = parse_config({"original-settle-rounds": limit}), time.perf_counter(), None
    asked = []

    def counts(fed, arrays, round_no):
        step = steps(arrays)
        share = REFERENCE_FIT if step < 0 else fits[step]
        return {1: (round(100 * share), 100), 2: (round(100 * share), 100)}

    def fedavg(arrays, role, rounds, label, *, first_round, round_lr, **training):
        asked.append((role, rounds, first_round, round_lr(first_round), training))
        return model(steps(arrays) + 1)

    monkeypatch.setattr(experiment, "retained_counts", counts)
    exp.fedavg = fedavg
    return exp, asked


def test_an_original_that_kept_its_fit_is_left_alone(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.98])  # 0.01 below its reference's 0.99
    cost = PhaseCost()
    assert steps(exp.settle_original(model(0), 60, 50, model(-1), cost, 0.025, TRAINING)) == 0
    assert asked == [] and "fit" not in cost.as_dict()


def test_an_original_that_lost_its_fit_trains_on_at_the_lower_lr_until_within(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.90, 0.95, 0.97, 0.99, 1.0])
    cost = PhaseCost()
    kept = exp.settle_original(model(0), 60, 50, model(-1), cost, 0.025, TRAINING)
    assert steps(kept) == 3  # the first within 0.01 of round 50's 0.99; a fourth round is never played
    assert [a[:4] for a in asked] == [("all", 1, 61, 0.025), ("all", 1, 62, 0.025), ("all", 1, 63, 0.025)]
    assert all(a[4] == TRAINING for a in asked)  # pretraining's own settings: the clients keep each last round
    assert cost.as_dict()["fit"] == {"reference_round": 50, "reference": 0.99, "start": 0.90, "kept": 0.99,
                                     "rounds": 3, "lr": 0.025, "within": True}


def test_an_original_that_never_settles_keeps_its_last_round_within_the_cap(monkeypatch):
    exp, asked = scripted(monkeypatch, [0.90, 0.95, 0.93, 0.97], limit=3)
    cost = PhaseCost()
    kept = exp.settle_original(model(0), 60, 50, model(-1), cost, 0.025, TRAINING)
    assert steps(kept) == 3 and len(asked) == 3  # the last played, whose kept models the clients hold
    assert cost.fit["kept"] == 0.97 and cost.fit["within"] is False


def test_the_rule_applies_where_an_earlier_model_exists_on_a_task_with_classes():
    exp = Experiment.__new__(Experiment)
    exp.cfg = parse_config({})
    assert exp.settles_original(60) and exp.settles_original(6) and not exp.settles_original(5)
    exp.cfg = parse_config({"original-settle-rounds": 0})
    assert not exp.settles_original(60)
    exp.cfg = parse_config({"task": "llm-tofu", "method": "lethe"})
    assert not exp.settles_original(60)  # no classes: no share of the data predicted right


def test_a_replay_reads_each_recorded_rounds_lr_and_the_runs_elsewhere():
    lr = recorded_lr({1: {"lr": 0.05}, 7: {"lr": 0.025}, 3: {}}, 0.1)
    assert (lr(1), lr(7), lr(3), lr(4)) == (0.05, 0.025, 0.1, 0.1)


def test_a_real_original_trains_on_and_says_so_and_the_rule_is_part_of_its_identity(tmp_path, monkeypatch):
    """4 clients, class scenario, 6 rounds (reference: round 5). The tolerance is set so that no fit can meet
    it: the original plays the cap's 2 rounds more at half the lr and reports them; a run with the rule off
    builds and caches another original."""
    monkeypatch.setattr(experiment, "SETTLE_TOLERANCE", -1.0)
    settings = {"method": "retrain", "scenario": "class", "pretrain-rounds": 6, "retrain-rounds": 2}
    settled, _, _ = run(tmp_path, **settings, **{"original-settle-rounds": 2})
    plain, _, _ = run(tmp_path, **settings)
    fit = settled["cost"]["built"]["original"]["fit"]
    assert fit["reference_round"] == 5 and fit["rounds"] == 2 and fit["lr"] == pytest.approx(0.025)
    assert fit["within"] is False and 0.0 <= fit["start"] <= 1.0 and 0.0 <= fit["kept"] <= 1.0
    assert settled["cost"]["built"]["original"]["rounds"] == 8 and plain["cost"]["built"]["original"]["rounds"] == 6
    assert "fit" not in plain["cost"]["built"]["original"]
    assert settled["models"]["original"] != plain["models"]["original"]
    assert len(glob.glob(str(tmp_path / "cache" / "original-*.pt"))) == 2
    assert SETTLE_TOLERANCE == 0.01  # the module's own value, which the run above replaced


def test_exact_fun_replays_the_original_s_extra_rounds_at_their_own_lr(tmp_path, monkeypatch):
    """Exact-Fun replays pretraining round by round: with the original's two extra rounds at half the lr in
    its history, its unlearned model still equals quantised retraining bit for bit."""
    monkeypatch.setattr(experiment, "SETTLE_TOLERANCE", -1.0)
    config = {"method": "exact-fun", "scenario": "client", "smoke": True, "pretrain-rounds": 6,
              "original-settle-rounds": 2, "cache-dir": str(tmp_path / "c"), "outputs-dir": str(tmp_path / "o")}
    with open(os.path.join(run_inprocess(config, 3), "results.json")) as handle:
        results = json.load(handle)
    assert results["cost"]["built"]["original"]["fit"]["rounds"] == 2
    details = results["method"]
    assert details["equals_quantised_retrain"] is True
    assert details["recomputed_rounds"] + details["rounds_reused"] + (details["first_changed_round"] is not None) == 8
    (path,) = glob.glob(str(tmp_path / "c" / "history-*.pt"))
    rounds = torch.load(path, weights_only=True)["rounds"]
    assert sorted(rounds) == list(range(1, 9))
    assert [rounds[t]["lr"] for t in (1, 6, 7, 8)] == pytest.approx([0.05, 0.05, 0.025, 0.025])
