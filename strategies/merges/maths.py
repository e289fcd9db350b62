"""Task-vector merge baselines FIRM is compared with (the FIRM paper, Sec. 5 "Baselines", App. C, D.2).

Every function takes a list of task-vector dicts ``{name: tensor}`` (same names and shapes) and the
sweep key ``scale``, and returns one merged dict (float32):

- ``avg_merge``:  scale * mean_i tau_i.
- ``sum_merge``:  scale * sum_i tau_i.
- ``ties_merge``: TIES-Merging (Yadav et al., 2023): trim each tau_i to its top-``density`` entries by
  magnitude, elect per coordinate the sign of the summed trimmed values (the sign with the larger total
  magnitude), average the trimmed values that agree with the elected sign (disjoint mean; zero-valued
  entries are not counted), times scale. Trimming is per tensor (as PEFT's implementation does), not
  over the whole flattened model; ties at the threshold are kept.
- ``fulm_merge``: FULM (Zhong et al., 2025) as FIRM's paper describes it: cluster the flattened task
  vectors by cosine similarity at ``threshold`` (0.6), TIES (``density`` 0.3, unit scale) inside each
  cluster, and the *sum* of the cluster centroids times scale (``inter='mean'`` gives the paper's
  FULM-MEAN control of App. D.2). The clustering rule is not given in the paper; we take the
  connected components of the graph "cosine >= threshold" (single linkage): deterministic and
  independent of client order.

Which task vectors to pass is the caller's choice; in the paper AVG gets forget and retain vectors,
SUM and TIES only forget vectors, FULM all of them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch

TensorDict = dict[str, torch.Tensor]


def _check_inputs(task_vectors: Sequence[Mapping[str, torch.Tensor]], scale: float) -> list[str]:
    if not task_vectors:
        raise ValueError("merge needs at least one task vector")
    if not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"merge-scale must be a finite number, got {scale!r}")
    names = list(task_vectors[0])
    for tv in task_vectors[1:]:
        if set(tv) != set(names):
            raise ValueError("merge: all task vectors must have the same tensor names")
        for name in names:
            if tuple(tv[name].shape) != tuple(task_vectors[0][name].shape):
                raise ValueError(f"merge: tensor {name!r} has different shapes across task vectors")
    return names


def _check_fraction(value: float, key: str) -> None:
    if not (isinstance(value, (int, float)) and 0.0 < value <= 1.0):
        raise ValueError(f"{key} must be in (0, 1], got {value!r}")


def avg_merge(task_vectors: Sequence[Mapping[str, torch.Tensor]], scale: float = 1.0) -> TensorDict:
    """``scale * mean_i tau_i`` per tensor."""
    names = _check_inputs(task_vectors, scale)
    return {n: scale * torch.stack([tv[n].to(torch.float32) for tv in task_vectors]).mean(0) for n in names}


def sum_merge(task_vectors: Sequence[Mapping[str, torch.Tensor]], scale: float = 1.0) -> TensorDict:
    """``scale * sum_i tau_i`` per tensor."""
    names = _check_inputs(task_vectors, scale)
    return {n: scale * torch.stack([tv[n].to(torch.float32) for tv in task_vectors]).sum(0) for n in names}


def trim_top_k(tensor: torch.Tensor, density: float) -> torch.Tensor:
    """Keep entries whose magnitude is >= the ``max(1, floor(density*d))``-th largest (ties kept)."""
    _check_fraction(density, "ties.density")
    flat = tensor.reshape(-1).to(torch.float32)
    keep = max(1, math.floor(density * flat.numel()))
    threshold = torch.kthvalue(flat.abs(), flat.numel() - keep + 1).values
    return torch.where(flat.abs() >= threshold, flat, torch.zeros_like(flat)).reshape(tensor.shape)


def _ties_tensor(tensors: Sequence[torch.Tensor], density: float) -> torch.Tensor:
    trimmed = torch.stack([trim_top_k(t, density) for t in tensors])
    elected = torch.sign(trimmed.sum(0))
    agrees = (torch.sign(trimmed) == elected) & (trimmed != 0)
    count = agrees.sum(0)
    total = torch.where(agrees, trimmed, torch.zeros_like(trimmed)).sum(0)
    return torch.where(count > 0, total / count.clamp(min=1), torch.zeros_like(total))


def ties_merge(
    task_vectors: Sequence[Mapping[str, torch.Tensor]], scale: float = 1.0, density: float = 0.2
) -> TensorDict:
    """TIES: trim to top-``density`` magnitude, elect sign by summed values, disjoint mean; times scale."""
    names = _check_inputs(task_vectors, scale)
    _check_fraction(density, "ties.density")
    return {n: scale * _ties_tensor([tv[n] for tv in task_vectors], density) for n in names}


def cosine_similarity_matrix(task_vectors: Sequence[Mapping[str, torch.Tensor]]) -> torch.Tensor:
    """Pairwise cosine similarity of the flattened task vectors (all tensor names together), float64.

    A zero task vector has similarity 0 with every other one (and 1 with itself).
    """
    names = _check_inputs(task_vectors, 1.0)
    n = len(task_vectors)
    gram = torch.zeros(n, n, dtype=torch.float64)
    for name in names:
        flat = torch.stack([tv[name].reshape(-1).to(torch.float64) for tv in task_vectors])
        gram += (flat @ flat.T).cpu()
    norms = gram.diagonal().sqrt()
    denom = torch.outer(norms, norms)
    sim = torch.where(denom > 0, gram / denom.clamp(min=1e-300), torch.zeros_like(gram))
    sim.fill_diagonal_(1.0)
    return sim


def cluster_by_similarity(task_vectors: Sequence[Mapping[str, torch.Tensor]], threshold: float = 0.6) -> list[list[int]]:
    """Connected components of the graph with an edge where cosine similarity >= ``threshold``.

    Clusters are lists of indices, ordered by their smallest index.
    """
    if not (isinstance(threshold, (int, float)) and -1.0 <= threshold <= 1.0):
        raise ValueError(f"fulm.threshold must be in [-1, 1], got {threshold!r}")
    sim = cosine_similarity_matrix(task_vectors)
    n = sim.shape[0]
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            if sim[i, j] >= threshold:
                parent[root(j)] = root(i)
    clusters: dict[int, list[int]] = {}
    for i in range(n):
        clusters.setdefault(root(i), []).append(i)
    return sorted(clusters.values(), key=lambda c: c[0])


def fulm_merge(
    task_vectors: Sequence[Mapping[str, torch.Tensor]],
    scale: float = 1.0,
    threshold: float = 0.6,
    density: float = 0.3,
    inter: str = "sum",
) -> TensorDict:
    """FULM: similarity clusters, TIES inside each cluster, ``sum`` (or ``mean``) across; times scale."""
    names = _check_inputs(task_vectors, scale)
    _check_fraction(density, "fulm.density")
    if inter not in ("sum", "mean"):
        raise ValueError(f"fulm-inter must be 'sum' or 'mean', got {inter!r}")
    clusters = cluster_by_similarity(task_vectors, threshold)
    merged: TensorDict = {}
    for name in names:
        centroids = torch.stack([_ties_tensor([task_vectors[i][name] for i in c], density) for c in clusters])
        combined = centroids.sum(0) if inter == "sum" else centroids.mean(0)
        merged[name] = scale * combined
    return merged
