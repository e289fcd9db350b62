"""FIRM's retention-constrained projection (the FIRM paper, Sec. 4.2), step 4 of the server math
(steps 1-3: ``strategies.firm.maths``).

``project``: per tensor, the closest update (L2) to ``base`` such that for every retain client k the
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
support at most m * alpha of the tensor. On a large support it starts from the multipliers of the dual
on a strided sample of the support; value, gradient and (when a step needs it) Hessian of the dual
come from one chunked pass over the support, and the pass that ends the solve also writes the
projected update and its certificate. Unlike the paper's implementation no extra ``eps0`` is added to
the denominator ``1 + s``: it is >= 1 already.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy
import torch

from strategies.firm.maths import TensorDict, check_epsilon, check_fisher, check_same_shape

_KKT_TOLERANCE = 1e-10
_MAX_ITERATIONS = 500
_MAX_SCALAR_EVALUATIONS = 200
_SAMPLE_STRIDE = 64  # _starting_point solves the dual on every 64th support coordinate ...
_MIN_SAMPLE = 4096  # ... when that gives at least this many
_CHUNK = 65536  # support coordinates per chunk of a dual evaluation: its float64 temporaries stay in cache
_GATHER_CHUNK = 1 << 18  # full-tensor coordinates per chunk of the support pass (``_gather_support``)
_HESSIAN_SKIP = 1e-4  # KKT residual below which a Newton candidate is expected to end the solve


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


class _Workspace:
    """Named scratch tensors, reused by every projection of one ``firm_project_all`` call.

    Freshly allocated multi-megabyte tensors are paid for in page faults (the CPU allocator hands large
    blocks back to the system on free), about as much as a pass of arithmetic over them; the support
    mask, the gathered support arrays and the solver's work vectors are therefore taken from here and
    grow only when a tensor needs more room than the previous ones.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, torch.Tensor] = {}

    def get(self, key: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A contiguous tensor of ``shape`` (uninitialised), backed by the buffer named ``key``."""
        numel = math.prod(shape)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < numel or buffer.dtype != dtype or buffer.device != device:
            buffer = torch.empty(numel, dtype=dtype, device=device)
            self._buffers[key] = buffer
        return buffer[:numel].view(shape)


class _Dual:
    """The dual of one projection problem on its support, in float64.

    ``b2`` (n,) holds base^2 on the support S (coordinates where some F_k > 0) and ``F`` (m, n) the
    Fishers there. With ``base`` (base on S, float64) and ``x_support`` (a buffer of the update's dtype)
    an evaluation can also deliver the projected update and its certificate (``deliver``). Work vectors
    come from a ``_Workspace``. The positions and products a one-multiplier solve needs (``F_k > 0``
    within S, ``F_k * base^2``) are built on first use: with a starting point from ``_starting_point``
    the coordinate sweeps are only a fallback.
    """

    def __init__(
        self,
        b2: torch.Tensor,
        F: torch.Tensor,
        epsilon: float,
        workspace: _Workspace,
        base: torch.Tensor | None = None,
        x_support: torch.Tensor | None = None,
    ):
        self.b2 = b2
        self.b2_sum = float(b2.sum())
        self.F = F
        self.epsilon = epsilon
        self.m, n = F.shape
        self._base, self._x = base, x_support
        self._one = torch.ones((), dtype=b2.dtype, device=b2.device)
        self._e = workspace.get("dual_e", (n,), b2.dtype, b2.device)
        self._p = workspace.get("dual_p", (n,), b2.dtype, b2.device)
        chunk = min(n, _CHUNK)
        self._u = workspace.get("dual_u", (chunk,), b2.dtype, b2.device)
        self._t = workspace.get("dual_t", (chunk,), b2.dtype, b2.device)
        self._g = workspace.get("dual_g", (self.m, chunk), b2.dtype, b2.device)
        self._h = workspace.get("dual_h", (self.m, chunk), b2.dtype, b2.device)
        self._delivered: tuple | None = None
        self._own: list[tuple | None] = [None] * self.m

    def evaluate(
        self, lam: torch.Tensor, hessian: bool = True, deliver: bool = False
    ) -> tuple[float, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Dual value, damages b_k(x(lambda)) (the gradient is damages - eps) and, if asked, the Hessian
        and the third derivatives.

        With ``u = 1 / (1 + s)``: value ``sum b2 (1 - u) - eps sum lambda``, damages ``F @ (b2 u^2)``,
        Hessian ``H_kl = -2 sum_j F_k F_l b2 u^3``, third derivatives
        ``T_klm = 6 sum_j F_k F_l F_m b2 u^4``. One pass over the support in chunks of ``_CHUNK``
        coordinates, so each chunk of ``F`` is read from memory once and the temporaries stay in cache.
        ``deliver`` also writes ``x = base * u`` in the update's dtype to ``x_support`` and keeps, for
        ``delivered``, the damages of that rounded x and its largest stationarity error
        ``|x (1 + s) - base|``, so the evaluation that ends the solve also yields its result.
        """
        n = self.b2.numel()
        damages = torch.zeros(self.m, dtype=lam.dtype, device=lam.device)
        second = torch.zeros(self.m, self.m, dtype=lam.dtype, device=lam.device) if hessian else None
        third = torch.zeros(self.m, self.m, self.m, dtype=lam.dtype, device=lam.device) if hessian else None
        delivered_damages = torch.zeros_like(damages) if deliver else None
        weighted_sum, worst_stationarity = 0.0, 0.0
        for start in range(0, n, _CHUNK):
            stop = min(start + _CHUNK, n)
            f = self.F[:, start:stop]
            u, t, g = self._u[: stop - start], self._t[: stop - start], self._g[:, : stop - start]
            torch.addmv(self._one, f.t(), lam, out=u).reciprocal_()
            torch.mul(self.b2[start:stop], u, out=t)
            weighted_sum += float(t.sum())
            damages.addmv_(f, t.mul_(u))
            if second is not None:
                second.addmm_(torch.mul(f, t.mul_(u), out=g), f.t())
                torch.mul(f, t.mul_(u), out=g)
                for l in range(self.m):
                    third[:, l].addmm_(torch.mul(g, f[l], out=self._h[:, : stop - start]), f.t())
            if delivered_damages is not None:
                base = self._base[start:stop]
                x = self._x[start:stop].copy_(torch.mul(base, u, out=t))
                rounded = t.copy_(x)
                low, high = torch.aminmax(torch.addcdiv(base, rounded, u, value=-1.0, out=g[0]))
                worst_stationarity = max(worst_stationarity, -float(low), float(high))
                delivered_damages.addmv_(f, rounded.square_())
        if delivered_damages is not None:
            self._delivered = (lam.clone(), delivered_damages, worst_stationarity)
        value = self.b2_sum - weighted_sum - self.epsilon * float(lam.sum())
        if second is None:
            return value, damages, None, None
        return value, damages, second.mul_(-2.0), third.mul_(6.0)

    def delivered(self, lam: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, float]:
        """``(x on the support in the update's dtype, b_k of that x, max_j |x_j (1 + s_j) - base_j|)``
        at ``lam``, from the last delivering evaluation when it was at ``lam``."""
        if self._delivered is None or not torch.equal(self._delivered[0], lam):
            self.evaluate(lam, hessian=False, deliver=True)
        return self._x, self._delivered[1], self._delivered[2]

    def _own_support(self, k: int) -> tuple:
        """(positions of F_k > 0 within S or None for all of S, F_k there, F_k * base^2 there)."""
        if self._own[k] is None:
            fk = self.F[k]
            positions = None if self.m == 1 else (fk > 0).nonzero().squeeze(1)
            if positions is not None:
                fk = fk.index_select(0, positions)
            b2 = self.b2 if positions is None else self.b2.index_select(0, positions)
            self._own[k] = (positions, fk, fk * b2)
        return self._own[k]

    def maximise_coordinate(
        self, lam: torch.Tensor, k: int, tolerance: float = 1e-13, start: float = 0.0
    ) -> tuple[torch.Tensor, int]:
        """Maximiser over lambda_k >= 0 with the others fixed: the root of b_k = eps, or 0.

        On the support of F_k, with r = 1 + sum_{l != k} lambda_l F_l,
        ``b_k(t) = sum_j (base_j^2 / F_k(j)) / (r_j / F_k(j) + t)^2`` has the form of a trust-region
        secular equation, so ``psi(t) = b_k(t)^(-1/2)`` is increasing and concave in t >= 0
        (More & Sorensen, 1983). A Newton step on ``psi(t) = eps^(-1/2)`` from any t therefore lands at
        or before the root (the tangent lies above psi); from there Newton never passes the root and
        converges quadratically. So: from ``start`` (0, or an estimate of the root), one step back when
        it lies past the root (clipped at 0), then Newton until ``b_k - eps <= tolerance * eps`` or the
        step stops moving t. psi is exactly linear when F_k is constant on its support, so one step
        suffices there. Returns the new multipliers and the number of b_k evaluations.
        """
        positions, fk, weighted = self._own_support(k)
        n = fk.numel()
        if self.m == 1:
            rest = self._one
        else:
            rest = (lam @ self.F).index_select(0, positions).add_(1).sub_(fk, alpha=float(lam[k]))
        inv, w = self._e[:n], self._p[:n]
        target = self.epsilon ** -0.5

        def evaluate(t: float) -> tuple[float, float]:
            torch.add(rest, fk, alpha=t, out=inv).reciprocal_()
            torch.mul(weighted, inv, out=w).mul_(inv)
            b = float(w.sum())
            return b, -2.0 * float(torch.dot(w.mul_(fk), inv))

        def newton(t: float, b: float, slope: float) -> float:
            psi = b ** -0.5
            return (target - psi) / (-0.5 * psi / b * slope)

        out = lam.clone()
        t = start
        b, slope = evaluate(t)
        evaluations = 1
        if t > 0.0 and b < self.epsilon:
            t = max(t + newton(t, b, slope), 0.0)
            b, slope = evaluate(t)
            evaluations += 1
        if t == 0.0 and b <= self.epsilon:
            out[k] = 0.0
            return out, evaluations
        while evaluations < _MAX_SCALAR_EVALUATIONS and b - self.epsilon > tolerance * self.epsilon:
            step = newton(t, b, slope)
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
        gradient points below 0 stay fixed; the others take the Newton direction ``d = -H^+ grad``
        (pseudo-inverse: identical retain Fishers make H singular) plus Chebyshev's third-order
        correction ``-H^+ T[d, d] / 2`` (T the third derivatives), so the error after the step is cubic
        rather than quadratic in the error before it. A step is accepted on sufficient ascent, or, where
        the dual value is flat to rounding near the optimum, when it lowers the KKT residual. Each trial
        costs one fused pass (``evaluate``); a full step is the usual case.

        From a residual below ``_HESSIAN_SKIP`` the candidate usually ends the solve: it is evaluated
        without its derivatives (computed by one more pass only if another step is needed after all) and
        delivers its projected update instead.
        """
        value, damages, hessian, third = state
        if hessian is None:
            value, damages, hessian, third = self.evaluate(lam)
        grad = damages - self.epsilon
        at_bound = (lam <= 0) & (grad <= 0)
        free = (~at_bound).nonzero().squeeze(1)
        if free.numel() == 0:
            return None
        inverse = torch.linalg.pinv(hessian[free][:, free])
        newton = inverse @ grad[free]
        curvature = torch.einsum("klm,l,m->k", third[free][:, free][:, :, free], newton, newton)
        direction = torch.zeros_like(lam)
        direction[free] = -newton - 0.5 * (inverse @ curvature)
        current_residual = self.residual(lam, damages, base_norm2)
        with_hessian = current_residual > _HESSIAN_SKIP
        deliver = not with_hessian and self._x is not None
        step = 1.0
        for _ in range(30):
            candidate = torch.clamp(lam + step * direction, min=0)
            candidate_state = self.evaluate(candidate, with_hessian, deliver)
            gain = candidate_state[0] - value
            if gain > 0 and gain >= 1e-4 * float(grad @ (candidate - lam)):
                return candidate, candidate_state
            if step == 1.0 and self.residual(candidate, candidate_state[1], base_norm2) < current_residual:
                return candidate, candidate_state
            step *= 0.5
        return None


def _solve_dual(
    dual: _Dual, base_norm2: float, start: tuple[torch.Tensor, tuple] | None = None
) -> tuple[torch.Tensor, int]:
    """Maximise the dual from ``start = (lambda, (Hessian, third derivatives) estimates)`` (or, without
    one, from a rough coordinate sweep): projected Newton steps (an exact sweep whenever a Newton step
    fails) until the KKT residual is below tolerance or the iteration limit is hit. m = 1 is the
    one-multiplier solve from ``start``'s lambda.

    The rough sweep only provides Newton's starting point, so its one-multiplier solves stop at 1e-3
    relative accuracy (two or three evaluations each instead of five to eight). The first Newton step
    from ``start`` uses its derivative estimates, the later ones the exact derivatives."""
    lam = torch.zeros(dual.m, dtype=torch.float64, device=dual.b2.device)
    if dual.m == 1:
        return dual.maximise_coordinate(lam, 0, start=0.0 if start is None else float(start[0][0]))
    if start is None:
        for k in range(dual.m):  # lambda = 0 is infeasible (the caller checked): start with a rough sweep
            lam, _ = dual.maximise_coordinate(lam, k, 1e-3)
        state = dual.evaluate(lam)
    else:
        lam = start[0].clone()
        state = dual.evaluate(lam, hessian=False)[:2] + start[1]
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


def _starting_point(b2: torch.Tensor, F: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, tuple] | None:
    """Multipliers of the dual restricted to every ``_SAMPLE_STRIDE``-th support coordinate, with that
    sampled dual's (Hessian, third derivatives) there; ``None`` when the support is too small for
    sampling to pay off.

    The sampled sums, scaled by n / (sample size), estimate the full ones to a few 1e-3, so the
    multipliers land close enough to the optimum for two full Newton steps to finish (instead of a
    coordinate sweep and three), and the sampled derivatives are accurate enough for the first of them,
    while solving the sample costs a fraction of one full evaluation. Only the starting point comes from the
    sample: the full solve and its certificate decide the result.
    """
    n = b2.numel()
    if n < _SAMPLE_STRIDE * _MIN_SAMPLE:
        return None
    b2_sample = b2[::_SAMPLE_STRIDE].contiguous()
    b2_sample.mul_(n / b2_sample.numel())
    F_sample = F[:, ::_SAMPLE_STRIDE].contiguous()
    if float(torch.mv(F_sample, b2_sample).max()) <= epsilon:
        return None
    sample = _Dual(b2_sample, F_sample, epsilon, _Workspace())
    lam, _ = _solve_dual(sample, float(b2_sample.sum()))
    return lam, sample.evaluate(lam)[2:]


def _gather_support(
    base: torch.Tensor, fishers: Sequence[torch.Tensor], copy: torch.Tensor | None, workspace: _Workspace
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunked pass over the full-size tensors: ``(support, base there, base^2 there, Fishers there)``.

    ``support`` holds the sorted flat positions where some Fisher is > 0 (int64); base, base^2 and the
    Fishers there (shape (m, n)) are float64, exact copies of float32 values. Base is also copied into
    ``copy`` (a contiguous tensor of its shape) on the way, unless that is ``None``.

    Why chunked: each chunk of ``_GATHER_CHUNK`` coordinates of the Fishers and of base is read from
    memory once and stays in cache while its mask is built (``logical_or`` of the Fishers: a Fisher is
    >= 0, so nonzero means > 0, and float-to-bool conversion is faster than ``> 0`` on a CPU), its
    positions found (NumPy's ``flatnonzero`` on a CPU, ~1.3x faster there than ``torch.nonzero``),
    its values gathered and widened and base copied; no full-size mask or position array is written
    and base is read once. The support size is unknown until the pass ends, so the compact outputs go
    to workspace buffers sized for the whole tensor; only their first n entries are touched, so only
    those cost memory.
    """
    flat = [fisher.reshape(-1) for fisher in fishers]
    base_flat = base.reshape(-1)
    d, m, device, wide = base_flat.numel(), len(flat), base.device, torch.float64
    support = workspace.get("support", (d,), torch.int64, device)
    base_wide = workspace.get("base_wide", (d,), wide, device)
    b2 = workspace.get("base_squared", (d,), wide, device)
    F = workspace.get("fishers", (m, d), wide, device)
    chunk = min(d, _GATHER_CHUNK)
    mask = workspace.get("mask", (chunk,), torch.bool, device)
    other = workspace.get("mask_other", (chunk,), torch.bool, device) if m > 2 else None
    n = 0
    for start in range(0, d, chunk):
        stop = min(start + chunk, d)
        piece = mask[: stop - start]
        if m == 1:
            piece.copy_(flat[0][start:stop])
        else:
            torch.logical_or(flat[0][start:stop], flat[1][start:stop], out=piece)
        for fisher in flat[2:]:
            piece.logical_or_(other[: stop - start].copy_(fisher[start:stop]))
        if device.type == "cpu":
            positions = torch.from_numpy(numpy.flatnonzero(piece.numpy()))
        else:
            positions = piece.nonzero().squeeze(1)
        k = positions.numel()
        for row, source in [(F[row], fisher) for row, fisher in enumerate(flat)] + [(base_wide, base_flat)]:
            gathered = workspace.get("gathered", (k,), source.dtype, device)
            row[n : n + k].copy_(torch.index_select(source[start:stop], 0, positions, out=gathered))
        torch.mul(base_wide[n : n + k], base_wide[n : n + k], out=b2[n : n + k])
        torch.add(positions, start, out=support[n : n + k])
        if copy is not None:
            copy.view(-1)[start:stop].copy_(base_flat[start:stop])
        n += k
    return support[:n], base_wide[:n], b2[:n], F[:, :n]


def project(base: torch.Tensor, fishers: Sequence[torch.Tensor], epsilon: float, overwrite: bool = False):
    """Closest ``x`` to ``base`` (L2) with ``sum_j F_k(j) x_j^2 <= epsilon`` for every retain Fisher k.

    Returns ``(x, ProjectionReport)``; ``x`` has ``base``'s dtype and shape, the report's damages and
    residuals are measured on that delivered ``x``. ``epsilon = inf`` (or no Fishers) returns ``base``
    unchanged with lambda = 0. When ``base`` is already feasible every lambda is 0. ``overwrite=True``
    writes ``x`` into ``base`` itself and returns it (for a caller that discards ``base``: it saves
    the full-size copy, a fresh tensor's page faults included); ``base`` must then be contiguous.

    Cost: the full-size tensors are read once to find the support (some F_k > 0) and gather it; the
    solver, the damages and the certificate then work on the support alone (x equals base, and every
    F_k is 0, off it), which the Top-alpha sparsification makes small (<= m * alpha of the tensor).
    """
    return _project(base, fishers, epsilon, _Workspace(), overwrite)


def _project(
    base: torch.Tensor, fishers: Sequence[torch.Tensor], epsilon: float, workspace: _Workspace, overwrite: bool
):
    """``project`` with its scratch tensors taken from ``workspace``."""
    check_epsilon(epsilon)
    if overwrite and not base.is_contiguous():
        raise ValueError("project(overwrite=True) needs a contiguous base tensor")
    fishers = list(fishers)
    for k, fisher in enumerate(fishers):
        if not torch.is_tensor(fisher):
            raise ValueError(f"retain fisher {k} must be a torch.Tensor, got {type(fisher).__name__}")
        check_same_shape(base, fisher, f"update and retain fisher {k}")
    if math.isinf(epsilon) or not fishers:
        for k, fisher in enumerate(fishers):
            check_fisher(fisher, f"retain fisher {k}")
        damages = [proxy_damage(base, f) for f in fishers]
        x = base if overwrite else base.clone()
        return x, ProjectionReport([0.0] * len(fishers), damages, KKTResiduals(0.0, 0.0, 0.0, 0.0), 0)
    x = base if overwrite else torch.empty_like(base, memory_format=torch.contiguous_format)
    support, base_wide, b2, F = _gather_support(base, fishers, None if overwrite else x, workspace)
    n = support.numel()
    if n:  # every entry that is not 0 (negative, NaN and inf included) is on the support
        low, high = torch.stack([torch.stack(torch.aminmax(row)) for row in F]).aminmax(dim=0)  # rows contiguous
        if not (bool(low.min() >= 0) and bool(high.max() < math.inf)):  # NaN fails both comparisons
            for k, fisher in enumerate(fishers):
                check_fisher(fisher, f"retain fisher {k}")
    unprojected = torch.mv(F, b2)  # b_k(base)
    support_norm2 = float(b2.sum())
    if support_norm2 == 0.0 or float(unprojected.max()) <= epsilon:
        damages = unprojected.tolist()
        residuals = KKTResiduals(_primal(damages, epsilon), 0.0, 0.0, 0.0)
        return x, ProjectionReport([0.0] * len(fishers), damages, residuals, 0)
    x_support = workspace.get("x_support", (n,), base.dtype, base.device)
    dual = _Dual(b2, F, epsilon, workspace, base_wide, x_support)
    lam, iterations = _solve_dual(dual, support_norm2, _starting_point(b2, F, epsilon))
    x_support, damages_t, worst_stationarity = dual.delivered(lam)
    x.view(-1).scatter_(0, support, x_support)
    base_low, base_high = torch.aminmax(base_wide)
    damages = damages_t.tolist()
    residuals = KKTResiduals(
        primal_infeasibility=_primal(damages, epsilon),
        complementary_slackness=float((lam * (damages_t - epsilon).abs()).max()) / support_norm2,
        dual_infeasibility=float(torch.clamp(-lam, min=0).max()),
        stationarity=worst_stationarity / max(-float(base_low), float(base_high)),
    )
    return x, ProjectionReport([float(v) for v in lam], damages, residuals, iterations)


def _primal(damages: Sequence[float], epsilon: float) -> float:
    return max([0.0] + [max(0.0, b - epsilon) / epsilon for b in damages])


def firm_project_all(
    base: Mapping[str, torch.Tensor],
    constraints: Mapping[str, Sequence[torch.Tensor]],
    epsilon: float,
    overwrite: bool = False,
) -> tuple[TensorDict, dict[str, ProjectionReport]]:
    """``project`` applied to every tensor name (the budget ``epsilon`` holds per tensor, per client).

    The tensors share one ``_Workspace``, so only the first pays for fresh scratch memory.
    ``overwrite=True`` projects every tensor of ``base`` in place (see ``project``)."""
    check_epsilon(epsilon)
    workspace = _Workspace()
    projected: TensorDict = {}
    reports: dict[str, ProjectionReport] = {}
    for name, tensor in base.items():
        projected[name], reports[name] = _project(tensor, constraints.get(name, []), epsilon, workspace, overwrite)
    return projected, reports
