"""Server-side math of FIRM (Fisher-Informed Retention Merging), as pure functions on tensors.

Pipeline (paper 002, Sec. 4.2 and Appendix B/C), applied per named tensor:

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
4. ``project``: per tensor, the closest update (L2) to ``base`` such that for every retain client k the
   Fisher proxy ``b_k(x) = sum_j F_k(j) x_j^2 <= epsilon``. The Lagrangian minimiser for multipliers
   lambda >= 0 is ``x(lambda) = base / (1 + sum_k lambda_k F_k)``; the multipliers solve the concave dual

       g(lambda) = sum_j base_j^2 s_j / (1 + s_j) - epsilon * sum_k lambda_k,   s = sum_k lambda_k F_k,
       dg/dlambda_k = b_k(x(lambda)) - epsilon,
       d2g/dlambda_k dlambda_l = -2 sum_j base_j^2 F_k(j) F_l(j) / (1 + s_j)^3.

   m = 1 is solved on the scalar boundary equation b_1 = eps by a bracketing root finder (bisection
   safeguarding Newton and chord steps, valid because b_1 is convex decreasing); m > 1 by an exact
   dual solver (exact coordinate ascent sweeps + projected Newton with Armijo backtracking; multipliers
   may go down as well as up) that stops on a KKT certificate (see ``ProjectionReport``) or, reported
   there, at the iteration limit / rounding floor.

The solver works in float64 on the support where ``base != 0`` and some ``F_k > 0`` (elsewhere the
coordinate is untouched and contributes nothing to any b_k). Unlike the paper's implementation no extra
``eps0`` is added to the denominator ``1 + s``: it is >= 1 already.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import torch

TensorDict = dict[str, torch.Tensor]

_KKT_TOLERANCE = 1e-10
_MAX_ITERATIONS = 500
_MAX_SCALAR_EVALUATIONS = 200


# --------------------------------------------------------------------------------------------- checks


def check_alpha(alpha: float) -> None:
    """Top-alpha fraction must lie in (0, 1]."""
    if not (isinstance(alpha, (int, float)) and 0.0 < alpha <= 1.0):
        raise ValueError(f"firm-alpha must be in (0, 1], got {alpha!r}")


def check_eps0(eps0: float) -> None:
    """Stabiliser eps0 must be a finite positive number."""
    if not (isinstance(eps0, (int, float)) and math.isfinite(eps0) and eps0 > 0.0):
        raise ValueError(f"firm-eps0 must be a finite number > 0, got {eps0!r}")


def check_epsilon(epsilon: float) -> None:
    """Retention budget must be > 0 (``inf`` disables the projection)."""
    if not (isinstance(epsilon, (int, float)) and not math.isnan(epsilon) and epsilon > 0.0):
        raise ValueError(f"firm-epsilon must be > 0 (inf disables the projection), got {epsilon!r}")


def check_gamma(gamma: float) -> None:
    """Merge scale must be finite and >= 0."""
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0.0):
        raise ValueError(f"firm-gamma must be a finite number >= 0, got {gamma!r}")


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


# ---------------------------------------------------------------------------------------- projection


@dataclass(frozen=True)
class KKTResiduals:
    """Certificate of optimality of a projection (all dimensionless; 0 at the exact optimum).

    primal_infeasibility:     max_k max(0, b_k - eps) / eps
    complementary_slackness:  max_k lambda_k |b_k - eps| / ||base||^2  (each term is that constraint's
                              share of the duality gap, relative to the squared size of the base merge;
                              ``lambda_k |b_k - eps| / eps`` is not scale-free: lambda has units 1/F.
                              Since eps * sum_k lambda_k <= ||base||^2 at the dual optimum, this is
                              <= max_k |b_k - eps| / eps for every active constraint.)
    dual_infeasibility:       max_k max(0, -lambda_k)
    stationarity:             max_j |x_j (1 + sum_k lambda_k F_k(j)) - base_j| / max_j |base_j|
    """

    primal_infeasibility: float
    complementary_slackness: float
    dual_infeasibility: float
    stationarity: float

    def worst(self) -> float:
        return max(self.primal_infeasibility, self.complementary_slackness, self.dual_infeasibility, self.stationarity)


@dataclass(frozen=True)
class ProjectionReport:
    """Multipliers, proxy values ``damages`` (b_k at the returned x), KKT residuals, solver iterations."""

    lambdas: list[float]
    damages: list[float]
    residuals: KKTResiduals
    iterations: int


def proxy_damage(update: torch.Tensor, fisher: torch.Tensor) -> float:
    """Fisher perturbation proxy ``b(x) = sum_j F(j) x_j^2`` in float64."""
    check_same_shape(update, fisher, "update and Fisher")
    x = update.reshape(-1).to(torch.float64)
    return float((fisher.reshape(-1).to(torch.float64) * x * x).sum())


class _Dual:
    """The dual of one projection problem, restricted to the coordinates it can act on."""

    def __init__(self, base: torch.Tensor, fishers: list[torch.Tensor], epsilon: float):
        flat = base.reshape(-1).to(torch.float64)
        stacked = torch.stack([f.reshape(-1).to(device=flat.device, dtype=torch.float64) for f in fishers])
        support = (flat != 0) & (stacked.sum(0) > 0)
        self.b2 = flat[support].square()
        self.F = stacked[:, support].contiguous()
        self.epsilon = epsilon
        self.m = len(fishers)

    def s(self, lam: torch.Tensor) -> torch.Tensor:
        return lam @ self.F

    def value(self, lam: torch.Tensor) -> float:
        s = self.s(lam)
        return float((self.b2 * s / (1 + s)).sum()) - self.epsilon * float(lam.sum())

    def damages(self, lam: torch.Tensor) -> torch.Tensor:
        """b_k(x(lambda)) for every k (the dual gradient is this minus epsilon)."""
        return self.F @ (self.b2 / (1 + self.s(lam)).square())

    def hessian(self, lam: torch.Tensor) -> torch.Tensor:
        u = self.b2 / (1 + self.s(lam)).pow(3)
        return -2.0 * (self.F * u) @ self.F.T

    def maximise_coordinate(self, lam: torch.Tensor, k: int) -> tuple[torch.Tensor, int]:
        """Exact maximiser over lambda_k >= 0 with the others fixed: the root of b_k = eps, or 0.

        phi(t) = b_k(lambda with lambda_k = t) - eps is continuous, strictly decreasing and convex in t,
        so a Newton step from the infeasible end of the bracket never passes the root and the chord
        (regula falsi) root never falls short of it: both shrink the bracket [lo, hi] with phi(lo) > 0 >=
        phi(hi); a bisection midpoint is the fallback when rounding breaks that. The initial feasible
        end is hi = sqrt(sum_{F_k>0} base^2 / F_k / eps), since b_k(t) <= t^-2 sum base^2 / F_k.
        Returns the new multipliers with lambda_k = hi (the feasible side) and the evaluations used.
        """
        rest = 1 + self.s(lam) - lam[k] * self.F[k]
        fk, b2 = self.F[k], self.b2
        weighted = fk * b2

        def phi(t: float) -> tuple[float, float]:
            inv = 1.0 / (rest + t * fk)
            w = weighted * inv.square()
            return float(w.sum()) - self.epsilon, -2.0 * float((w * fk * inv).sum())

        out = lam.clone()
        phi_lo, slope_lo = phi(0.0)
        evaluations = 1
        if phi_lo <= 0:
            out[k] = 0.0
            return out, evaluations
        positive = fk > 0
        lo, hi = 0.0, math.sqrt(float((b2[positive] / fk[positive]).sum()) / self.epsilon)
        phi_hi, _ = phi(hi)
        evaluations += 1
        while hi - lo > 1e-15 * hi and phi_hi < -1e-13 * self.epsilon and evaluations < _MAX_SCALAR_EVALUATIONS:
            newton = lo - phi_lo / slope_lo
            chord = lo - phi_lo * (hi - lo) / (phi_hi - phi_lo)
            for t in (newton, chord):
                if not lo < t < hi:
                    t = 0.5 * (lo + hi)
                value, slope = phi(t)
                evaluations += 1
                if value > 0:
                    lo, phi_lo, slope_lo = t, value, slope
                else:
                    hi, phi_hi = t, value
        out[k] = hi
        return out, evaluations

    def residual(self, lam: torch.Tensor, damages: torch.Tensor, base_norm2: float) -> float:
        """Worst of primal infeasibility and complementary slackness at ``x(lambda)``."""
        primal = float(torch.clamp(damages - self.epsilon, min=0).max()) / self.epsilon
        slack = float((lam * (damages - self.epsilon).abs()).max()) / base_norm2
        return max(primal, slack)

    def newton_step(self, lam: torch.Tensor, damages: torch.Tensor, base_norm2: float) -> torch.Tensor | None:
        """One projected-Newton step with Armijo backtracking; ``None`` when no step helps.

        Multipliers at 0 whose gradient points below 0 stay fixed; the others take the Newton direction
        ``-H^+ grad`` (pseudo-inverse: identical retain Fishers make H singular). A step is accepted on
        sufficient ascent, or, where the dual value is flat to rounding near the optimum, when it lowers
        the KKT residual.
        """
        grad = damages - self.epsilon
        at_bound = (lam <= 0) & (grad <= 0)
        free = (~at_bound).nonzero().squeeze(1)
        if free.numel() == 0:
            return None
        direction = torch.zeros_like(lam)
        h = self.hessian(lam)[free][:, free]
        direction[free] = -(torch.linalg.pinv(h) @ grad[free])
        current_value = self.value(lam)
        current_residual = self.residual(lam, damages, base_norm2)
        step = 1.0
        for _ in range(30):
            candidate = torch.clamp(lam + step * direction, min=0)
            gain = self.value(candidate) - current_value
            if gain > 0 and gain >= 1e-4 * float(grad @ (candidate - lam)):
                return candidate
            if step == 1.0 and self.residual(candidate, self.damages(candidate), base_norm2) < current_residual:
                return candidate
            step *= 0.5
        return None


def _solve_dual(dual: _Dual, base_norm2: float) -> tuple[torch.Tensor, int]:
    """Maximise the dual: one exact coordinate sweep, then projected Newton steps (a sweep whenever a
    Newton step fails), until the KKT residual is below tolerance or the iteration limit is hit."""
    lam = torch.zeros(dual.m, dtype=torch.float64, device=dual.b2.device)
    if dual.m == 1:
        return dual.maximise_coordinate(lam, 0)
    damages = dual.damages(lam)
    iterations = 0
    while iterations < _MAX_ITERATIONS and dual.residual(lam, damages, base_norm2) > _KKT_TOLERANCE:
        iterations += 1
        stepped = dual.newton_step(lam, damages, base_norm2) if iterations > 1 else None
        if stepped is None:
            previous = lam
            for k in range(dual.m):
                lam, _ = dual.maximise_coordinate(lam, k)
            if iterations > 1 and torch.equal(lam, previous):
                break  # at the rounding floor: neither step moves; the report shows the residuals
        else:
            lam = stepped
        damages = dual.damages(lam)
    return lam, iterations


def project(base: torch.Tensor, fishers: Sequence[torch.Tensor], epsilon: float):
    """Closest ``x`` to ``base`` (L2) with ``sum_j F_k(j) x_j^2 <= epsilon`` for every retain Fisher k.

    Returns ``(x, ProjectionReport)``; ``x`` has ``base``'s dtype and shape, the report's damages and
    residuals are measured on that delivered ``x``. ``epsilon = inf`` (or no Fishers) returns ``base``
    unchanged with lambda = 0. When ``base`` is already feasible every lambda is 0.
    """
    check_epsilon(epsilon)
    fishers = list(fishers)
    for k, fisher in enumerate(fishers):
        check_fisher(fisher, f"retain fisher {k}")
        check_same_shape(base, fisher, f"update and retain fisher {k}")
    flat = base.reshape(-1).to(torch.float64)
    base_norm2 = float(flat.square().sum())
    if math.isinf(epsilon) or not fishers or base_norm2 == 0.0:
        damages = [proxy_damage(base, f) for f in fishers]
        residuals = KKTResiduals(0.0 if math.isinf(epsilon) else _primal(damages, epsilon), 0.0, 0.0, 0.0)
        return base.clone(), ProjectionReport([0.0] * len(fishers), damages, residuals, 0)
    dual = _Dual(base, fishers, epsilon)
    lam, iterations = _solve_dual(dual, base_norm2)
    shrink = torch.ones_like(flat)
    for lam_k, fisher in zip(lam.tolist(), fishers):
        shrink.add_(fisher.reshape(-1).to(flat), alpha=lam_k)
    x = (flat / shrink).to(base.dtype).reshape(base.shape)
    delivered = x.reshape(-1).to(torch.float64)
    damages = [proxy_damage(x, fisher) for fisher in fishers]
    damages_t = torch.tensor(damages, dtype=torch.float64, device=lam.device)
    residuals = KKTResiduals(
        primal_infeasibility=_primal(damages, epsilon),
        complementary_slackness=float((lam * (damages_t - epsilon).abs()).max()) / base_norm2,
        dual_infeasibility=float(torch.clamp(-lam, min=0).max()),
        stationarity=float((delivered * shrink - flat).abs().max()) / float(flat.abs().max()),
    )
    return x, ProjectionReport([float(v) for v in lam], damages, residuals, iterations)


def _primal(damages: Sequence[float], epsilon: float) -> float:
    return max([0.0] + [max(0.0, b - epsilon) / epsilon for b in damages])


def firm_project_all(
    base: Mapping[str, torch.Tensor], constraints: Mapping[str, Sequence[torch.Tensor]], epsilon: float
) -> tuple[TensorDict, dict[str, ProjectionReport]]:
    """``project`` applied to every tensor name (the budget ``epsilon`` holds per tensor, per client)."""
    check_epsilon(epsilon)
    projected: TensorDict = {}
    reports: dict[str, ProjectionReport] = {}
    for name, tensor in base.items():
        projected[name], reports[name] = project(tensor, constraints.get(name, []), epsilon)
    return projected, reports
