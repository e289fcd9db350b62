"""Vision task: image pools (digits, MNIST, CIFAR-10/100), split backbones, and the backdoor trigger."""

from tasks.vision.datasets import DATASETS, ImageData, load_images
from tasks.vision.models import (
    ARCHS,
    NORMALIZATION,
    Normalize,
    build_vision_model,
    lenet5,
    resnet18,
    resnet34,
    vit_small,
)
from tasks.vision.triggers import apply_trigger

__all__ = [
    "ARCHS",
    "DATASETS",
    "NORMALIZATION",
    "ImageData",
    "Normalize",
    "apply_trigger",
    "build_vision_model",
    "lenet5",
    "load_images",
    "resnet18",
    "resnet34",
    "vit_small",
]
