"""Plug-ins that sit between a ``SplitModel``'s extractor and head, described by JSON-able specs.

A plug-in that also adapts layers inside the model (FUSED's LoRA adapter) has an ``attach(model)``
method, called once after the plug-ins are built; it may change those layers' forward but must
leave every base parameter under its own name.

A spec is a dict such as ``{"kind": <a registered kind>, "seed": 0, ...}``. Server and clients build
the same architecture from the same specs, so only tensors (never module code) cross the grid.
"""

from __future__ import annotations

import json

import torch
from torch import nn

from tasks.model import SplitModel


def build_plugin(spec: dict, feature_dim: int) -> nn.Module:
    """One plug-in module from its spec; the builder is the one a method registered for ``kind``
    (``strategies.registry.MethodSpec.plugins``)."""
    from strategies.registry import plugin_builder

    return plugin_builder(str(spec.get("kind")))(spec, feature_dim)


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
