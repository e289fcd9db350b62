"""NoT's pure math: which tensors "the chosen layers" are, and their negation.

"NoT: Federated Unlearning via Weight Negation" (Khalil et al.) multiplies the parameters of chosen
layers of the global model by -1: the layer still fits its neighbours up to a sign flip, which
breaks the co-adaptation between layers (the model forgets) while staying close to a set of optimal
parameters (a few FedAvg rounds on retained data recover it). A layer is a module of the model;
its parameters are every tensor it owns, weight and bias (a BatchNorm layer is negated only when
named). Buffers are never negated.
"""

from __future__ import annotations

import torch
from torch import nn

FIRST = "first"


def first_layer(model: nn.Module) -> str:
    """The name of the model's first ``Conv2d`` or ``Linear`` module in registration order, which is
    forward order for the vision models here (LeNet-5 and the ResNets ``features.1``, the ViT
    ``features.patch_embed``)."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Conv2d, nn.Linear)):
            return name
    raise ValueError("the model has no Conv2d or Linear layer to negate")


def layer_names(model: nn.Module) -> list[str]:
    """Names of the modules that own parameters themselves (what ``not.layers`` may list, besides
    their containers)."""
    return [name for name, module in model.named_modules()
            if name and any(True for _ in module.parameters(recurse=False))]


def parameter_keys(model: nn.Module, spec: str) -> list[str]:
    """The ``state_dict`` keys of every parameter of the modules named in ``spec`` (comma-separated
    module names, or ``first``), in model order; one-line ``ValueError`` for a name the model lacks."""
    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise ValueError("run-config 'not.layers' is empty: name at least one layer, or 'first'")
    modules = dict(model.named_modules())
    chosen: set[str] = set()
    for name in names:
        name = first_layer(model) if name == FIRST else name
        if name not in modules or not any(True for _ in modules[name].parameters()):
            sample = ", ".join(layer_names(model)[:6])
            raise ValueError(f"run-config 'not.layers' names {name!r}, which is not a layer with parameters of "
                             f"this model: must be 'first' or module names such as {sample}")
        chosen.update(f"{name}.{key}" for key, _ in modules[name].named_parameters())
    return [key for key, _ in model.named_parameters() if key in chosen]


def negate(state: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """A copy of ``state`` with the tensors under ``keys`` multiplied by -1 (the others unchanged)."""
    missing = [key for key in keys if key not in state]
    if missing:
        raise ValueError(f"tensor {missing[0]!r} is not in the model state")
    flipped = set(keys)
    return {key: (-value if key in flipped else value).clone() for key, value in state.items()}
