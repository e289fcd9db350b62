"""RMU's run-config keys (``rmu.*``) and the rule that carries the WMDP paper's values to the run's model.

The paper's values are for Zephyr-7B (32 decoder layers, hidden size 4096): the output of layer 7
is steered, the MLP down-projections of layers 5, 6, 7 are updated, c = 6.5, alpha = 1200. On
another model (``docs/rmu.md``):

- the steered layer keeps its place in depth: layer 7 closes the first quarter of 32 layers, so
  ``l = ceil(L / 4) - 1`` for L layers (7 on 32, 5 on 24, 0 on the tiny model's 2);
- the updated layers are the ``rmu.update-layers`` (paper: 3) layers ending at ``l``, cut at 0;
- c keeps the size per hidden unit of the target ``c u`` (u has unit norm, so each unit is of order
  c / sqrt(d)), the scale the mean squared error compares it at: ``c = 6.5 sqrt(d / 4096)``;
- alpha weighs two such per-unit means against each other, so it carries over as it is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from core.config import Setting, at_least, positive, setting

PAPER_LAYERS, PAPER_LAYER, PAPER_HIDDEN, PAPER_COEFF = 32, 7, 4096, 6.5
UPDATED_MODULE = "down_proj"
"""The module whose LoRA factors RMU trains (the official code's ``param_ids`` 6: ``mlp.down_proj``)."""

SETTINGS: tuple[Setting, ...] = (
    setting("rmu.layer", int, -1, "decoder layer l whose output is steered to c u; -1 = the paper's layer 7 of 32 "
            "kept in place: ceil(L / 4) - 1 for L layers", at_least(-1)),
    setting("rmu.update-layers", int, 3, "decoder layers, ending at rmu.layer, whose down_proj LoRA trains "
            "(paper: 5, 6, 7)", positive()),
    setting("rmu.steering-coeff", float, 0.0, "c of the forget target c u; 0 = the paper's 6.5 at hidden size 4096, "
            "scaled by sqrt(d / 4096)", at_least(0)),
    setting("rmu.alpha", float, 1200.0, "weight alpha of the retain term alpha MSE(h_l, h_l frozen)", at_least(0)),
)
KEYS = tuple(s.key for s in SETTINGS)


@dataclass(frozen=True)
class RMUPlan:
    """RMU resolved on one model: steered layer, updated layers, c, alpha and the seed of u."""

    layer: int
    updated_layers: tuple[int, ...]
    steering_coeff: float
    alpha: float
    seed: int


def steered_layer(num_layers: int, configured: int, model: str = "the model") -> int:
    """``configured`` if >= 0 (checked against the model, named ``model`` in the error), else ``ceil(L / 4) - 1``."""
    if configured >= num_layers:
        raise ValueError(f"run-config 'rmu.layer'={configured}: {model} has {num_layers} decoder layers: "
                         f"must be -1 or in 0..{num_layers - 1}")
    if num_layers < 1:
        raise ValueError(f"{model} has {num_layers} decoder layers")
    if configured >= 0:
        return configured
    return math.ceil(num_layers * (PAPER_LAYER + 1) / PAPER_LAYERS) - 1


def steering_coeff(hidden_size: int, configured: float) -> float:
    """``configured`` if > 0, else ``6.5 sqrt(d / 4096)``."""
    return configured if configured > 0 else PAPER_COEFF * math.sqrt(hidden_size / PAPER_HIDDEN)


def plan(cfg, num_layers: int, hidden_size: int) -> RMUPlan:
    """The run's RMU on a model of ``num_layers`` decoder layers of width ``hidden_size``; u is drawn
    from the run's seed, so every client steers towards the same vector."""
    layer = steered_layer(num_layers, cfg["rmu.layer"])
    first = max(0, layer - cfg["rmu.update-layers"] + 1)
    return RMUPlan(layer, tuple(range(first, layer + 1)), steering_coeff(hidden_size, cfg["rmu.steering-coeff"]),
                   float(cfg["rmu.alpha"]), int(cfg["seed"]))
