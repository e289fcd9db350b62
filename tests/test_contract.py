"""The contract every registered method keeps, on every task kind and scenario it declares.

Each registered method runs in process through the real phases with the smoke setting (a few
rounds and steps, every phase run). Its results.json must hold the results contract: the run
block with the presets applied; the model entries with their core metrics (accuracies in [0, 1],
None where a metric does not apply to the task, e.g. the LLM task's ``test_acc``); the resurfacing
curve; the validity block; the costs of every phase; the method's details; and, for a reversible
method, a restored model equal to the original. A method is tested here the moment it registers
(the LLM cells are marked slow).
"""

from __future__ import annotations

import json
import math
import os

import pytest

from server_app.inprocess import run_inprocess
from strategies.registry import all_methods
from tasks.registry import task_for

TASK_OF_KIND = {"vision": "digits-lenet5", "llm": "llm-tofu", "text": "text-minilm"}
CLIENTS = {"vision": 3, "llm": 4, "text": 3}
LLM_TINY = {"llm-num-authors": 8, "llm-qa-per-author": 3, "llm-forget-fraction": 0.25, "llm-batch-size": 8,
            "llm-lora-rank": 4}
CORE = ("retain_acc", "forget_acc", "test_acc", "mia")


def _cells():
    for spec in all_methods():
        for kind in spec.task_kinds:
            task = task_for(TASK_OF_KIND[kind])
            for scenario in spec.scenarios:
                if scenario in task.scenarios:
                    marks = [pytest.mark.slow] if kind in ("llm", "text") else []
                    yield pytest.param(spec, kind, scenario, id=f"{spec.name}-{task.name}-{scenario}", marks=marks)


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One model cache for the module: the original and retrain of each task and scenario are built once."""
    return str(tmp_path_factory.mktemp("contract-cache"))


@pytest.mark.parametrize("spec,kind,scenario", list(_cells()))
def test_registered_method_keeps_the_results_contract(spec, kind, scenario, shared_cache, tmp_path):
    run = {"task": TASK_OF_KIND[kind], "method": spec.name, "scenario": scenario, "smoke": True,
           "cache-dir": shared_cache, "outputs-dir": str(tmp_path), **(LLM_TINY if kind == "llm" else {})}
    folder = run_inprocess(run, CLIENTS[kind])
    with open(os.path.join(folder, "results.json")) as handle:
        results = json.load(handle)

    assert results["run"]["method"] == spec.name and results["run"]["scenario"] == scenario
    assert results["run"]["config"]["pretrain-rounds"] == 2 and results["run"]["presets"]  # the smoke setting applied
    for name in ("original", "unlearned", "continued"):
        entry = results["models"][name]
        assert set(CORE) <= set(entry), (name, entry)  # None where a metric does not apply to the task
        assert all(entry[k] is None or 0.0 <= entry[k] <= 1.0 for k in CORE), (name, entry)
        assert all(isinstance(entry[k], float) for k in ("retain_acc", "forget_acc")), (name, entry)
    assert len(results["resurfacing"]["kr_curve"]) == results["run"]["config"]["continue-rounds"]
    assert {"checks", "failed", "reasons", "original_valid"} <= set(results["validity"])
    assert math.isfinite(results["resurfacing"]["kr_retrain"])
    for phase in ("pretrain", "retrain", "unlearn", "continue", "evaluate"):
        assert results["cost"][phase]["seconds"] >= 0 and not results["cost"][phase]["failures"]
    assert isinstance(results["method"], dict)
    if spec.reversible:
        assert results["models"]["restored"]["equals_original"] is True
    else:
        assert "restored" not in results["models"]
