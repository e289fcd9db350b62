"""The contract every registered method keeps, on every task kind and scenario it declares.

Each registered method runs in process through the real phases with the smoke setting (a few
rounds and steps, every phase run). Its results.json must hold the results contract: the run
block with the presets applied; the model entries with their core metrics (accuracies in [0, 1],
None where a metric does not apply to the task, e.g. the LLM task's ``test_acc``); the resurfacing
curve; the validity block; the costs of every phase; the method's details; and, for a reversible
method, a restored model equal to the original. A method is tested the moment it registers, and a
recipe (``recipes/*.toml``) the moment it is added, with each method it is written for.

The cells of one task kind live in one test file (``test_contract_<kind>.py``): under pytest-xdist's
``--dist loadfile`` each file runs in one worker, and the three kinds share no models (each file's
module cache builds its own task's originals once), so splitting them by kind costs nothing and
lets three workers share what one file did alone (698 s of test time, the longest file).
"""

from __future__ import annotations

import json
import math
import os

import pytest

from server_app.inprocess import run_inprocess
from strategies.registry import all_methods, method_spec
from tasks.recipes import load_recipe, recipe_names
from tasks.registry import task_for

TASK_OF_KIND = {"vision": "digits-lenet5", "llm": "llm-tofu", "text": "text-minilm"}
CLIENTS = {"vision": 3, "llm": 4, "text": 3}
LLM_TINY = {"llm.num-authors": 8, "llm.qa-per-author": 3, "llm.forget-fraction": 0.25, "llm.batch-size": 8,
            "llm.lora-rank": 4}
CORE = ("retain_acc", "forget_acc", "test_acc", "mia")


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One model cache per test module (each imports this fixture): the original and retrain of each
    scenario of its task are built once."""
    return str(tmp_path_factory.mktemp("contract-cache"))


def cells(kind: str) -> list:
    """One ``pytest.param(spec, scenario)`` per registered method of task kind ``kind`` and scenario
    it declares that the kind's task offers (the LLM and text cells are marked slow)."""
    task = task_for(TASK_OF_KIND[kind])
    marks = [pytest.mark.slow] if kind in ("llm", "text") else []
    return [pytest.param(spec, scenario, id=f"{spec.name}-{task.name}-{scenario}", marks=marks)
            for spec in all_methods() if kind in spec.task_kinds
            for scenario in spec.scenarios if scenario in task.scenarios]


def recipe_cells(kind: str) -> list:
    """One ``pytest.param(spec, scenario, recipe)`` per recipe, method it is written for (of task kind
    ``kind``) and scenario."""
    task = task_for(TASK_OF_KIND[kind])
    return [pytest.param(method_spec(method), scenario, name, id=f"{method}-{name}-{task.name}-{scenario}")
            for name in recipe_names() for method in load_recipe(name).methods
            if kind in method_spec(method).task_kinds
            for scenario in method_spec(method).scenarios if scenario in task.scenarios]


def check_contract(spec, kind: str, scenario: str, cache_dir: str, out_dir: str, recipe: str = "") -> None:
    """Run ``spec`` on ``kind``'s task and ``scenario`` (smoke setting; with ``recipe`` where given) and
    assert the results contract."""
    run = {"task": TASK_OF_KIND[kind], "method": spec.name, "scenario": scenario, "smoke": True,
           "cache-dir": cache_dir, "outputs-dir": out_dir, **(LLM_TINY if kind == "llm" else {}),
           **({"recipe": recipe} if recipe else {})}
    folder = run_inprocess(run, CLIENTS[kind])
    with open(os.path.join(folder, "results.json")) as handle:
        results = json.load(handle)

    assert results["run"]["method"] == spec.name and results["run"]["scenario"] == scenario
    assert results["run"]["recipe"] == (recipe or "paper") and bool(results["run"]["recipe_settings"]) == bool(recipe)
    assert results["run"]["config"]["pretrain-rounds"] == 2 and results["run"]["presets"]  # the smoke setting applied
    for name in ("original", "unlearned", "continued"):
        entry = results["models"][name]
        assert set(CORE) <= set(entry), (name, entry)  # None where a metric does not apply to the task
        assert all(entry[k] is None or 0.0 <= entry[k] <= 1.0 for k in CORE), (name, entry)
        assert all(isinstance(entry[k], float) for k in ("retain_acc", "forget_acc")), (name, entry)
        if kind != "llm":  # a classifier's test accuracy per class, one entry per class (None: no test sample)
            by_class = entry["test_acc_by_class"]
            assert len(by_class) == task_for(TASK_OF_KIND[kind]).num_classes, (name, by_class)
            assert all(v is None or 0.0 <= v <= 1.0 for v in by_class) and any(v is not None for v in by_class)
    assert len(results["resurfacing"]["kr_curve"]) == results["run"]["config"]["continue-rounds"]
    assert {"checks", "failed", "reasons", "original_valid"} <= set(results["validity"])
    assert math.isfinite(results["resurfacing"]["kr_retrain"])
    for phase in ("pretrain", "retrain", "unlearn", "continue", "evaluate"):
        assert results["cost"][phase]["seconds"] >= 0 and not results["cost"][phase]["failures"]
    assert isinstance(results["method"], dict)
    files = results["model_files"]  # every model the run made, kept as safetensors
    assert {"original", "unlearned"} <= set(files) and all(os.path.isfile(os.path.join(folder, e["path"]))
                                                            for e in files.values())
    if spec.reversible:
        assert results["models"]["restored"]["equals_original"] is True
    else:
        assert "restored" not in results["models"]
