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

   m = 1 is solved on the scalar boundary equation b_1 = eps by Newton's method on b_1^(-1/2), which is
   concave and increasing in lambda (a trust-region secular equation), so it converges monotonically
   and quadratically from lambda = 0; m > 1 by an exact dual solver (a rough coordinate sweep, then
   projected Newton with Armijo backtracking, exact sweeps as fallback; multipliers may go down as
   well as up) that stops on a KKT certificate (see ``ProjectionReport``) or, reported there, at the
   iteration limit / rounding floor.

The solver works in float64 on the support where some ``F_k > 0`` (elsewhere the coordinate is
untouched and contributes nothing to any b_k), gathered once; the Top-alpha sparsification keeps that
support at most m * alpha of the tensor. Value, gradient and Hessian of the dual come from one fused
pass over it. Unlike the paper's implementation no extra ``eps0`` is added to the denominator
``1 + s``: it is >= 1 already.
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
    complementary_slackness:  max_k lambda_k |b_k - eps| / ||base_S||^2  (each term is that constraint's
                              share of the duality gap, relative to the squared size of the base merge;
                              ``lambda_k |b_k - eps| / eps`` is not scale-free: lambda has units 1/F.
                              base_S = base on the support S where some F_k > 0, the only part the
                              constraints see; since eps * sum_k lambda_k <= ||base_S||^2 at the dual
                              optimum, this is
                              <= max_k |b_k - eps| / eps for every active constraint.)
    dual_infeasibility:       max_k max(0, -lambda_k)
    stationarity:             max_{j in S} |x_j (1 + sum_k lambda_k F_k(j)) - base_j| / max_{j in S} |base_j|
                              (off S the delivered x equals base exactly)
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
    """The dual of one projection problem on its support, in float64.

    Only coordinates with ``base != 0`` and some ``F_k > 0`` enter (elsewhere x = base and no b_k
    changes). ``b2`` (n,) holds base^2 there and ``F`` (m, n) the Fishers; for every k the positions
    where ``F_k > 0`` and the products ``F_k * base^2`` are precomputed once, so the one-multiplier
    solves touch only that constraint's own support (Top-alpha keeps ~alpha of each tensor).
    """

    def __init__(self, b2: torch.Tensor, F: torch.Tensor, epsilon: float):
        self.b2 = b2
        self.b2_sum = float(b2.sum())
        self.F = F
        self.epsilon = epsilon
        self.m = F.shape[0]
        self.own = []
        for k in range(self.m):
            positions = (F[k] > 0).nonzero().squeeze(1)
            fk = F[k].index_select(0, positions)
            self.own.append((positions, fk, fk * b2.index_select(0, positions)))
        # Work buffers reused by every evaluation: fresh multi-megabyte tensors cost page faults.
        self._u = torch.empty_like(b2)
        self._d = torch.empty_like(b2)
        self._e = torch.empty_like(b2)
        largest = max(fk.numel() for _, fk, _ in self.own)
        self._inv = torch.empty(largest, dtype=b2.dtype, device=b2.device)
        self._w = torch.empty_like(self._inv)

    def evaluate(self, lam: torch.Tensor) -> tuple[float, torch.Tensor, torch.Tensor]:
        """Dual value, damages b_k(x(lambda)) (the gradient is damages - eps) and Hessian, one pass.

        With ``u = 1 / (1 + s)``: value ``sum b2 (1 - u) - eps sum lambda``, damages ``F @ (b2 u^2)``,
        Hessian ``H_kl = -2 sum_j F_k F_l b2 u^3``.
        """
        u, d, e = self._u, self._d, self._e
        torch.mv(self.F.t(), lam, out=u)
        u.add_(1).reciprocal_()
        torch.mul(self.b2, u, out=d)
        value = self.b2_sum - float(d.sum()) - self.epsilon * float(lam.sum())
        d.mul_(u)
        damages = self.F @ d
        u.mul_(d)
        hessian = torch.empty(self.m, self.m, dtype=lam.dtype, device=lam.device)
        for k in range(self.m):
            hessian[k] = self.F @ torch.mul(self.F[k], u, out=e)
        return value, damages, hessian.mul_(-2.0)

    def maximise_coordinate(self, lam: torch.Tensor, k: int, tolerance: float = 1e-13) -> tuple[torch.Tensor, int]:
        """Maximiser over lambda_k >= 0 with the others fixed: the root of b_k = eps, or 0.

        On the support of F_k, with r = 1 + sum_{l != k} lambda_l F_l,
        ``b_k(t) = sum_j (base_j^2 / F_k(j)) / (r_j / F_k(j) + t)^2`` has the form of a trust-region
        secular equation, so ``psi(t) = b_k(t)^(-1/2)`` is increasing and concave in t >= 0
        (More & Sorensen, 1983). Newton's method on ``psi(t) = eps^(-1/2)`` started at t = 0 (where
        b_k > eps) therefore never passes the root and converges quadratically; it stops when
        ``b_k - eps <= tolerance * eps`` or the step stops moving t. psi is exactly linear when F_k is
        constant on its support, so one step suffices there. Returns the new multipliers and the
        number of b_k evaluations.
        """
        positions, fk, weighted = self.own[k]
        n = fk.numel()
        rest = (lam @ self.F).index_select(0, positions).add_(1).sub_(fk, alpha=float(lam[k]))
        inv, w = self._inv[:n], self._w[:n]
        target = self.epsilon ** -0.5

        def evaluate(t: float) -> tuple[float, float]:
            torch.add(rest, fk, alpha=t, out=inv).reciprocal_()
            torch.mul(weighted, inv, out=w).mul_(inv)
            b = float(w.sum())
            return b, -2.0 * float(torch.dot(w.mul_(fk), inv))

        out = lam.clone()
        t = 0.0
        b, slope = evaluate(t)
        evaluations = 1
        if b <= self.epsilon:
            out[k] = 0.0
            return out, evaluations
        while evaluations < _MAX_SCALAR_EVALUATIONS and b - self.epsilon > tolerance * self.epsilon:
            psi = b ** -0.5
            psi_slope = -0.5 * psi / b * slope
            step = (target - psi) / psi_slope
            if not step > 1e-16 * max(t, 1e-300):
                break
            t += step
            b, slope = evaluate(t)
            evaluations += 1
        out[k] = t
        return out, evaluations

    def residual(self, lam: torch.Tensor, damages: torch.Tensor, base_norm2: float) -> float:
        """Worst of primal infeasibility and complementary slackness at ``x(lambda)``."""
        primal = float(torch.clamp(damages - self.epsilon, min=0).max()) / self.epsilon
        slack = float((lam * (damages - self.epsilon).abs()).max()) / base_norm2
        return max(primal, slack)

    def newton_step(self, lam: torch.Tensor, state: tuple, base_norm2: float) -> tuple | None:
        """One projected-Newton step with Armijo backtracking from ``lam`` with ``state = evaluate(lam)``.

        Returns ``(new_lam, evaluate(new_lam))``, or ``None`` when no step helps. Multipliers at 0 whose
        gradient points below 0 stay fixed; the others take the Newton direction ``-H^+ grad``
        (pseudo-inverse: identical retain Fishers make H singular). A step is accepted on sufficient
        ascent, or, where the dual value is flat to rounding near the optimum, when it lowers the KKT
        residual. Each trial costs one fused pass (``evaluate``); a full step is the usual case.
        """
        value, damages, hessian = state
        grad = damages - self.epsilon
        at_bound = (lam <= 0) & (grad <= 0)
        free = (~at_bound).nonzero().squeeze(1)
        if free.numel() == 0:
            return None
        direction = torch.zeros_like(lam)
        direction[free] = -(torch.linalg.pinv(hessian[free][:, free]) @ grad[free])
        current_residual = self.residual(lam, damages, base_norm2)
        step = 1.0
        for _ in range(30):
            candidate = torch.clamp(lam + step * direction, min=0)
            candidate_state = self.evaluate(candidate)
            gain = candidate_state[0] - value
            if gain > 0 and gain >= 1e-4 * float(grad @ (candidate - lam)):
                return candidate, candidate_state
            if step == 1.0 and self.residual(candidate, candidate_state[1], base_norm2) < current_residual:
                return candidate, candidate_state
            step *= 0.5
        return None


def _solve_dual(dual: _Dual, base_norm2: float) -> tuple[torch.Tensor, int]:
    """Maximise the dual: one coordinate sweep, then projected Newton steps (an exact sweep whenever a
    Newton step fails), until the KKT residual is below tolerance or the iteration limit is hit.

    The first sweep only provides Newton's starting point, so its one-multiplier solves stop at 1e-3
    relative accuracy (two or three evaluations each instead of five to eight)."""
    lam = torch.zeros(dual.m, dtype=torch.float64, device=dual.b2.device)
    if dual.m == 1:
        return dual.maximise_coordinate(lam, 0)
    for k in range(dual.m):  # lambda = 0 is infeasible (the caller checked): start with a rough sweep
        lam, _ = dual.maximise_coordinate(lam, k, 1e-3)
    state = dual.evaluate(lam)
    iterations = 1
    while iterations < _MAX_ITERATIONS and dual.residual(lam, state[1], base_norm2) > _KKT_TOLERANCE:
        iterations += 1
        stepped = dual.newton_step(lam, state, base_norm2)
        if stepped is None:
            previous = lam
            for k in range(dual.m):
                lam, _ = dual.maximise_coordinate(lam, k)
            if torch.equal(lam, previous):
                break  # at the rounding floor: neither step moves; the report shows the residuals
            state = dual.evaluate(lam)
        else:
            lam, state = stepped
    return lam, iterations


def _check_fisher_fast(fisher: torch.Tensor, name: str) -> None:
    """``check_fisher`` with one fused min/max pass on the common (valid) path."""
    if not torch.is_tensor(fisher):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(fisher).__name__}")
    if fisher.numel():
        low, high = torch.aminmax(fisher)
        if bool(low >= 0) and bool(high < math.inf):  # NaN fails both comparisons
            return
    check_fisher(fisher, name)


def project(base: torch.Tensor, fishers: Sequence[torch.Tensor], epsilon: float):
    """Closest ``x`` to ``base`` (L2) with ``sum_j F_k(j) x_j^2 <= epsilon`` for every retain Fisher k.

    Returns ``(x, ProjectionReport)``; ``x`` has ``base``'s dtype and shape, the report's damages and
    residuals are measured on that delivered ``x``. ``epsilon = inf`` (or no Fishers) returns ``base``
    unchanged with lambda = 0. When ``base`` is already feasible every lambda is 0.

    Cost: the full-size tensors are read once to find the support (some F_k > 0) and gather it; the
    solver, the damages and the certificate then work on the support alone (x equals base, and every
    F_k is 0, off it), which the Top-alpha sparsification makes small (<= m * alpha of the tensor).
    """
    check_epsilon(epsilon)
    fishers = list(fishers)
    for k, fisher in enumerate(fishers):
        _check_fisher_fast(fisher, f"retain fisher {k}")
        check_same_shape(base, fisher, f"update and retain fisher {k}")
    if math.isinf(epsilon) or not fishers:
        damages = [proxy_damage(base, f) for f in fishers]
        return base.clone(), ProjectionReport([0.0] * len(fishers), damages, KKTResiduals(0.0, 0.0, 0.0, 0.0), 0)
    flat = base.reshape(-1)
    active = fishers[0].reshape(-1) > 0
    for fisher in fishers[1:]:
        active.logical_or_(fisher.reshape(-1) > 0)
    support = active.nonzero().squeeze(1)
    base_support = flat.index_select(0, support).to(torch.float64)
    b2 = base_support.square()
    F = torch.stack([f.reshape(-1).index_select(0, support).to(torch.float64) for f in fishers])
    support_norm2 = float(b2.sum())
    lam = torch.zeros(len(fishers), dtype=torch.float64, device=flat.device)
    iterations = 0
    if support_norm2 > 0.0 and float((F @ b2).max()) > epsilon:
        lam, iterations = _solve_dual(_Dual(b2, F, epsilon), support_norm2)
    shrink = 1 + lam @ F
    x_support = (base_support / shrink).to(base.dtype)
    x = base.clone()
    x.view(-1).index_copy_(0, support, x_support)
    delivered = x_support.to(torch.float64)
    damages_t = F @ delivered.square()
    damages = damages_t.tolist()
    base_max = float(base_support.abs().max()) if support_norm2 > 0.0 else 1.0
    slack = float((lam * (damages_t - epsilon).abs()).max()) / support_norm2 if support_norm2 else 0.0
    residuals = KKTResiduals(
        primal_infeasibility=_primal(damages, epsilon),
        complementary_slackness=slack,
        dual_infeasibility=float(torch.clamp(-lam, min=0).max()),
        stationarity=float((delivered * shrink - base_support).abs().max()) / base_max if support.numel() else 0.0,
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
