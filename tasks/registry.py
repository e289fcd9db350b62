"""Vision task registry: which images, which model, how many classes.

A new vision task is one line here (and its entry in ``tasks.config.TASKS``/``NUM_CLASSES``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tasks.model import SplitModel
from tasks.plugins import attach_plugins


@dataclass(frozen=True)
class VisionTask:
    """A dataset name understood by ``tasks.vision.load_images`` and a model architecture."""

    dataset: str
    arch: str
    num_classes: int
    in_channels: int


VISION_TASKS = {
    "digits-lenet5": VisionTask("digits", "lenet5", 10, 1),
    "mnist-lenet5": VisionTask("mnist", "lenet5", 10, 1),
    "cifar10-resnet18": VisionTask("cifar10", "resnet18", 10, 3),
    "cifar100-resnet34": VisionTask("cifar100", "resnet34", 100, 3),
    "cifar10-vit": VisionTask("cifar10", "vit", 10, 3),
}


def data_dir(configured: str) -> str:
    """The run config's ``data-dir``, or the user cache when it is empty."""
    return configured or os.path.join(os.path.expanduser("~"), ".cache", "fedunlearn", "data")


def load_task_images(task: str, configured_data_dir: str, download: bool):
    """The training pool of ``task`` as ``tasks.vision.ImageData``."""
    from tasks.vision import load_images

    return load_images(VISION_TASKS[task].dataset, data_dir(configured_data_dir), download)


def build_model(task: str, plugin_specs: list[dict] | None = None, seed: int = 0) -> SplitModel:
    """A freshly initialised model of ``task`` (init seeded), with the given plug-ins attached."""
    import torch

    from tasks.vision import build_vision_model

    spec = VISION_TASKS[task]
    torch.manual_seed(seed)
    model = build_vision_model(spec.arch, spec.num_classes, spec.in_channels, dataset=spec.dataset)
    attach_plugins(model, plugin_specs or [], seed=seed)
    return model


def build_task_model(cfg, plugin_specs: list[dict] | None = None):
    """The fresh model of the run's task, as the server handles it: a vision ``SplitModel``, or for
    an LLM task the fresh LoRA adapter (``tasks.llm.federation_model.AdapterModel``: only it travels)."""
    from tasks.config import LLM_TASKS

    if cfg["task"] in LLM_TASKS:
        from tasks.llm.federation_model import server_adapter_model

        if plugin_specs:
            raise ValueError(f"task '{cfg['task']}' takes no plug-ins, got {plugin_specs}")
        return server_adapter_model(cfg)
    return build_model(cfg["task"], plugin_specs, seed=cfg["seed"])


def check_task_setup(cfg, num_clients: int) -> None:
    """Checks that need the task's files or model (LLM: model path, LoRA targets, data columns,
    enough authors), run by the server before any node is asked anything; a ``ConfigError``."""
    from tasks.config import LLM_TASKS

    if cfg["task"] in LLM_TASKS:
        from tasks.llm.federation_setup import check_llm_setup

        check_llm_setup(cfg, num_clients)


LLM_MODEL_KEYS = ("llm-model", "llm-data-dir", "llm-num-authors", "llm-qa-per-author", "llm-forget-fraction",
                  "llm-lora-rank", "llm-lora-alpha", "llm-target-modules", "llm-load-in-4bit",
                  "llm-local-epochs", "llm-lr", "llm-batch-size")


def task_cache_key(cfg) -> dict:
    """Task-specific settings that determine the cached original/retrain models (none for vision)."""
    from tasks.config import LLM_TASKS

    return {k: cfg[k] for k in LLM_MODEL_KEYS} if cfg["task"] in LLM_TASKS else {}
