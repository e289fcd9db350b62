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
