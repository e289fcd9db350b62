"""FedUP's server-side math (the FedUP paper, sec. 3.2.2-3.2.4): DP calibration, centroid checks, eq. 12.

Pure functions on tensors / floats; no Flower, no datasets.

DP mechanism. A client releases its KMeans centroids plus ``N(0, sigma^2 I)`` noise on every
coordinate (eq. 11), once (FedUP is one-shot: no composition). ``sigma`` is calibrated to a target
``(epsilon, delta)`` at an L2 sensitivity ``D``:

* Neighbouring datasets: **replace one record** (same size), the relation under which the paper's
  eq. 21 (a diameter over a count) is a sensitivity; it keeps every cluster size fixed.
* ``bound="eq21"`` (the paper, the default): ``D = max_{p,q} ||d_p - d_q|| / n_i``, the client's
  feature diameter over its sample count (eq. 21), with ``delta = 1/n_i``. This is the sensitivity
  of *one mean over all n_i points*; a centroid averages only its cluster's ``n_c <= n_i`` points,
  and the diameter is measured on the data itself, so the guarantee is the paper's nominal one, not
  a proof for KMeans as run (it understates epsilon by up to ``n_i / n_c``).
* ``bound="fixed-clusters"``: features clipped to ``C`` (``fedup.clip``); the assignment treated as
  fixed, a replaced record moves only its own centroid, by at most ``2C / n_c``:
  ``D = 2C / min_c n_c``. Still not a guarantee for data-dependent KMeans.
* ``bound="any-clustering"`` (safe): every centroid is a mean of points in B(0, C), hence in
  B(0, C), whatever the assignment; each of the ``M`` centroids moves by at most ``2C`` and the
  release by at most ``2C * sqrt(M)`` (``M`` and the per-class counts treated as public).

Calibration uses the exact ("analytic") Gaussian mechanism of Balle & Wang (2018) as implemented
in ``dp_accounting.get_sigma_gaussian`` / ``get_epsilon_gaussian`` (unit sensitivity, scaled
here): the smallest ``sigma`` with ``delta(epsilon) = Phi(D/2s - eps s/D) - e^eps Phi(-D/2s - eps s/D)``
at most the target. At epsilon = 10 it asks for more noise than the paper's classical formula
``sqrt(2 ln(1.25/delta)) D / epsilon`` (valid only for epsilon < 1); :func:`paper_eq22_epsilon`
reports the paper's eq. 22 figure beside the calibrated one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

SENSITIVITY_BOUNDS = ("eq21", "fixed-clusters", "any-clustering")


def centroid_sensitivity(clip: float, counts: torch.Tensor | Sequence[int], *, bound: str = "fixed-clusters",
                         diameter: float | None = None) -> float:
    """L2 sensitivity of one client's centroid release under replace-one adjacency (module docstring).

    ``eq21``: ``diameter / sum(counts)`` (``diameter``: the client's feature diameter, required);
    ``fixed-clusters``: ``2 * clip / min(counts)``; ``any-clustering``: ``2 * clip * sqrt(len(counts))``.
    """
    sizes = torch.as_tensor(counts)
    if sizes.ndim != 1 or sizes.numel() == 0 or bool((sizes <= 0).any()):
        raise ValueError("counts must be a non-empty 1-D sequence of positive cluster sizes")
    if bound == "eq21":
        if diameter is None or not (0 < diameter < math.inf):
            raise ValueError(f"the eq21 bound needs a finite feature diameter > 0, got {diameter}")
        return float(diameter) / int(sizes.sum())
    if bound not in SENSITIVITY_BOUNDS:
        raise ValueError(f"bound must be one of {', '.join(SENSITIVITY_BOUNDS)}, got {bound!r}")
    if not (0 < clip < math.inf):
        raise ValueError(f"fedup.clip must be > 0 and finite for the {bound} bound, got {clip}")
    if bound == "fixed-clusters":
        return 2.0 * clip / int(sizes.min())
    return 2.0 * clip * math.sqrt(sizes.numel())


def resolve_delta(delta: float, n: int) -> float:
    """The DP target's delta: ``fedup.delta``, or ``1 / n`` (paper sec. 3.2.4, ``delta_i = 1/n_i``) when it is 0."""
    if delta:
        return delta
    if n < 2:
        raise ValueError(f"delta = 1/n needs n >= 2 released samples, got {n}")
    return 1.0 / n


def calibrate_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """Smallest Gaussian noise std giving (epsilon, delta)-DP at this L2 sensitivity (analytic Gaussian).

    ``epsilon = inf`` means no privacy target and returns 0.
    """
    _check_privacy_target(epsilon, delta, sensitivity)
    if math.isinf(epsilon):
        return 0.0
    from dp_accounting import get_sigma_gaussian  # 1.8 s to import: only when noise is calibrated

    return sensitivity * float(get_sigma_gaussian(epsilon, delta))


def epsilon_spent(sigma: float, delta: float, sensitivity: float) -> float:
    """Exact epsilon of the Gaussian mechanism with std ``sigma`` at ``delta`` (inverse of calibrate_sigma).

    ``sigma = 0`` (no noise) spends ``inf``.
    """
    if not sigma >= 0:
        raise ValueError(f"fedup.sigma must be >= 0, got {sigma}")
    _check_privacy_target(1.0, delta, sensitivity)
    if sigma == 0:
        return math.inf
    from dp_accounting import get_epsilon_gaussian  # as in calibrate_sigma: only with noise

    return float(get_epsilon_gaussian(sigma / sensitivity, delta))


def classical_sigma(epsilon: float, delta: float, sensitivity: float) -> float:
    """The classical bound ``sqrt(2 ln(1.25/delta)) * sensitivity / epsilon`` (valid for epsilon < 1)."""
    _check_privacy_target(epsilon, delta, sensitivity)
    return math.sqrt(2.0 * math.log(1.25 / delta)) * sensitivity / epsilon


def paper_eq22_epsilon(sigma: float, n: int, sensitivity: float) -> float:
    """Paper eq. 22: ``sqrt(2 ln(1.25 n)) * sensitivity / sigma`` (delta = 1/n); ``inf`` when sigma = 0."""
    if not sigma >= 0:
        raise ValueError(f"fedup.sigma must be >= 0, got {sigma}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    if not sensitivity > 0:
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    if sigma == 0:
        return math.inf
    return math.sqrt(2.0 * math.log(1.25 * n)) * sensitivity / sigma


def _check_privacy_target(epsilon: float, delta: float, sensitivity: float) -> None:
    if not epsilon > 0:
        raise ValueError(f"fedup.epsilon must be > 0, got {epsilon}")
    if not 0 < delta < 1:
        raise ValueError(f"fedup.delta must be in (0, 1), got {delta}")
    if not (sensitivity > 0 and math.isfinite(sensitivity)):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity}")


def aggregate_centroids(
    uploads: Sequence[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 12: the global centroid set is the concatenation of every client's (centroids, labels)."""
    if len(uploads) == 0:
        raise ValueError("uploads must hold at least one (centroids, labels) pair")
    centroids = torch.cat([torch.as_tensor(c) for c, _ in uploads], dim=0)
    labels = torch.cat([torch.as_tensor(y).long() for _, y in uploads], dim=0)
    return centroids, labels


def validate_centroid_upload(
    centroids: torch.Tensor | np.ndarray, labels: torch.Tensor | np.ndarray, *, feature_dim: int, num_classes: int
) -> str | None:
    """Why this client upload must be rejected (one line), or ``None`` when it is usable."""
    c, y = torch.as_tensor(centroids), torch.as_tensor(labels)
    if c.ndim != 2:
        return f"centroids must be 2-D (M, {feature_dim}), got shape {tuple(c.shape)}"
    if y.ndim != 1:
        return f"labels must be 1-D (M,), got shape {tuple(y.shape)}"
    if c.shape[0] == 0:
        return "upload holds no centroids"
    if c.shape[1] != feature_dim:
        return f"centroid width {c.shape[1]} != feature dim {feature_dim}"
    if y.shape[0] != c.shape[0]:
        return f"{c.shape[0]} centroids but {y.shape[0]} labels"
    if not c.is_floating_point():
        return f"centroids must be floating point, got {c.dtype}"
    if not bool(torch.isfinite(c).all()):
        return "centroids contain NaN or Inf"
    if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
        return f"labels must be integers, got {y.dtype}"
    if bool(((y < 0) | (y >= num_classes)).any()):
        return f"labels outside [0, {num_classes})"
    return None
