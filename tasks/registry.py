"""Task name -> :class:`tasks.base.Task`. A new task is one entry here (its code in its own package).

Vision tasks are light objects; the LLM and text tasks' modules are imported only when a run uses
them (a vision ClientApp process never loads transformers). Settings are shared by every task of a
kind (:func:`task_kinds`), so a kind's settings module is imported by the config, not the task.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache

from core.config import Setting
from tasks.base import Task
from tasks.vision.task import VisionTask

# The offline default's FedAvg recipe: one local epoch a round, 60 rounds (and 30 continued rounds,
# the 30 local epochs of the global default's 10 x 3). Three local epochs a round over 20 rounds left
# the original and the exact-unlearning reference at 7 clients alpha 0.1 apart by more than the
# comparison's own bars when merely drawn again (docs/robustness.md, "The FedAvg recipe").
DIGITS_RECIPE = {"pretrain-rounds": 60, "local-epochs": 1, "continue-rounds": 30}

VISION_TASKS = {task.name: task for task in (
    VisionTask("digits-lenet5", "digits", "lenet5", 10, 1, presets=DIGITS_RECIPE),
    VisionTask("mnist-lenet5", "mnist", "lenet5", 10, 1),
    VisionTask("cifar10-resnet18", "cifar10", "resnet18", 10, 3),
    VisionTask("cifar100-resnet34", "cifar100", "resnet34", 100, 3),
    VisionTask("cifar10-vit", "cifar10", "vit", 10, 3),
)}

# task name -> "module:attr" of a Task instance imported on first use; kind -> its settings
LAZY_TASKS = {"llm-tofu": ("llm", "tasks.llm.task:LLM_TOFU"),
              "llm-wmdp": ("llm", "tasks.llm.wmdp:LLM_WMDP"),
              "llm-muse": ("llm", "tasks.llm.muse:LLM_MUSE"),
              "llm-tofu-forget01": ("llm", "tasks.llm.tofu_forget01:LLM_TOFU_FORGET01"),
              "text-minilm": ("text", "tasks.text.task:TEXT_MINILM"),
              "agnews-bert": ("text", "tasks.text.task:AGNEWS_BERT")}
KIND_SETTINGS = {"vision": None, "llm": "tasks.llm.settings:LLM_SETTINGS",
                 "text": "tasks.text.settings:TEXT_SETTINGS"}


def task_names() -> tuple[str, ...]:
    return (*VISION_TASKS, *LAZY_TASKS)


def _load(target: str):
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@lru_cache(maxsize=None)
def task_for(name: str) -> Task:
    """The task registered under ``name``."""
    if name in VISION_TASKS:
        return VISION_TASKS[name]
    if name in LAZY_TASKS:
        return _load(LAZY_TASKS[name][1])
    raise ValueError(f"task {name!r} is not available: must be one of {', '.join(task_names())}")


def kind_of(name: str) -> str:
    return "vision" if name in VISION_TASKS else LAZY_TASKS[name][0]


@dataclass(frozen=True)
class TaskKind:
    """The tasks of one kind and the settings they share."""

    kind: str
    names: tuple[str, ...]
    settings: tuple[Setting, ...]


@lru_cache(maxsize=1)
def task_kinds() -> tuple[TaskKind, ...]:
    kinds = []
    for kind, target in KIND_SETTINGS.items():
        names = tuple(n for n in task_names() if kind_of(n) == kind)
        kinds.append(TaskKind(kind, names, tuple(_load(target)) if target else ()))
    return tuple(kinds)
