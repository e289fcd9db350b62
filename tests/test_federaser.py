"""FedEraser (Liu et al.): the calibration rule, the pretraining history it needs, and an unlearning run."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from server_app import history
from server_app.inprocess import run_inprocess
from strategies.common.fedavg_rounds import recorded_lr
from strategies.federaser.maths import calibrate


def test_calibration_takes_the_old_step_length_in_the_new_direction_per_layer():
    old_global = {"a": torch.zeros(2), "b": torch.ones(3), "n": torch.tensor(4)}
    old_mean = {"a": torch.tensor([3.0, 4.0]), "b": torch.ones(3)}  # layer a moved by 5, layer b not at all
    new_global = {"a": torch.tensor([1.0, 1.0]), "b": torch.zeros(3), "n": torch.tensor(2)}
    new_mean = {"a": torch.tensor([1.0, 3.0]), "b": torch.tensor([0.0, 0.0, 2.0]), "n": torch.tensor(7)}
    out = calibrate(new_global, old_global, old_mean, new_mean)
    assert torch.allclose(out["a"], torch.tensor([1.0, 6.0]))  # direction (0, 1), length 5
    assert torch.allclose(out["b"], torch.zeros(3))  # old step 0: the layer stays where it is
    assert out["n"].item() == 7 and out["n"].dtype == torch.int64  # integer buffers: the calibration mean
    still = calibrate(new_global, old_global, old_mean, {**new_mean, "a": new_global["a"].clone()})
    assert torch.equal(still["a"], new_global["a"])  # no new direction: no step


def test_history_keeps_every_interval_th_round_by_client_and_round_trips(tmp_path):
    def reply(node, value, n):  # what the recorder reads of a Flower reply: its sender and its content
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node), content=RecordDict(
            {"arrays": ArrayRecord({"w": torch.full((2,), value)}), "metrics": MetricRecord({"num-examples": n})}))

    recorder = history.UpdateHistory(2, client_of_node=lambda node: node - 100)
    for server_round in range(1, 5):
        replies = [reply(101, float(server_round), 3), reply(102, -1.0, 5)]
        recorder.record(server_round, ArrayRecord({"w": torch.zeros(2)}), replies)
    assert sorted(recorder.rounds) == [1, 3]
    assert recorder.rounds[3]["counts"] == {1: 3, 2: 5} and torch.equal(recorder.rounds[3]["clients"][1]["w"],
                                                                         torch.full((2,), 3.0))
    size = history.store(str(tmp_path), "0123456789abcdef", recorder)
    loaded, on_disk = history.load(str(tmp_path), "0123456789abcdef", 2)
    assert on_disk == size > 0 and torch.equal(loaded[1]["clients"][2]["w"], torch.full((2,), -1.0))
    assert history.load(str(tmp_path), "0123456789abcdef", 1) is None  # another interval: not this history


def test_a_replay_reads_each_recorded_rounds_lr_and_the_runs_elsewhere():
    """A history round keeps the lr it trained at (``lr-schedule``); one without it reads the run's."""
    lr = recorded_lr({1: {"lr": 0.05}, 7: {"lr": 0.025}, 3: {}}, 0.1)
    assert (lr(1), lr(7), lr(3), lr(4)) == (0.05, 0.025, 0.1, 0.1)


def test_federaser_unlearns_from_the_history_its_pretraining_kept(tmp_path):
    run = {"method": "none", "scenario": "client", "smoke": True, "cache-dir": str(tmp_path / "c"),
           "outputs-dir": str(tmp_path / "o")}
    run_inprocess(run, 3)  # caches the original without any history
    (original,) = (tmp_path / "c").glob("original-*.pt")
    before = torch.load(original, weights_only=True)
    assert not list((tmp_path / "c").glob("history-*.pt"))  # a method that does not need it records none
    with open(os.path.join(run_inprocess({**run, "method": "federaser"}, 3), "results.json")) as handle:
        results = json.load(handle)
    after = torch.load(original, weights_only=True)  # pretraining again for the history: the very same original
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    details = results["method"]
    assert details["kept_rounds"] == [1, 2] and details["calibration_rounds"] == 1
    assert details["history_bytes"] == os.path.getsize(next((tmp_path / "c").glob("history-*.pt")))
    assert results["cost"]["unlearn"]["rounds"] == 1 and results["cost"]["unlearn"]["bytes_up"] > 0
