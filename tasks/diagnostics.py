"""Knowledge-resurfacing diagnostics of Lethe (the Lethe paper, eq. 5 and section V-D), for any method.

All inputs are plain numbers, tensors or state dicts, so the same code measures FedUP, FIRM, Lethe,
retrain, ... alike. Formulas:

- RR  (eq. 5)  ``100 · max(0, max_t KR_t − KR_re) / (KR_ori − KR_re)``      -> :func:`kr_curve_rr`
- CT-KR        KR after continued training on retained data = last KR_t   -> :func:`resurfacing_summary`
- RT  (eq. 24) ``cos(Δw_t, w_ori − w_un)``, ``Δw_t`` = global update of continued round t
                                                                            -> :func:`rollback_tendency`
- FD  (V-D)    ``(1/n) Σ_i ‖f_i − f̄‖²`` over penultimate features of the forget set
                                                                            -> :func:`forgetting_dispersion`
- PCA (Fig. 9) 2-D PCA of retain vs forget penultimate features, one panel per model
                                                                            -> :func:`pca_scatter_png`
- LMC (Fig. 11) forget-set loss along ``(1−α) w_un + α w_rec``; the paper plots the path but gives no
  scalar, so the barrier height follows its reference [3] (Frankle et al.):
  ``max_α [L(α) − ((1−α) L(0) + α L(1))]``                                  -> :func:`lmc_barrier`
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Sequence

import torch
from matplotlib.figure import Figure
from sklearn.decomposition import PCA

StateDict = dict[str, torch.Tensor]


# ----------------------------------------------------------------------------- resurfacing (eq. 5)

def kr_curve_rr(kr_original: float, kr_retrain: float, kr_curve: Sequence[float]) -> float:
    """Eq. 5, the resurfacing rate in percent, with ``max_t`` over the continued-training curve.

    ``kr_curve[t]`` is KR after continued round ``t + 1`` (the unlearned model itself is not part of
    the max: resurfacing is what continued training brings back). 0 = never above the retrain
    reference, 100 = back to the original model's KR; values above 100 are possible and kept.
    If ``KR_ori − KR_re <= 0`` (the original never knew more than retrain, so nothing can resurface
    relative to it), or there was no continued round (``continue-rounds=0``), ``nan`` is returned.
    """
    denominator = kr_original - kr_retrain
    if not denominator > 0 or len(kr_curve) == 0:
        return math.nan
    rise = max(0.0, max(kr_curve) - kr_retrain)
    return 100.0 * rise / denominator


def resurfacing_summary(
    kr_original: float, kr_unlearned: float, kr_retrain: float | None, kr_curve: Sequence[float],
    diverged_at_round: int | None = None,
) -> dict[str, float | list[float] | int | None]:
    """The ``resurfacing`` block of results.json. ``ct_kr`` is CT-KR ("target knowledge retention
    after continued training on retained data", section V-A): the KR of the last continued round.
    ``rr`` may be ``nan`` (see :func:`kr_curve_rr`); JSON writers should map it to ``null``.

    ``diverged_at_round``: the continued round that produced a non-finite model (``kr_curve`` then
    holds the rounds before it); the block then carries ``diverged_at_round`` and CT-KR and RR are
    ``nan``: a dead model's forget accuracy of 0 is no evidence of forgetting, and the curve's
    maximum misses the rounds never run. ``kr_retrain`` None: no retrain oracle ran; ``kr_retrain`` is
    then None and RR, which is relative to it, ``nan``."""
    curve = [float(k) for k in kr_curve]
    diverged = diverged_at_round is not None
    summary = {
        "kr_original": float(kr_original),
        "kr_unlearned": float(kr_unlearned),
        "kr_retrain": None if kr_retrain is None else float(kr_retrain),
        "kr_curve": curve,
        "ct_kr": curve[-1] if curve and not diverged else math.nan,
        "rr": math.nan if diverged or kr_retrain is None else kr_curve_rr(kr_original, kr_retrain, curve),
    }
    if diverged:
        summary["diverged_at_round"] = int(diverged_at_round)
    return summary


# ----------------------------------------------------------------------------- rollback (eq. 24)

def _flat(state: StateDict, keys: list[str]) -> torch.Tensor:
    return torch.cat([state[k].detach().reshape(-1).double().cpu() for k in keys])


def _cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    norm = float(a.norm() * b.norm())
    return float(torch.dot(a, b)) / norm if norm > 0 else math.nan


def rollback_tendency(original: StateDict, unlearned: StateDict, continued: Sequence[StateDict]) -> list[float]:
    """Eq. 24: ``RT(t) = <Δw_t, w_ori − w_un> / (‖Δw_t‖ ‖w_ori − w_un‖)`` for each continued round.

    Inputs are state dicts of the original model, the unlearned model (= the start of continued
    training) and the global model after each continued round ``1..T``. ``Δw_t = w_t − w_{t−1}``
    with ``w_0 = w_un``: the global update of round ``t``. Parameter vectors are all floating-point
    entries the original and unlearned dicts share (pass ``base_state(model)`` so plug-ins are
    left out; integer buffers such as BatchNorm counters are skipped). A zero update or a zero
    rollback vector makes the cosine undefined: ``nan``. Positive RT = moving back to ``w_ori``.
    """
    keys = sorted(k for k in original if k in unlearned and original[k].is_floating_point())
    if not keys:
        raise ValueError("original and unlearned state dicts share no floating-point tensors")
    for name in keys:
        if original[name].shape != unlearned[name].shape:
            raise ValueError(f"layer {name!r}: original and unlearned shapes differ")
    for t, state in enumerate(continued, start=1):
        missing = [k for k in keys if k not in state]
        if missing:
            raise ValueError(f"continued round {t} lacks layer {missing[0]!r}")
        for name in keys:
            if state[name].shape != original[name].shape:
                raise ValueError(f"layer {name!r}: shape differs in continued round {t}")
    rollback = _flat(original, keys) - _flat(unlearned, keys)
    previous = _flat(unlearned, keys)
    tendencies = []
    for state in continued:
        current = _flat(state, keys)
        tendencies.append(_cosine(current - previous, rollback))
        previous = current
    return tendencies


# ----------------------------------------------------------------------------- representation (V-D)

def forgetting_dispersion(features: torch.Tensor) -> float:
    """FD: mean squared Euclidean distance of each forget-set feature vector to their mean.

    ``features`` are the penultimate-layer features (``SplitModel.penultimate``) of the forget set,
    shape (n, d). Large FD = dispersed (trigger pattern "deconstructed"), small = compact cluster.
    """
    if features.dim() != 2 or features.shape[0] == 0:
        raise ValueError(f"features must have shape (n >= 1, d), got {tuple(features.shape)}")
    f = features.detach().double()
    return float(((f - f.mean(dim=0, keepdim=True)) ** 2).sum(dim=1).mean())


def pca_scatter_png(path: str | os.PathLike, features_by_model: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> str:
    """Fig. 9: one panel per model (e.g. original / retrained / unlearned), retain vs forget features.

    Each panel fits its own 2-component PCA (scikit-learn, full SVD, deterministic) on the union of
    that model's retain and forget features, so every model is shown in its own principal axes.
    Panel titles carry the forget set's FD (:func:`pca_scatter_figure`). The file is written atomically (temporary file in the
    same folder, then ``os.replace``); returns the path.
    """
    fig = pca_scatter_figure(features_by_model)

    target = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(target))
    os.makedirs(folder, exist_ok=True)
    fd_, tmp = tempfile.mkstemp(dir=folder, prefix=".pca-", suffix=".png")
    try:
        with os.fdopen(fd_, "wb") as handle:
            fig.savefig(handle, format="png", bbox_inches="tight")
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return target


def pca_scatter_figure(features_by_model: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Figure:
    """The figure of :func:`pca_scatter_png`: one panel per model, retained points grey under forget
    points red, one legend right of the panels (never over a point), a title saying what is shown."""
    from tasks.plot_style import FORGET_COLOUR, RETAINED_COLOUR

    if not features_by_model:
        raise ValueError("features_by_model must name at least one model")
    projected = {}
    for name, (retain, forget) in features_by_model.items():
        if retain.dim() != 2 or forget.dim() != 2 or retain.shape[1] != forget.shape[1]:
            raise ValueError(f"model {name!r}: retain and forget features must be (n, d) with the same d")
        both = torch.cat([retain, forget]).detach().double().cpu().numpy()
        if both.shape[0] < 2 or both.shape[1] < 2:
            raise ValueError(f"model {name!r}: PCA to 2-D needs >= 2 samples and >= 2 feature dims")
        coords = PCA(n_components=2, svd_solver="full").fit_transform(both)
        fd = forgetting_dispersion(forget) if len(forget) else math.nan
        projected[name] = (coords[: len(retain)], coords[len(retain) :], fd)

    fig = Figure(figsize=(3.6 * len(projected) + 1.6, 3.9), dpi=100, layout="constrained")
    axes = fig.subplots(1, len(projected), squeeze=False)[0]
    for ax, (name, (ret, fgt, fd)) in zip(axes, projected.items()):
        ax.scatter(ret[:, 0], ret[:, 1], s=7, c=RETAINED_COLOUR, alpha=0.45, linewidths=0, zorder=2,
                   label="retained data")
        ax.scatter(fgt[:, 0], fgt[:, 1], s=9, c=FORGET_COLOUR, alpha=0.85, linewidths=0, zorder=3,
                   label="forget set")
        ax.set_title(f"{name} model (FD={fd:.3g})", fontsize=10)
        ax.set_xlabel("PC1")
        ax.set_ylabel("PC2")
        ax.grid(alpha=0.2)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small", frameon=False, markerscale=2.0)
    fig.suptitle("Penultimate-layer features, 2-D PCA per model: retained (grey) vs forget (red); "
                 "FD = forget-set dispersion", fontsize=10)
    return fig


# ----------------------------------------------------------------------------- LMC (Fig. 11)

def interpolate_states(start: StateDict, end: StateDict, alpha: float) -> StateDict:
    """``(1 − α) start + α end`` for floating-point tensors; other entries (counters) come from ``start``."""
    if set(start) != set(end):
        odd = sorted(set(start) ^ set(end))[0]
        raise ValueError(f"layer {odd!r} is in only one of the two state dicts")
    out = {}
    for name, a in start.items():
        b = end[name]
        if a.shape != b.shape:
            raise ValueError(f"layer {name!r}: shapes differ between the two state dicts")
        if a.is_floating_point():
            out[name] = torch.lerp(a.detach(), b.detach().to(a.dtype), alpha)
        else:
            out[name] = a.detach().clone()
    return out


def lmc_barrier(loss_at: Callable[[float], float], num_points: int = 11) -> dict[str, float | list[float]]:
    """Forget-set loss along the linear path ``w(α) = (1 − α) w_un + α w_rec`` and its barrier.

    ``loss_at(α)`` evaluates the model at ``w(α)`` (build it with :func:`interpolate_states`) on the
    unlearning set. ``α`` runs over ``num_points`` evenly spaced values in [0, 1]. The barrier is
    ``max_α [L(α) − ((1 − α) L(0) + α L(1))]`` (Frankle et al.'s definition; Lethe only plots the
    path): > 0 means a loss hill separates the unlearned model from the recovered one.
    Returns ``{"alphas", "losses", "barrier"}``.
    """
    if num_points < 2:
        raise ValueError(f"num_points must be >= 2 (both end points), got {num_points}")
    alphas = [i / (num_points - 1) for i in range(num_points)]
    losses = [float(loss_at(a)) for a in alphas]
    start, end = losses[0], losses[-1]
    barrier = max(loss - ((1 - a) * start + a * end) for a, loss in zip(alphas, losses))
    return {"alphas": alphas, "losses": losses, "barrier": barrier}
