"""Model updates every method shares: a weighted mean of client updates and applying an update.

Pure functions on ``{layer name: tensor}`` dicts (no Flower). FedAvg rounds, Lethe's rectification
and the one-round objectives all aggregate and apply updates with these.
"""

from __future__ import annotations

import math

import torch

Layers = dict[str, torch.Tensor]


def apply_update(weights: Layers, update: Layers, server_lr: float = 1.0) -> Layers:
    """Eq. 11: ``w_{t+1} = w_t + Δ~`` (added, not subtracted: the sign is already inside Δ~).

    The paper applies the rectified update with step 1; ``server_lr`` (default 1.0 = the paper)
    scales it for operators who want a damped step. Layers of ``weights`` absent from ``update``
    (e.g. integer BatchNorm counters the caller did not rectify) are returned unchanged.
    """
    if not (math.isfinite(server_lr) and server_lr > 0):
        raise ValueError(f"server_lr must be a finite number > 0, got {server_lr!r}")
    extra = sorted(set(update) - set(weights))
    if extra:
        raise ValueError(f"layer {extra[0]!r} is in the update but not in the weights")
    new: Layers = {}
    for name, w in weights.items():
        if name not in update:
            new[name] = w.detach().clone()
            continue
        delta = update[name]
        if delta.shape != w.shape:
            raise ValueError(f"layer {name!r}: update shape {tuple(delta.shape)} != weight shape {tuple(w.shape)}")
        new[name] = (w.detach() + server_lr * delta.detach().to(w.dtype)).to(w.dtype)
    return new


def weighted_average(updates: list[Layers], weights: list[float]) -> Layers:
    """Eq. 8's aggregation: ``Σ_k p_k Δ_k`` with ``p_k = weights_k / Σ_j weights_j``.

    ``weights`` are the clients' example counts ``n_k`` (FedAvg weighting, eq. 1); they are
    normalised here, so raw counts can be passed. Sums are taken in float64; integer tensors
    (e.g. BatchNorm's ``num_batches_tracked``) are averaged and rounded back to integers.
    """
    if not updates:
        raise ValueError("updates must be a non-empty list of layer dicts")
    if len(updates) != len(weights):
        raise ValueError(f"weights must have one entry per update ({len(updates)}), got {len(weights)}")
    if any(not math.isfinite(w) or w < 0 for w in weights) or sum(weights) <= 0:
        raise ValueError("weights must be finite, >= 0 and sum to > 0 (they are example counts)")
    reference = updates[0]
    for k, upd in enumerate(updates[1:], start=1):
        if set(upd) != set(reference):
            odd = sorted(set(upd) ^ set(reference))[0]
            raise ValueError(f"layer {odd!r} is missing from some updates (update {k} vs update 0)")
        for name, t in upd.items():
            if t.shape != reference[name].shape:
                shapes = f"{tuple(t.shape)} != {tuple(reference[name].shape)}"
                raise ValueError(f"layer {name!r}: update {k} shape differs from update 0 ({shapes})")
    total = float(sum(weights))
    averaged: Layers = {}
    for name, first in reference.items():
        acc = torch.zeros(first.shape, dtype=torch.float64, device=first.device)
        for upd, w in zip(updates, weights):
            acc += (w / total) * upd[name].detach().double()
        averaged[name] = acc.to(first.dtype) if first.is_floating_point() else acc.round().to(first.dtype)
    return averaged
