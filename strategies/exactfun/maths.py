"""Exact-Fun's quantised aggregation and its "does removing the client change this round?" test.

"Exact-Fun: an exact and efficient federated unlearning approach" (Xiong et al.) trains the
federation with a quantised global model: after each FedAvg aggregation every floating-point
weight is rounded to the grid ``step * round(w / step)``. Removing a client's update from a round
changes that round's model only if some weight crosses a grid boundary; if no weight does, the
quantised model — and so every later round — is exactly the one training without the client
would have produced. Pure functions on ``{layer: tensor}`` dicts (no Flower). The mean is the
project's FedAvg mean (``weighted_average``, float64 sums in client-id order), used alike in
pretraining, in the unlearning check and in recomputed rounds, so "the same" means bit for bit.
"""

from __future__ import annotations

import torch

from strategies.common.updates import weighted_average

Layers = dict[str, torch.Tensor]


def quantise(state: Layers, step: float) -> Layers:
    """Every floating-point tensor rounded to the grid ``step * round(w / step)``; integers as they are."""
    if not step > 0:
        raise ValueError(f"the quantisation step must be > 0, got {step!r}")
    return {k: (torch.round(v.double() / step) * step).to(v.dtype) if v.is_floating_point() else v.clone()
            for k, v in state.items()}


def quantised_mean(models: list[Layers], counts: list[int], step: float) -> Layers:
    """The quantised FedAvg aggregate of client models (weights: example counts)."""
    return quantise(weighted_average(models, [float(c) for c in counts]), step)


def same_state(a: Layers, b: Layers) -> bool:
    """Bit-identical tensors under the same names."""
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def first_changed_round(rounds: dict[int, dict], final: Layers, leaving: set[int], step: float) -> tuple[int, Layers] | None:
    """The first kept round whose quantised aggregate changes once ``leaving`` clients' models are
    dropped, with that new aggregate; None when no round changes (the model is already exact).

    ``rounds[t]`` holds the global model round ``t`` started from and the client models of that
    round (``server_app.history``, every round); the model after the last round is ``final``."""
    order = sorted(rounds)
    for i, t in enumerate(order):
        after = rounds[order[i + 1]]["global"] if i + 1 < len(order) else final
        kept = sorted(c for c in rounds[t]["clients"] if c not in leaving)
        if not kept:
            raise ValueError(f"round {t}: no client other than the leaving one(s) took part")
        candidate = quantised_mean([rounds[t]["clients"][c] for c in kept], [rounds[t]["counts"][c] for c in kept], step)
        if not same_state(candidate, after):
            return t, candidate
    return None
