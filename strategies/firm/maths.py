"""Server-side math of FIRM (Fisher-Informed Retention Merging), as pure functions on tensors.

Pipeline (the FIRM paper, Sec. 4.2 and Appendix B/C), applied per named tensor:

1. ``pool_by_domain``: forget clients of one domain are pooled by the plain mean of their task
   vectors and of their raw Fisher diagonals. Retain clients are never pooled (each keeps its own
   constraint).
2. ``normalise_and_sparsify``: every pooled forget Fisher and every retain Fisher is divided by its own
   maximum plus ``eps0`` and then keeps only the entries >= the ``max(1, floor(alpha*d))``-th largest
   value (ties kept); the rest become zero.
3. ``firm_merge``: role-wise Fisher-weighted averages

       D_F = sum_g F_g * tau_g / (sum_g F_g + eps0)      (forget domains g)
       D_R = sum_k F_k * tau_k / (sum_k F_k + eps0)      (retain clients k)
       base = gamma * (D_F + D_R)

   Each role's coordinate weights F_g / (sum F + eps0) are non-negative and sum to < 1, so neither term
   can exceed the largest contributing magnitude at a coordinate, however many clients there are.
   The two roles are *added*: forget task vectors were trained with an unlearning objective (they
   already point in the forgetting direction) and retain task vectors with a preservation objective;
   the paper's "dense uniform" control is likewise "the six-forget mean plus the retain update", and
   its Sec. 6 calls both "role-specific terms" of the one base merge (4). gamma scales the sum.

Step 4, the retention-constrained projection, is ``strategies.firm.projection``.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import torch

TensorDict = dict[str, torch.Tensor]

# --------------------------------------------------------------------------------------------- checks


def check_alpha(alpha: float) -> None:
    """Top-alpha fraction must lie in (0, 1]."""
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
        raise ValueError(f"firm.alpha must be in (0, 1], got {alpha!r}")


def check_eps0(eps0: float) -> None:
    """Stabiliser eps0 must be a finite positive number."""
    if not (isinstance(eps0, (int, float)) and math.isfinite(eps0) and eps0 > 0.0):
        raise ValueError(f"firm.eps0 must be a finite number > 0, got {eps0!r}")


def check_epsilon(epsilon: float) -> None:
    """Retention budget must be > 0 (``inf`` disables the projection)."""
    if not (isinstance(epsilon, (int, float)) and not math.isnan(epsilon) and epsilon > 0.0):
        raise ValueError(f"firm.epsilon must be > 0 (inf disables the projection), got {epsilon!r}")


def check_gamma(gamma: float) -> None:
    """Merge scale must be finite and >= 0."""
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0.0):
        raise ValueError(f"firm.gamma must be a finite number >= 0, got {gamma!r}")


def check_fisher(fisher: torch.Tensor, name: str = "fisher") -> None:
    """A Fisher diagonal is a tensor of finite, non-negative entries."""
    if not torch.is_tensor(fisher):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(fisher).__name__}")
    if not bool(torch.isfinite(fisher).all()):
        raise ValueError(f"{name} must have finite entries (found NaN or inf)")
    if bool((fisher < 0).any()):
        raise ValueError(f"{name} must be non-negative (a Fisher diagonal), found negative entries")


def check_same_shape(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    """Task vector, Fisher and model tensor of one name must have one shape."""
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"{what}: shapes differ, {tuple(a.shape)} vs {tuple(b.shape)}")


def validate_upload(
    task_vector: Mapping[str, torch.Tensor],
    fisher: Mapping[str, torch.Tensor],
    expected_shapes: Mapping[str, Sequence[int]],
) -> str | None:
    """Reason to drop one client's (task vector, Fisher) upload, or ``None`` when it is well formed.

    Well formed: both dicts have exactly the keys of ``expected_shapes``, every tensor has the expected
    shape, the task vector is finite and the Fisher is finite and non-negative.
    """
    expected = set(expected_shapes)
    for label, upload in (("task vector", task_vector), ("fisher", fisher)):
        keys = set(upload)
        if keys != expected:
            missing, extra = sorted(expected - keys), sorted(keys - expected)
            return f"{label} keys differ from the model: missing {missing[:3]}, unexpected {extra[:3]}"
    for name, shape in expected_shapes.items():
        tv, fi = task_vector[name], fisher[name]
        for label, tensor in (("task vector", tv), ("fisher", fi)):
            if not torch.is_tensor(tensor):
                return f"{label} {name!r} is not a tensor"
            if tuple(tensor.shape) != tuple(shape):
                return f"{label} {name!r} has shape {tuple(tensor.shape)}, expected {tuple(shape)}"
        if not bool(torch.isfinite(tv).all()):
            return f"task vector {name!r} has NaN or inf entries"
        if not bool(torch.isfinite(fi).all()):
            return f"fisher {name!r} has NaN or inf entries"
        if bool((fi < 0).any()):
            return f"fisher {name!r} has negative entries"
    return None


# ------------------------------------------------------------------------------ pooling / normalising


def _mean_dicts(dicts: Sequence[Mapping[str, torch.Tensor]]) -> TensorDict:
    names = list(dicts[0])
    for d in dicts[1:]:
        if set(d) != set(names):
            raise ValueError("client uploads must share tensor names to be pooled")
    out: TensorDict = {}
    for name in names:
        acc = dicts[0][name].to(torch.float32).clone()
        for d in dicts[1:]:
            check_same_shape(acc, d[name], f"tensor {name!r} of pooled clients")
            acc += d[name].to(torch.float32)
        out[name] = acc / len(dicts)
    return out


def pool_by_domain(
    task_vectors: Sequence[Mapping[str, torch.Tensor]],
    fishers: Sequence[Mapping[str, torch.Tensor]],
    domains: Sequence[Hashable],
) -> tuple[dict[Hashable, TensorDict], dict[Hashable, TensorDict]]:
    """Mean task vector and mean *raw* Fisher per forget domain (paper eq. 2, Appendix C).

    Returns two dicts keyed by domain in order of first appearance. Pooling precedes normalisation and
    sparsification (they do not commute).
    """
    if not (len(task_vectors) == len(fishers) == len(domains)) or not domains:
        raise ValueError("pool_by_domain needs one task vector, one Fisher and one domain per client (>= 1)")
    groups: dict[Hashable, list[int]] = {}
    for i, domain in enumerate(domains):
        groups.setdefault(domain, []).append(i)
    pooled_tv = {g: _mean_dicts([task_vectors[i] for i in idx]) for g, idx in groups.items()}
    pooled_fi = {g: _mean_dicts([fishers[i] for i in idx]) for g, idx in groups.items()}
    return pooled_tv, pooled_fi


def _normalise_and_sparsify_tensor(fisher: torch.Tensor, alpha: float, eps0: float) -> torch.Tensor:
    check_fisher(fisher)
    flat = fisher.reshape(-1).to(torch.float32)
    normalised = flat / (flat.max() + eps0)
    d = normalised.numel()
    keep = max(1, math.floor(alpha * d))
    threshold = torch.kthvalue(normalised, d - keep + 1).values
    sparse = torch.where(normalised >= threshold, normalised, torch.zeros_like(normalised))
    return sparse.reshape(fisher.shape)


def normalise_and_sparsify(fisher, alpha: float, eps0: float):
    """Divide a Fisher by its maximum plus ``eps0`` and keep its Top-``alpha*d`` entries (paper eq. 3).

    Kept: entries >= the ``max(1, floor(alpha*d))``-th largest normalised value, ties included; others
    are set to 0. Accepts one tensor or a ``{name: tensor}`` dict (each tensor handled on its own, with
    its own ``d``). Returns float32.
    """
    check_alpha(alpha)
    check_eps0(eps0)
    if torch.is_tensor(fisher):
        return _normalise_and_sparsify_tensor(fisher, alpha, eps0)
    return {name: _normalise_and_sparsify_tensor(t, alpha, eps0) for name, t in fisher.items()}


# --------------------------------------------------------------------------------------------- merge


def fisher_weighted_average(
    task_vectors: Sequence[torch.Tensor], fishers: Sequence[torch.Tensor], eps0: float
) -> torch.Tensor:
    """``sum_i F_i * tau_i / (sum_i F_i + eps0)`` coordinate-wise, for one tensor name.

    The weights ``F_i / (sum F + eps0)`` are >= 0 and sum to < 1, so the result is bounded by the
    largest ``|tau_i|`` at each coordinate. An empty list gives no update (the caller passes a shape via
    a non-empty list or handles the empty role itself).
    """
    check_eps0(eps0)
    if len(task_vectors) != len(fishers) or not task_vectors:
        raise ValueError("fisher_weighted_average needs as many Fishers as task vectors (>= 1)")
    numerator = torch.zeros(task_vectors[0].shape, dtype=torch.float32, device=task_vectors[0].device)
    denominator = torch.zeros_like(numerator)
    for tau, fisher in zip(task_vectors, fishers):
        check_same_shape(tau, fisher, "task vector and Fisher")
        check_same_shape(tau, numerator, "task vectors of one tensor")
        f = fisher.to(numerator)
        numerator.addcmul_(f, tau.to(numerator))
        denominator += f
    return numerator / (denominator + eps0)


def firm_merge(
    forget_task_vectors: Sequence[Mapping[str, torch.Tensor]],
    forget_fishers: Sequence[Mapping[str, torch.Tensor]],
    forget_domains: Sequence[Hashable],
    retain_task_vectors: Sequence[Mapping[str, torch.Tensor]],
    retain_fishers: Sequence[Mapping[str, torch.Tensor]],
    gamma: float,
    alpha: float = 0.1,
    eps0: float = 1e-8,
) -> tuple[TensorDict, dict[str, list[torch.Tensor]]]:
    """FIRM base merge ``gamma * (D_F + D_R)`` per tensor name (paper eq. 4).

    Forget uploads are pooled per domain, then every pooled forget Fisher and every retain Fisher is
    normalised and sparsified (``alpha``, ``eps0``). Returns ``(base, retain_constraints)`` where
    ``retain_constraints[name]`` is the list of sparsified retain Fishers for that tensor, ready for
    ``project``. At least one forget client is required; retain clients may be absent (D_R = 0).
    """
    check_gamma(gamma)
    check_alpha(alpha)
    check_eps0(eps0)
    if len(retain_task_vectors) != len(retain_fishers):
        raise ValueError("firm_merge needs one Fisher per retain task vector")
    pooled_tv, pooled_fi = pool_by_domain(forget_task_vectors, forget_fishers, forget_domains)
    domains = list(pooled_tv)
    forget_sparse = {g: normalise_and_sparsify(pooled_fi[g], alpha, eps0) for g in domains}
    retain_sparse = [normalise_and_sparsify(dict(f), alpha, eps0) for f in retain_fishers]
    base: TensorDict = {}
    constraints: dict[str, list[torch.Tensor]] = {}
    for name in pooled_tv[domains[0]]:
        d_forget = fisher_weighted_average(
            [pooled_tv[g][name] for g in domains], [forget_sparse[g][name] for g in domains], eps0
        )
        merged = d_forget
        if retain_task_vectors:
            merged = merged + fisher_weighted_average(
                [tv[name] for tv in retain_task_vectors], [f[name] for f in retain_sparse], eps0
            )
        base[name] = gamma * merged
        constraints[name] = [f[name] for f in retain_sparse]
    return base, constraints
