"""FedAU: its linear rule, its auxiliary labels, the head a holder keeps across pretraining rounds,
its one-line errors, and small in-process runs of every scenario it supports."""

from __future__ import annotations

import json
import os

import pytest
import torch

from core.config import ConfigError
from strategies.fedau.maths import (
    aux_labels,
    mean_head,
    mixed_start,
    random_other_labels,
    unlearned_head,
)
from strategies.run_config import parse_config


def _head(w, b):
    return {"weight": torch.tensor(w, dtype=torch.float32), "bias": torch.tensor(b, dtype=torch.float32)}


def test_class_rule_subtracts_the_mean_auxiliary_head_bias_included():
    w1 = _head([[1.0, 2.0], [3.0, 4.0]], [0.5, -0.5])
    w2 = mean_head([_head([[1.0, 0.0], [0.0, 1.0]], [1.0, 0.0]), _head([[3.0, 0.0], [0.0, 3.0]], [3.0, 2.0])])
    assert torch.equal(w2["weight"], torch.tensor([[2.0, 0.0], [0.0, 2.0]])) and torch.equal(w2["bias"], torch.tensor([2.0, 1.0]))
    new = unlearned_head("class", w1, w2, alpha=0.9)  # alpha plays no part in class unlearning
    assert torch.equal(new["weight"], torch.tensor([[-1.0, 2.0], [3.0, 2.0]]))
    assert torch.equal(new["bias"], torch.tensor([-1.5, -1.5]))


@pytest.mark.parametrize("scenario", ["sample", "client"])
def test_sample_and_client_rule_is_the_papers_mix_keeping_w1(scenario):
    w1, w2 = _head([[10.0, 0.0]], [10.0]), _head([[0.0, 10.0]], [-10.0])
    new = unlearned_head(scenario, w1, w2, alpha=0.9)
    assert torch.allclose(new["weight"], torch.tensor([[1.0, 9.0]]))  # 0.1 W1 + 0.9 W2: W1 not dropped
    assert torch.allclose(new["bias"], torch.tensor([-8.0]))
    assert torch.allclose(mixed_start(w1, w2, 0.5)["weight"], torch.tensor([[5.0, 5.0]]))
    with pytest.raises(ValueError, match="unknown to FedAU"):
        unlearned_head("llm", w1, w2, 0.9)


def test_auxiliary_labels_class_is_the_forget_class_sample_is_another_label_on_forget_samples_only():
    retain, forget, extra = torch.tensor([0, 1, 2]), torch.tensor([5] * 200), torch.tensor([7, 8])
    assert torch.equal(aux_labels("class", retain, forget[:2], extra, 10, 4, seed=1), torch.full((7,), 4))
    labels = aux_labels("sample", retain, forget, extra, 10, 4, seed=1)
    assert torch.equal(labels[:3], retain) and torch.equal(labels[-2:], extra)
    drawn = labels[3:-2]
    assert (drawn != 5).all() and set(drawn.tolist()) == set(range(10)) - {5}  # uniform among the others
    assert torch.equal(drawn, random_other_labels(forget, 10, seed=1))  # fixed: the same every round
    assert not torch.equal(drawn, random_other_labels(forget, 10, seed=2))


def _holder(tmp_path, scenario="sample"):
    from tasks.registry import task_for
    from tasks.requests import build_client_data

    task = task_for("digits-lenet5")
    cfg = parse_config({"method": "fedau", "scenario": scenario, "forget-client": 0, "local-epochs": 1,
                        "cache-dir": str(tmp_path)}, num_clients=3)
    images = task.load_images()
    return task, cfg, build_client_data(cfg, images, 0, 3), build_client_data(cfg, images, 1, 3)


def test_a_holder_keeps_its_auxiliary_head_on_disk_across_rounds_and_others_train_as_fedavg(tmp_path):
    from strategies.fedau.client import (
        aux_training,
        head_path,
        head_query,
        load_kept,
        store_kept,
    )
    from tasks.training import train_local

    task, cfg, holder, other = _holder(tmp_path)
    conf = {"epochs": 1, "lr": cfg["lr"], "state-folder": str(tmp_path / "node"), "fedau-original": "0123456789abcdef",
            "max-steps": 4, "server-round": 1}
    x, y = holder.split("all")
    model = task.build_model([], seed=0)
    aux_training(model, x, y, cfg=cfg, conf=conf, seed=3, device=torch.device("cpu"), data=holder)
    path = head_path(conf["state-folder"], conf["fedau-original"], 0)
    first = load_kept(path)
    assert first["rounds"] == 1 and first["weight"].shape == (10, model.feature_dim)
    aux_training(task.build_model([], seed=0), x, y, cfg=cfg, conf={**conf, "server-round": 2}, seed=4,
                 device=torch.device("cpu"), data=holder)
    second = load_kept(path)  # a second round (a fresh process) starts from the kept head and trains it on
    assert second["rounds"] == 2 and second["seconds"] > first["seconds"] and second["last-round"] == 2
    assert not torch.equal(first["weight"], second["weight"])
    aux_training(task.build_model([], seed=0), x, y, cfg=cfg, conf=conf, seed=3, device=torch.device("cpu"),
                 data=holder)  # round 1 again: a new pretraining of the same original starts a fresh head
    again = load_kept(path)
    assert again["rounds"] == 1 and torch.equal(again["weight"], first["weight"])
    store_kept(path, second)
    reply = head_query(task, cfg, holder, None, conf, seed=0)
    assert reply["metrics"]["kept"] == 1 and torch.equal(reply["head"]["bias"], second["bias"])
    assert reply["metrics"]["stored-bytes"] == os.path.getsize(path)

    ox, oy = other.split("all")  # a client without forget data: the plain local training, bit for bit
    a, b = task.build_model([], seed=0), task.build_model([], seed=0)
    aux_training(a, ox, oy, cfg=cfg, conf=conf, seed=5, device=torch.device("cpu"), data=other)
    train_local(b, ox, oy, epochs=1, batch_size=cfg["batch-size"], lr=cfg["lr"], momentum=cfg["momentum"], seed=5,
                max_steps=4)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())
    assert not os.path.exists(head_path(conf["state-folder"], conf["fedau-original"], 1))
    assert head_query(task, cfg, other, None, conf, seed=0)["metrics"]["kept"] == 0


def test_one_line_errors():
    with pytest.raises(ConfigError, match="fedau.alpha") as err:
        parse_config({"method": "fedau", "fedau.alpha": 1.5})
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="fedau") as err:
        parse_config({"method": "fedau", "task": "llm-tofu"})
    assert "\n" not in str(err.value)


def _run(tmp_path, scenario, clients=4, rounds=3, **extra):
    from server_app.inprocess import run_inprocess

    run = {"method": "fedau", "scenario": scenario, "pretrain-rounds": rounds, "continue-rounds": 1, "local-epochs": 2,
           "mia-max-samples": 50, "cache-dir": str(tmp_path / "c"), "outputs-dir": str(tmp_path / "o"), **extra}
    with open(os.path.join(run_inprocess(run, clients), "results.json")) as handle:
        return json.load(handle)


def _check(results, scenario):
    models = results["models"]
    assert models["unlearned"]["forget_acc"] < models["original"]["forget_acc"]
    assert results["run"]["own_original"]["fedau-aux-head"] == 1
    aux = results["method"]["pretraining_aux"]
    assert aux["train_seconds"] > 0 and aux["storage_bytes"] > 0 and aux["bytes"] == 0
    assert all(r == results["run"]["config"]["pretrain-rounds"] for r in aux["rounds"].values())
    assert results["cost"]["built"]["original"]["seconds"] > 0  # what FedAU's own original cost to build
    assert results["cost"]["unlearn"]["rounds"] == 1


def test_class_unlearning_end_to_end_and_a_wiped_head_is_a_one_line_stop(tmp_path):
    from strategies.common.federation import RunStopped

    results = _run(tmp_path, "class", rounds=2)
    _check(results, "class")
    assert results["models"]["unlearned"]["forget_acc"] < 0.2
    for name in os.listdir(tmp_path / "c" / "kept"):
        if name.startswith("fedau-aux-"):
            os.remove(tmp_path / "c" / "kept" / name)
    with pytest.raises(RunStopped, match="kept no auxiliary head") as err:
        _run(tmp_path, "class", rounds=2)  # the original comes from the cache; the clients' heads are gone
    assert "\n" not in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["sample", "client"])
def test_sample_and_client_unlearning_end_to_end(tmp_path, scenario):
    extra = {"poison": "backdoor"} if scenario == "client" else {}
    results = _run(tmp_path, scenario, **extra)
    _check(results, scenario)
    assert ("fedau.client-gamma" in results["run"]["own_original"]) == (scenario == "client")


def test_own_original_key_depends_on_the_aux_labels_and_gamma():
    from strategies.fedau.strategy import FedAU

    own = {s: FedAU().own_original(parse_config({"method": "fedau", "scenario": s})) for s in ("class", "sample", "client")}
    assert own["class"] != own["sample"] and "fedau.client-gamma" in own["client"]
    assert FedAU().pretraining_config(parse_config({"method": "fedau"}), "0123456789abcdef") == {
        "objective": "fedau-aux", "fedau-original": "0123456789abcdef"}


def test_comparison_tables_set_fedaus_own_original_and_its_kept_heads_beside_the_shared_one():
    from benchmarks.compare_methods import pretraining_table

    base = {"task": "digits-lenet5", "scenario": "class", "seed": 42, "status": "ok", "flags": [], "reasons": []}
    rows = [{**base, "method": "none", "own_original": None, "pretrain_seconds": 50.0, "pretrain_bytes": 99_000_000},
            {**base, "method": "federaser", "own_original": None, "pretrain_seconds": 55.0,
             "pretrain_bytes": 99_000_000, "history_bytes": 55_033_173},
            {**base, "method": "fedau", "own_original": {"fedau-aux-head": 1}, "pretrain_seconds": 51.0,
             "pretrain_bytes": 99_010_000, "aux_seconds": 20.0, "aux_storage_bytes": 45_864}]
    table = pretraining_table(rows)
    assert "| shared (none, federaser) | class | 50.0 | 99.00 | — | — | — |" in table
    assert "| federaser (shared, with its history) | class | 55.0 | 99.00 | — | — | 55.0 |" in table
    assert "| fedau * | class | 51.0 | 99.01 | 20.0 | 45.9 | — |" in table
