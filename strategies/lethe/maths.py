"""Lethe's server-side math (the Lethe paper, section IV-B and IV-D): pure functions on named tensors.

A "layer" is one named tensor of a state dict (``features.0.weight``, ``head.bias``, ...). The paper
writes ``w^(l)`` for "the parameter vector of layer l" without saying whether a layer's weight and
bias form one vector; we treat every named tensor as its own layer, which is the finest split and
the one a state dict gives for free.

Formulas implemented (``Δr`` = retain stream, eq. 8; ``Δu`` = forget stream, eq. 7):

- eq. 8   ``Δr = Σ_k p_k Δ_k`` with ``p_k = n_k / Σ_j n_j``            -> ``strategies.common.updates.weighted_average``
- eq. 9   ``s^(l) = <Δr^(l), Δu^(l)>``                                   -> :func:`layer_alignment`
- eq. 10  ``Δ~^(l) = Δr^(l) - γ Δu^(l)`` if ``s^(l) > 0`` else ``-Δu^(l)`` -> :func:`rectify`
- eq. 11  ``w_{t+1}^(l) = w_t^(l) + Δ~^(l)``                             -> ``strategies.common.updates.apply_update``
- eq. 13  ``s/‖Δu‖² <= γ <= ‖Δr‖²/s`` for layers with ``s > 0``           -> :func:`gamma_bounds`
- eq. 18  ``γ_min = max_l s^(l)/‖Δu^(l)‖²`` (and the matching upper end)   -> :func:`feasible_gamma_range`

Inner products and norms are accumulated in float64 so that the sign test of eq. 10 and the bounds
of eq. 13 do not flip on float32 rounding; rectified tensors keep the dtype of the inputs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch


Layers = dict[str, torch.Tensor]


def _check_pair(retain: Layers, forget: Layers) -> None:
    """Both streams must name the same floating-point layers with the same shapes."""
    if set(retain) != set(forget):
        missing = sorted(set(retain) ^ set(forget))
        raise ValueError(f"layer {missing[0]!r} is in only one of the retain/forget updates; both need the same layers")
    for name, r in retain.items():
        u = forget[name]
        if r.shape != u.shape:
            raise ValueError(f"layer {name!r}: retain shape {tuple(r.shape)} != forget shape {tuple(u.shape)}")
        if not (r.is_floating_point() and u.is_floating_point()):
            raise ValueError(f"layer {name!r}: rectification needs floating-point tensors (drop integer buffers first)")


def _check_gamma(gamma: float) -> None:
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"lethe.gamma must be a finite number > 0, got {gamma!r}")


def _dot(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(torch.dot(a.detach().reshape(-1).double(), b.detach().reshape(-1).double()))


def layer_alignment(retain: Layers, forget: Layers) -> dict[str, float]:
    """Eq. 9: per-layer inner product ``s^(l) = <Δr^(l), Δu^(l)>`` of the two update streams."""
    _check_pair(retain, forget)
    return {name: _dot(retain[name], forget[name]) for name in retain}


def _per_layer(gamma: float | Mapping[str, float], names) -> dict[str, float]:
    """``gamma`` for every layer of ``names``: one number for all, or a mapping with an entry per layer."""
    gammas = dict(gamma) if isinstance(gamma, Mapping) else {name: gamma for name in names}
    missing = sorted(set(names) - set(gammas))
    if missing:
        raise ValueError(f"no gamma for layer {missing[0]!r}")
    for value in gammas.values():
        _check_gamma(value)
    return gammas


def rectify(retain: Layers, forget: Layers, gamma: float | Mapping[str, float]) -> Layers:
    """Eq. 10: the rectified update per layer (``gamma``: one number, or one per layer as
    ``layer_gammas`` gives).

    Where the streams agree (``s > 0``) the forget direction is subtracted from the retain update
    with strength ``gamma``; where they do not (``s <= 0``, including an all-zero forget layer) the
    update is the pure negated forget stream ``-Δu``, exactly as the paper states (the retain
    stream is dropped for that layer in that round).
    """
    alignment = layer_alignment(retain, forget)
    gammas = _per_layer(gamma, alignment)
    rectified: Layers = {}
    for name, s in alignment.items():
        r, u = retain[name].detach(), forget[name].detach()
        rectified[name] = (r - gammas[name] * u) if s > 0 else -u
    return rectified


def remove_forget_component(retain: Layers, forget: Layers) -> Layers:
    """Our restore rule: the retain update with, per layer, its component along the forget stream
    removed where the two align (``Δr - (s/‖Δu‖²) Δu`` if ``s > 0``), else ``Δr`` unchanged.

    It is eq. 10 at the *lower* Prop. IV.1 bound where the streams align, and keeps the retain
    stream where they do not (eq. 10 would apply ``-Δu`` there, more forgetting; restore is for
    utility). Every layer then satisfies ``<out, Δu> <= 0`` (no re-learning to first order) and
    ``<out, Δr> >= 0`` (utility still improves), and ``‖out‖ <= ‖Δr‖``.
    """
    alignment = layer_alignment(retain, forget)
    out: Layers = {}
    for name, s in alignment.items():
        r, u = retain[name].detach(), forget[name].detach()
        norm2 = _dot(u, u)
        out[name] = r - (s / norm2) * u if s > 0 and norm2 > 0 else r.clone()
    return out


def gamma_bounds(retain: Layers, forget: Layers) -> dict[str, tuple[float, float] | None]:
    """Eq. 13 (Proposition IV.1): ``(s/‖Δu‖², ‖Δr‖²/s)`` per layer with ``s > 0``; ``None`` where
    ``s <= 0`` (there the rule is ``-Δu`` and no condition on γ is needed).

    With ``γ`` inside a layer's interval the rectified update satisfies ``<Δ~, Δu> <= 0`` and
    ``<Δ~, Δr> >= 0`` for that layer (eq. 14). The interval is non-empty by Cauchy-Schwarz (eq. 23).
    ``s > 0`` implies ``Δu != 0``, so the lower end is always defined.
    """
    alignment = layer_alignment(retain, forget)
    bounds: dict[str, tuple[float, float] | None] = {}
    for name, s in alignment.items():
        if s <= 0:
            bounds[name] = None
            continue
        forget_sq = _dot(forget[name], forget[name])
        retain_sq = _dot(retain[name], retain[name])
        bounds[name] = (s / forget_sq, retain_sq / s)
    return bounds


def check_gamma(bounds: dict[str, tuple[float, float] | None], gamma: float | Mapping[str, float],
                rel_tol: float = 1e-9) -> dict[str, bool]:
    """Per layer: does ``gamma`` (one number, or one per layer) satisfy eq. 13? Layers with ``None``
    bounds always pass.

    ``rel_tol`` widens each interval by a relative ``1e-9`` so that a γ computed from the bounds
    themselves (e.g. the midpoint of a Cauchy-Schwarz-tight interval) is not rejected for rounding.
    """
    gammas = _per_layer(gamma, bounds)
    ok: dict[str, bool] = {}
    for name, bound in bounds.items():
        if bound is None:
            ok[name] = True
            continue
        low, high = bound
        ok[name] = low * (1 - rel_tol) <= gammas[name] <= high * (1 + rel_tol)
    return ok


def feasible_gamma_range(bounds: dict[str, tuple[float, float] | None]) -> tuple[float, float] | None:
    """One γ for all layers: ``(max_l lower, min_l upper)`` over layers with ``s > 0`` (eq. 18 is the
    lower end). ``None`` if no layer has ``s > 0`` (any γ works). The range can be empty
    (lower > upper): then no single γ satisfies Proposition IV.1 in every layer this round.
    """
    active = [b for b in bounds.values() if b is not None]
    if not active:
        return None
    return max(low for low, _ in active), min(high for _, high in active)


def layer_gammas(bounds: dict, gamma: float, mode: str) -> dict[str, float]:
    """Gamma per layer (``guard.gamma-rule``): ``fixed`` = ``lethe.gamma`` everywhere (the paper);
    ``clamp`` = ``lethe.gamma`` clipped into the layer's Prop. IV.1 interval [s/|Δu|², |Δr|²/s] wherever
    the streams align; ``upper`` = the interval's upper end |Δr|²/s (``lethe.gamma`` unused).

    ``clamp`` and ``upper`` are ours: inside the interval the rectified update increases the forget
    loss and does not oppose the retain stream (to first order), per layer and per round. A fixed gamma
    outside it can oppose the retain stream where both streams, computed through the amplifying
    adapter, align in every layer; a small clamped gamma lands on the lower end, where the update is
    orthogonal to the forget stream; ``upper`` is the strongest forgetting Prop. IV.1 allows (the
    update is orthogonal to the retain stream instead)."""
    if mode == "fixed":
        return {k: gamma for k in bounds}
    if mode == "upper":
        return {k: gamma if b is None else b[1] for k, b in bounds.items()}
    return {k: gamma if b is None else min(max(gamma, b[0]), b[1]) for k, b in bounds.items()}


def global_norm(update: Layers) -> float:
    """The L2 norm of all tensors of ``update`` together (float64)."""
    return float(torch.sqrt(sum((v.double() ** 2).sum() for v in update.values()))) if update else 0.0


def lift_retain(retain: Layers, forget: Layers, floor: float) -> tuple[Layers, float]:
    """The retain stream rectification uses: ``retain`` itself, or ``retain`` scaled up to
    ``floor`` x the forget stream's norm when it is shorter (``floor`` 0: never). Returns the stream
    and the factor applied (1.0: unchanged).

    Raising only the clip's bound does not lengthen the step where the streams align: there the
    upper-gamma step ``Δr - (‖Δr‖²/s) Δu`` has length ``‖Δr‖ tan θ`` and vanishes with the
    retain stream. Proposition IV.1 constrains only signs of inner products, and a positive factor on
    ``Δr`` changes none of them (its gamma interval scales with it), so the lifted stream keeps every
    guarantee while the step no longer shrinks with the retained loss."""
    retain_norm, target = global_norm(retain), floor * global_norm(forget)
    if floor <= 0 or target <= retain_norm or retain_norm == 0:  # (an all-zero stream has no direction)
        return retain, 1.0
    factor = target / retain_norm
    return {k: v * factor for k, v in retain.items()}, factor


def clip_to_reference(update: Layers, reference: Layers, ratio: float) -> Layers:
    """Scale ``update`` down so its global L2 norm is at most ``ratio`` x the reference's (0 = off).

    Ours (``guard.step-clip``): where the streams anti-align eq. 10 applies ``-Δu``, a gradient *ascent*
    step on the forget data; as the forget loss grows, so does ``Δu``, and unbounded steps can diverge
    to non-finite weights within a few rounds. Bounding each rectified step by the retain stream's size
    (a normal FedAvg step) keeps the direction of eq. 10 and the per-layer signs of Prop. IV.1 (a
    positive scale changes no inner-product sign)."""
    if ratio <= 0:
        return update
    norm = torch.sqrt(sum((v.double() ** 2).sum() for v in update.values()))
    limit = ratio * torch.sqrt(sum((v.double() ** 2).sum() for v in reference.values()))
    if norm <= limit or norm == 0:
        return update
    scale = float(limit / norm)
    return {k: v * scale for k, v in update.items()}


OVERSHOOT = 3.0


def rectify_verdict(forget_loss: float, stop_loss: float, retain_loss: float | None,
                    retain_reference: float | None, max_rise: float) -> str:
    """What one rectification round's reports say about the model they were measured on (ours).

    ``forget_loss``: the forget clients' loss of the received backbone; ``retain_loss``: the
    retained clients' reported training loss on it, ``retain_reference`` the same clients' loss on
    the model rectification started from (both ``None`` when no retained client reported: the
    utility check cannot be made). In order of precedence:

    - ``"explode"``: a loss is non-finite;
    - ``"overshoot"``: the forget loss is past ``OVERSHOOT`` (3) x ``stop_loss`` — the step that
      produced the model was far too long;
    - ``"utility"``: the retained loss rose more than ``max_rise`` nats above the reference;
    - ``"stop"``: the forget loss reached ``stop_loss`` (the normal end);
    - ``"go"``: rectify on.
    """
    measured = retain_loss is not None and retain_reference is not None
    if not math.isfinite(forget_loss) or (measured and not math.isfinite(retain_loss)):
        return "explode"
    if forget_loss > OVERSHOOT * stop_loss:
        return "overshoot"
    if measured and retain_loss > retain_reference + max_rise:
        return "utility"
    if forget_loss >= stop_loss:
        return "stop"
    return "go"


def scale_update(update: Layers, factor: float) -> Layers:
    """``factor`` x every tensor of ``update`` (a shortened step; 0 < factor <= 1)."""
    if not 0 < factor <= 1:
        raise ValueError(f"an update can only be shortened: factor must be in (0, 1], got {factor!r}")
    return {k: v * factor for k, v in update.items()}
