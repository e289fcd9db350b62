"""FUSED's unlearning adapter: peft LoRA on chosen layers of a vision model, as a plug-in.

The paper ("Unlearning through Knowledge Overwriting: Reversible Federated Unlearning via Selective
Sparse Adapter") adds an independent sparse adapter to each critical layer, ``W + A^f``, trains only
the adapters and removes them to restore; its public code builds the adapter as peft LoRA
(``LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1, bias="none")``), and so do we.

peft's ``inject_adapter_in_model`` replaces a layer by a wrapper whose parameters are renamed
(``weight`` -> ``base_layer.weight``) and whose factors sit inside the backbone. Here the model's
keys must not move — the base is the original model, cached, compared bit for bit and loaded by
name — and everything a method adds must live under ``plugins.<i>.`` (what ``scope="plugins"``
trains and uploads, what restore drops). So the plug-in lets peft build the wrapper around each
target layer and then splits it:

- the LoRA factors and dropout (``lora_A``, ``lora_B``, ``lora_dropout``) are registered in the
  plug-in (keys ``plugins.<i>.<slot>.lora_A.default.weight`` ...);
- the target layer is replaced in the model by :class:`AdaptedLayer`, which registers the original
  layer's own parameters under their original names (``features.1.weight`` stays
  ``features.1.weight``, the very same tensors) and runs peft's wrapper for its forward:
  ``base(x) + lora_B(lora_A(dropout(x))) * alpha / r``.

Between extractor and head the plug-in is the identity. LoRA's ``B`` starts at zero (peft's
default init; ``A`` Kaiming-uniform from the spec's seed), so a freshly attached adapter leaves the
model's outputs unchanged. Only ``nn.Linear`` and ``nn.Conv2d`` layers can take an adapter, and
only layers whose own forward the model calls: in this project's ViT the attention projections are
used as raw tensors by ``nn.MultiheadAttention``, so the ViT table adapts its MLP layers.
"""

from __future__ import annotations

import torch
from torch import nn

ADAPTER_KIND = "fused-lora"  # the plug-in kind this package registers
ADAPTABLE = (nn.Linear, nn.Conv2d)


class AdaptedLayer(nn.Module):
    """A target layer with its LoRA: the layer's own parameters under their own names, peft's forward.

    The peft wrapper is held as a plain attribute (not a sub-module), so its factors are counted once,
    in the plug-in that owns them, and the base parameters once, here."""

    def __init__(self, base: nn.Module, wrapped: nn.Module):
        super().__init__()
        for name, param in base.named_parameters(recurse=False):
            self.register_parameter(name, param)
        object.__setattr__(self, "wrapped", wrapped)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wrapped(x)


class _Holder(nn.Module):
    """The one-layer module peft injects into (its target is named ``layer``)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer


def slot_name(path: str) -> str:
    """The plug-in's sub-module name of a target layer path (module names may not hold dots)."""
    return path.replace(".", "_")


def check_targets(model: nn.Module, targets: list[str], key: str = "fused.layers") -> None:
    """One-line ``ValueError`` for a target the model lacks or that cannot take a LoRA adapter."""
    if not targets:
        raise ValueError(f"run-config '{key}' names no layer: give at least one module name")
    modules = dict(model.named_modules())
    for path in targets:
        if path not in modules:
            adaptable = [n for n, m in modules.items() if isinstance(m, ADAPTABLE)]
            raise ValueError(f"run-config '{key}': the model has no layer {path!r}: must be among "
                             f"{', '.join(adaptable)}")
        if not isinstance(modules[path], ADAPTABLE):
            raise ValueError(f"run-config '{key}': layer {path!r} is a {type(modules[path]).__name__}: "
                             f"must be an nn.Linear or nn.Conv2d")
    if len(set(targets)) != len(targets):
        raise ValueError(f"run-config '{key}' names a layer twice: {', '.join(targets)}")


class FusedLoRA(nn.Module):
    """The ``fused-lora`` plug-in: identity on features; LoRA factors of the target layers.

    ``attach(model)`` (called once by ``tasks.plugins.attach_plugins``) puts the adapters in place."""

    def __init__(self, targets: list[str], r: int, alpha: float, dropout: float, seed: int):
        from peft import LoraConfig  # imported by the model builds that need it, not by config checks

        super().__init__()
        self.targets, self.seed = list(targets), seed
        self.config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, bias="none",
                                 target_modules=["layer"])
        self.adapters = nn.ModuleDict()

    def attach(self, model: nn.Module) -> None:
        if self.adapters:
            raise ValueError("this fused-lora plug-in is already attached to a model")
        from peft import inject_adapter_in_model

        check_targets(model, self.targets)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for path in self.targets:
                base = model.get_submodule(path)
                wrapped = inject_adapter_in_model(self.config, _Holder(base)).layer
                factors = nn.Module()
                for part in ("lora_A", "lora_B", "lora_dropout"):
                    factors.add_module(part, getattr(wrapped, part))
                self.adapters[slot_name(path)] = factors
                parent, _, leaf = path.rpartition(".")
                model.get_submodule(parent).register_module(leaf, AdaptedLayer(base, wrapped))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z


def build_plugin(spec: dict, feature_dim: int) -> FusedLoRA:
    """The registered builder of plug-in kind :data:`ADAPTER_KIND` (``feature_dim`` is not used:
    the adapter sits inside the layers it names)."""
    return FusedLoRA(list(spec["targets"]), r=int(spec["r"]), alpha=float(spec["alpha"]),
                     dropout=float(spec["dropout"]), seed=int(spec.get("seed", 0)))
