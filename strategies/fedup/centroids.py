"""Client side of FedUP (the FedUP paper, sec. 3.2.2): features -> per-class KMeans centroids -> noise.

A client never uploads raw features. It summarises each class ``k`` of its features by
``K = ceil(rho * n_k)`` KMeans centroids (eq. 9-10) and adds isotropic Gaussian noise to every
centroid (eq. 11). Optionally (``fedup.clip``, not in the paper) every feature vector is first
clipped to an L2 bound, which the clip-based sensitivity bounds of ``strategies/fedup/maths.py``
need. In the class scenario the paper relabels the forgotten class's features to other classes
before clustering (:func:`relabel_per_class`; official code: one random other class per client).

Choices the paper leaves open:

* **KMeans as in the official code**: random initial centres, 5 restarts, at most 100 iterations,
  the run with the lowest inertia kept (scikit-learn ``KMeans(init="random", n_init=5,
  max_iter=100, random_state=seed)``, float64). A class with ``K = 1`` gives its mean.
* **Centroid = exact mean of its cluster.** After KMeans each centroid is recomputed as the mean
  of the points assigned to it, and ``counts`` gives that cluster size (what a per-cluster DP
  bound needs; the official code keeps KMeans's last centres, the means of the previous
  assignment).
* **Tiny or degenerate classes.** ``K`` is capped at the number of *distinct* points of the class.
  When ``K`` equals that number the centroids are the distinct points themselves (with their
  multiplicities as counts), which is what KMeans would return, without running it.
* :func:`relabel_forget_rows` and :func:`divert_targets` serve ``fedup.forget-centroids=divert``
  (not the paper's): flagged forget centroids are pointed away from their label on the server.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from sklearn.cluster import KMeans


def clip_rows(features: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale every row with L2 norm above ``bound`` down to norm ``bound``; other rows are untouched.

    ``x -> x * min(1, bound / ||x||_2)`` (the setting ``fedup.clip``; ``inf`` leaves every row as it
    is). Returns a new tensor.
    """
    if not bound > 0:
        raise ValueError(f"fedup.clip must be > 0, got {bound}")
    if features.ndim != 2:
        raise ValueError(f"features must be 2-D (n, d), got shape {tuple(features.shape)}")
    if math.isinf(bound):
        return features.clone()
    norms = features.norm(dim=1, keepdim=True)
    scaled = features * (bound / norms.clamp_min(torch.finfo(features.dtype).tiny))
    return torch.where(norms > bound, scaled, features)


def add_gaussian_noise(centroids: torch.Tensor, sigma: float, seed: int) -> torch.Tensor:
    """Eq. 11: ``centroid + z`` with ``z ~ N(0, sigma^2 I)`` drawn from a generator seeded by ``seed``.

    ``sigma == 0`` returns an unchanged copy.
    """
    if not sigma >= 0:
        raise ValueError(f"fedup.sigma must be >= 0, got {sigma}")
    if sigma == 0:
        return centroids.clone()
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(centroids.shape, generator=generator, dtype=centroids.dtype)
    return centroids + sigma * noise.to(centroids.device)


def feature_diameter(features: torch.Tensor, block: int = 2048) -> float:
    """``max_{p,q} ||d_p - d_q||_2`` over the rows of ``features`` (paper eq. 21's numerator); 0 for one row.

    Computed in blocks of ``block`` rows, in float64, so memory stays ``O(block * n)``.
    """
    if features.ndim != 2:
        raise ValueError(f"features must be 2-D (n, d), got shape {tuple(features.shape)}")
    points = features.detach().cpu().to(torch.float64)
    best = 0.0
    for start in range(0, len(points), block):
        best = max(best, float(torch.cdist(points[start:start + block], points).max()))
    return best


def relabel_per_class(labels: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor:
    """The official code's class-scenario relabelling: every distinct label ``k`` in ``labels`` becomes one
    uniformly random *other* class, the same for all rows of ``k`` (one draw per client and class).

    The relabelled features are then clustered together with the retained features of their new
    class (paper sec. 4.2: the target class's feature labels are remapped to other classes; across
    clients, to several). Returns a new tensor.
    """
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2 to relabel, got {num_classes}")
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    rng = np.random.default_rng(seed)
    relabelled = labels.clone()
    for k in sorted(set(labels.tolist())):
        draw = int(rng.integers(0, num_classes - 1))
        relabelled[labels == k] = draw + int(draw >= k)
    return relabelled


def class_centroids(
    features: torch.Tensor, labels: torch.Tensor, *, rho: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-class KMeans summary of a client's (clipped) features, eq. 9-10.

    For every class ``k`` present in ``labels`` (ascending), ``K = min(ceil(rho * n_k), distinct
    points of k)`` centroids. Returns ``(centroids (M, d), centroid_labels (M,), counts (M,))`` where
    ``counts[i]`` is the number of input points averaged into ``centroids[i]`` (sums to ``n``).
    Centroids keep the dtype and device of ``features``.
    """
    if not 0 < rho <= 1:
        raise ValueError(f"fedup.rho must be in (0, 1], got {rho}")
    if features.ndim != 2 or labels.ndim != 1 or features.shape[0] != labels.shape[0]:
        raise ValueError(
            f"features must be (n, d) and labels (n,), got {tuple(features.shape)} and {tuple(labels.shape)}"
        )
    if features.shape[0] == 0:
        raise ValueError("features must hold at least one row")
    points_all = features.detach().cpu().to(torch.float64).numpy()
    labels_all = labels.detach().cpu().numpy()
    parts_c, parts_y, parts_n = [], [], []
    for k in np.unique(labels_all):
        points = points_all[labels_all == k]
        centres, counts = _cluster_one_class(points, math.ceil(rho * len(points)), seed)
        parts_c.append(centres)
        parts_y.append(np.full(len(centres), k, dtype=np.int64))
        parts_n.append(counts)
    centroids = torch.from_numpy(np.concatenate(parts_c)).to(dtype=features.dtype, device=features.device)
    centroid_labels = torch.from_numpy(np.concatenate(parts_y)).to(labels.device)
    counts = torch.from_numpy(np.concatenate(parts_n))
    return centroids, centroid_labels, counts


def _cluster_one_class(points: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Centroids (exact cluster means) and cluster sizes of one class; see the module docstring."""
    distinct, multiplicity = np.unique(points, axis=0, return_counts=True)
    k = min(k, len(distinct))
    if k == len(distinct):
        return distinct, multiplicity.astype(np.int64)
    if k == 1:
        return points.mean(axis=0, keepdims=True), np.array([len(points)], dtype=np.int64)
    assignment = KMeans(n_clusters=k, init="random", n_init=5, max_iter=100, random_state=seed).fit_predict(points)
    counts = np.bincount(assignment, minlength=k)
    kept = np.flatnonzero(counts)  # KMeans relocates empty clusters, but never trust it blindly
    sums = np.zeros((k, points.shape[1]))
    np.add.at(sums, assignment, points)
    return sums[kept] / counts[kept, None], counts[kept].astype(np.int64)


def _check_rows(labels: torch.Tensor, forget_mask: torch.Tensor, num_classes: int) -> None:
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2 to divert labels, got {num_classes}")
    if forget_mask.shape != labels.shape or forget_mask.dtype != torch.bool:
        raise ValueError("forget_mask must be a bool tensor shaped like labels")
    if bool(((labels < 0) | (labels >= num_classes)).any()):
        raise ValueError(f"labels must lie in [0, {num_classes})")


def relabel_forget_rows(labels: torch.Tensor, forget_mask: torch.Tensor, num_classes: int,
                        seed: int) -> torch.Tensor:
    """``fedup.targets=random`` (with ``divert``): every masked row's label becomes a uniformly random *other*
    class, one draw per row (per flagged centroid, on the server).

    Draws ``u ~ U{0, ..., num_classes - 2}`` per masked row and maps ``u -> u + (u >= label)``, so
    the result never equals the row's own label. Other labels are unchanged. Returns a new tensor.
    """
    _check_rows(labels, forget_mask, num_classes)
    generator = torch.Generator().manual_seed(seed)
    draws = torch.randint(0, num_classes - 1, (int(forget_mask.sum()),), generator=generator)
    own = labels[forget_mask].cpu()
    relabelled = labels.clone()
    relabelled[forget_mask] = (draws + (draws >= own).long()).to(device=labels.device, dtype=labels.dtype)
    return relabelled


def divert_targets(labels: torch.Tensor, forget_mask: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Soft targets ``(M, num_classes)``: one-hot rows, except masked rows = uniform over the *other* classes.

    This is the expectation of :func:`relabel_forget_rows`'s random draw, so the filter's
    cross-entropy has the same expected value, without the draw's variance. With hard random labels
    the filter learns to send neighbouring forget centroids to different classes; trained long, it
    carves the forget region into pieces and fresh forget samples between the pieces fall back to
    the forgotten label (measured on Gaussian blobs after 500 Adam epochs: forget accuracy 0.18-0.47
    with random labels, 0.00-0.06 with these targets). ``fedup.targets=soft``; not the paper's.
    """
    _check_rows(labels, forget_mask, num_classes)
    targets = torch.nn.functional.one_hot(labels.long(), num_classes).float()
    spread = (1.0 - targets[forget_mask]) / (num_classes - 1)
    targets[forget_mask] = spread
    return targets
