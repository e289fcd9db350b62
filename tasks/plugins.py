"""Plug-ins that sit between a ``SplitModel``'s extractor and head, described by JSON-able specs.

A plug-in that also adapts layers inside the model (FUSED's LoRA adapter) has an ``attach(model)``
method, called once after the plug-ins are built; it may change those layers' forward but must
leave every base parameter under its own name.

A spec is a dict such as ``{"kind": <a registered kind>, "seed": 0, ...}``. Server and clients build
the same architecture from the same specs, so only tensors (never module code) cross the grid.

The kinds are registered by the methods, a layer above this one: the method registry hands its
lookup to :func:`use_plugin_builders` when it is imported, so this module never imports it.
"""

from __future__ import annotations

import json
from typing import Callable

import torch
from torch import nn

from tasks.model import SplitModel

#: kind -> builder; set once by the method registry (:func:`use_plugin_builders`)
_builder_of: Callable[[str], Callable[[dict, int], nn.Module]] | None = None


def use_plugin_builders(builder_of: Callable[[str], Callable[[dict, int], nn.Module]]) -> None:
    """Register the lookup of plug-in builders: ``builder_of(kind)(spec, feature_dim) -> nn.Module``."""
    global _builder_of
    _builder_of = builder_of


def build_plugin(spec: dict, feature_dim: int) -> nn.Module:
    """One plug-in module from its spec; the builder is the one a method registered for ``kind``."""
    if _builder_of is None:
        raise RuntimeError("no plug-in kinds are registered: import strategies (the method registry) first")
    return _builder_of(str(spec.get("kind")))(spec, feature_dim)


def attach_plugins(model: SplitModel, specs: list[dict], seed: int = 0) -> SplitModel:
    """Replace the model's plug-ins by freshly built ones (seeded init), in order."""
    torch.manual_seed(seed)
    model.plugins = nn.ModuleList(build_plugin(spec, model.feature_dim) for spec in specs)
    model.plugin_kinds = [str(spec.get("kind")) for spec in specs]
    for plugin in model.plugins:
        if hasattr(plugin, "attach"):
            plugin.attach(model)
    return model


def specs_to_json(specs: list[dict]) -> str:
    return json.dumps(specs, sort_keys=True)


def specs_from_json(text: str) -> list[dict]:
    return json.loads(text) if text else []
