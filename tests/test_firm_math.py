"""FIRM server math: pooling, normalisation/Top-alpha, Fisher-weighted merge, retention projection."""

import math

import pytest
import torch
from scipy.optimize import minimize

from strategies.firm import projection as firm_projection
from strategies.firm.maths import (firm_merge, fisher_weighted_average, normalise_and_sparsify, pool_by_domain,
                                   validate_upload)
from strategies.firm.projection import firm_project_all, project, proxy_damage


def _problem(seed: int, d: int, m: int, density: float = 0.4, tightness: float = 0.3):
    """Random base merge and m sparse retain Fishers with a budget that makes the projection active."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(d, generator=g, dtype=torch.float64)
    fishers = [torch.rand(d, generator=g, dtype=torch.float64) * (torch.rand(d, generator=g) < density) for _ in range(m)]
    epsilon = tightness * min(proxy_damage(base, f) for f in fishers)
    return base, fishers, epsilon


def _slsqp(base, fishers, epsilon):
    b = base.numpy()
    fs = [f.numpy() for f in fishers]
    constraints = [
        {"type": "ineq", "fun": (lambda x, f=f: (epsilon - f @ (x * x)) / epsilon), "jac": (lambda x, f=f: -2 * f * x / epsilon)}
        for f in fs
    ]
    result = minimize(
        lambda x: float((x - b) @ (x - b)),
        0.5 * b,
        jac=lambda x: 2 * (x - b),
        constraints=constraints,
        method="SLSQP",
        options={"ftol": 1e-12, "maxiter": 1000},
    )
    assert result.success or result.status == 8, result.message  # 8: stopped at rounding level
    return torch.from_numpy(result.x)


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_projection_matches_brute_force_solver(m, seed):
    base, fishers, epsilon = _problem(seed, d=40, m=m)
    x, report = project(base, fishers, epsilon)
    reference = _slsqp(base, fishers, epsilon)
    assert torch.linalg.norm(x - reference) <= 1e-6 * torch.linalg.norm(reference)
    assert all(b <= epsilon * (1 + 1e-6) for b in report.damages)
    assert report.residuals.worst() <= 1e-6


def test_projection_lets_multipliers_fall_back_to_zero():
    """Constraint 2 binds alone but is violated first: an increase-only routine keeps lambda_1 > 0."""
    g = torch.Generator().manual_seed(3)
    d = 60
    base = torch.randn(d, generator=g, dtype=torch.float64)
    f1 = torch.zeros(d, dtype=torch.float64)
    f1[:30] = 1.0
    f2 = f1.clone() * 4.0
    f2[30:] = 0.5
    epsilon = 0.5 * proxy_damage(base, f1)
    x, report = project(base, [f1, f2], epsilon)
    reference = _slsqp(base, [f1, f2], epsilon)
    assert torch.linalg.norm(x - reference) <= 1e-6 * torch.linalg.norm(reference)
    assert report.lambdas[0] == 0.0 and report.lambdas[1] > 0
    assert report.residuals.worst() <= 1e-6


def test_identical_retain_fishers_are_solved_despite_singular_hessian():
    base, fishers, epsilon = _problem(5, d=200, m=1)
    x, report = project(base, [fishers[0], fishers[0].clone()], epsilon)
    x_single, _ = project(base, fishers, epsilon)
    assert torch.allclose(x, x_single, rtol=1e-7, atol=1e-12)
    assert report.residuals.worst() <= 1e-6


@pytest.mark.parametrize("m", [1, 2])
def test_projection_at_a_million_coordinates(m):
    base, fishers, epsilon = _problem(7, d=10**6, m=m, density=0.1)
    x, report = project(base.float(), [f.float() for f in fishers], epsilon)
    assert x.dtype == torch.float32 and x.shape == base.shape
    assert all(proxy_damage(x, f) <= epsilon * (1 + 1e-6) for f in fishers)
    assert report.residuals.worst() <= 1e-6
    assert min(report.lambdas) > 0


@pytest.mark.parametrize("m", [1, 2, 3])
def test_sampled_start_and_chunked_evaluations_reach_the_cold_start_solution(m, monkeypatch):
    """Supports large enough for the sampled starting point (and many evaluation chunks, the last one
    partial) give the same projection as the cold start from a coordinate sweep."""
    base, fishers, epsilon = _problem(8, d=10**6, m=m, density=0.3)
    base, fishers = base.float(), [f.float() for f in fishers]
    starts = []
    sampled = firm_projection._starting_point
    monkeypatch.setattr(firm_projection, "_starting_point", lambda *args: starts.append(sampled(*args)) or starts[-1])
    x, report = project(base, fishers, epsilon)
    assert starts[0] is not None
    monkeypatch.setattr(firm_projection, "_SAMPLE_STRIDE", 10**9)  # no sample: cold start
    x_cold, report_cold = project(base, fishers, epsilon)
    assert torch.allclose(torch.tensor(report.lambdas), torch.tensor(report_cold.lambdas), rtol=1e-9, atol=0)
    assert torch.allclose(x, x_cold, rtol=1e-6, atol=0)
    assert all(proxy_damage(x, f) <= epsilon * (1 + 1e-6) for f in fishers)
    assert report.residuals.worst() <= 1e-6 and min(report.lambdas) > 0


def test_project_all_reuses_scratch_across_tensors_of_different_sizes():
    """One call over tensors of several sizes and dtypes equals projecting each tensor on its own."""
    problems = {
        "large": _problem(20, d=400_000, m=2, density=0.4),
        "small": _problem(21, d=1000, m=2),
        "medium": _problem(22, d=300_000, m=2, density=0.4),
    }
    base = {name: b.float() if name != "small" else b for name, (b, _, _) in problems.items()}
    constraints = {name: [f.to(base[name].dtype) for f in fs] for name, (_, fs, _) in problems.items()}
    epsilon = min(e for _, _, e in problems.values())
    projected, reports = firm_project_all(base, constraints, epsilon)
    for name in base:
        alone, report = project(base[name], constraints[name], epsilon)
        assert torch.equal(projected[name], alone) and reports[name] == report
        assert report.residuals.worst() <= 1e-6


@pytest.mark.parametrize("m", [1, 2, 3])
def test_support_pass_is_independent_of_its_chunking(m, monkeypatch):
    """The chunked support pass finds the dense mask's positions and gives the same projection for any
    chunk size (many chunks with a partial last one, or one chunk for the whole tensor)."""
    base, fishers, epsilon = _problem(30, d=300_001, m=m, density=0.2)
    base, fishers = base.float(), [f.float() for f in fishers]
    support, base_wide, b2, F = firm_projection._gather_support(base, fishers, None, firm_projection._Workspace())
    dense = torch.stack(fishers).ne(0).any(0).nonzero().squeeze(1)
    assert torch.equal(support, dense) and torch.equal(base_wide, base[dense].double())
    assert torch.equal(b2, base_wide.square()) and torch.equal(F, torch.stack(fishers)[:, dense].double())
    x, report = project(base, fishers, epsilon)
    for chunk in (1000, 10**6):
        monkeypatch.setattr(firm_projection, "_GATHER_CHUNK", chunk)
        x_chunked, report_chunked = project(base, fishers, epsilon)
        assert torch.equal(x_chunked, x) and report_chunked == report


@pytest.mark.parametrize("m", [1, 2, 3])
@pytest.mark.parametrize("budget", ["active", "feasible", "inf"])
def test_projection_in_place_equals_the_copying_projection(m, budget):
    """``overwrite=True`` returns ``base`` itself, holding exactly the copying projection's result."""
    base, fishers, epsilon = _problem(31, d=400_000, m=m, density=0.3)
    base, fishers = base.float(), [f.float() for f in fishers]
    epsilon = {"active": epsilon, "feasible": 2.0 * max(proxy_damage(base, f) for f in fishers), "inf": math.inf}[budget]
    x, report = project(base, fishers, epsilon)
    original = base.clone()
    x_in_place, report_in_place = project(base, fishers, epsilon, overwrite=True)
    assert x_in_place is base and torch.equal(x_in_place, x) and report_in_place == report
    assert torch.equal(x, original) == (budget != "active")
    assert all(proxy_damage(x_in_place, f) <= epsilon * (1 + 1e-6) for f in fishers)
    projected, reports = firm_project_all({"w": original}, {"w": fishers}, epsilon, overwrite=True)
    assert projected["w"] is original and torch.equal(original, x) and reports["w"] == report
    with pytest.raises(ValueError, match="contiguous"):
        project(torch.zeros(4, 3).t(), [torch.ones(3, 4)], 1.0, overwrite=True)


@pytest.mark.parametrize("m", [1, 3])
def test_feasible_base_is_returned_with_zero_multipliers(m):
    base, fishers, _ = _problem(11, d=500, m=m)
    epsilon = 2.0 * max(proxy_damage(base, f) for f in fishers)
    x, report = project(base, fishers, epsilon)
    assert torch.equal(x, base)
    assert report.lambdas == [0.0] * m


def test_coordinates_outside_every_retain_support_are_left_untouched():
    base, fishers, epsilon = _problem(14, d=300, m=2, density=0.2)
    outside = (fishers[0] == 0) & (fishers[1] == 0)
    x, report = project(base, fishers, epsilon)
    assert bool(outside.any()) and torch.equal(x[outside], base[outside])
    assert report.residuals.worst() <= 1e-6 and max(report.lambdas) > 0
    zero_there = torch.where(outside, base, torch.zeros_like(base))  # infeasible nowhere: nothing moves
    x0, report0 = project(zero_there, fishers, epsilon)
    assert torch.equal(x0, zero_there) and report0.lambdas == [0.0, 0.0] and report0.damages == [0.0, 0.0]


def test_infinite_budget_disables_projection():
    base, fishers, _ = _problem(12, d=100, m=2)
    x, report = project(base, fishers, math.inf)
    assert torch.equal(x, base) and report.lambdas == [0.0, 0.0]


def test_projection_never_increases_a_coordinate_magnitude():
    base, fishers, epsilon = _problem(13, d=1000, m=2)
    x, _ = project(base, fishers, epsilon)
    assert bool((x.abs() <= base.abs()).all())
    assert bool((torch.sign(x) == torch.sign(base)).all())


def test_normalise_and_sparsify_keeps_ties_and_at_least_one():
    fisher = torch.tensor([4.0, 2.0, 2.0, 2.0, 1.0, 0.0, 3.0, 0.5, 0.1, 0.2])
    out = normalise_and_sparsify(fisher, alpha=0.3, eps0=1e-8)  # floor(3) -> 3rd largest is 2.0
    assert torch.equal(out != 0, fisher >= 2.0)  # the three tied 2.0 entries all kept: 5 entries
    assert torch.allclose(out[0], torch.tensor(4.0 / (4.0 + 1e-8)))
    assert float(out.max()) <= 1.0
    tiny = normalise_and_sparsify(fisher, alpha=0.01, eps0=1e-8)  # floor(0.1) = 0 -> keep one
    assert int((tiny != 0).sum()) == 1 and tiny[0] > 0


def test_normalise_and_sparsify_handles_dicts_per_tensor():
    g = torch.Generator().manual_seed(0)
    fishers = {"a": torch.rand(10, 10, generator=g), "b": 100 * torch.rand(50, generator=g)}
    out = normalise_and_sparsify(fishers, alpha=0.1, eps0=1e-8)
    assert int((out["a"] != 0).sum()) == 10 and int((out["b"] != 0).sum()) == 5
    assert all(float(t.max()) == pytest.approx(1.0, rel=1e-6) for t in out.values())


def test_pool_by_domain_means_raw_fisher_before_normalising():
    tvs = [{"w": torch.tensor([1.0, 3.0])}, {"w": torch.tensor([3.0, 5.0])}, {"w": torch.tensor([7.0, 7.0])}]
    fis = [{"w": torch.tensor([1.0, 0.0])}, {"w": torch.tensor([3.0, 10.0])}, {"w": torch.tensor([2.0, 2.0])}]
    pooled_tv, pooled_fi = pool_by_domain(tvs, fis, ["bio", "bio", "cyber"])
    assert list(pooled_tv) == ["bio", "cyber"]
    assert torch.equal(pooled_tv["bio"]["w"], torch.tensor([2.0, 4.0]))
    assert torch.equal(pooled_fi["bio"]["w"], torch.tensor([2.0, 5.0]))
    assert torch.equal(pooled_fi["cyber"]["w"], torch.tensor([2.0, 2.0]))


def test_fisher_weighted_average_is_bounded_and_does_not_grow_with_clients():
    g = torch.Generator().manual_seed(1)
    taus = [torch.randn(1000, generator=g) for _ in range(12)]
    fishers = [torch.rand(1000, generator=g) for _ in range(12)]
    bound = torch.stack(taus).abs().max(0).values
    norms = []
    for n in (1, 3, 12):
        merged = fisher_weighted_average(taus[:n], fishers[:n], eps0=1e-8)
        assert bool((merged.abs() <= torch.stack(taus[:n]).abs().max(0).values * (1 + 1e-6)).all())
        norms.append(float(merged.norm()))
    assert bool((merged.abs() <= bound * (1 + 1e-6)).all())
    # same vector from every client: the merge is that vector (weights sum to just under one)
    same = fisher_weighted_average([taus[0]] * 5, fishers[:5], eps0=1e-8)
    assert torch.allclose(same, taus[0], rtol=1e-5) and bool((same.abs() <= taus[0].abs() * (1 + 1e-6)).all())
    assert norms[2] <= norms[0] * 1.5  # far from the x12 growth of a sum


def test_firm_merge_forms_gamma_times_role_averages():
    forget_tv = [{"w": torch.tensor([2.0, 0.0, -4.0, 1.0])}, {"w": torch.tensor([4.0, 0.0, 0.0, 1.0])}]
    forget_fi = [{"w": torch.tensor([1.0, 0.0, 1.0, 0.0])}, {"w": torch.tensor([1.0, 0.0, 1.0, 0.0])}]
    retain_tv = [{"w": torch.tensor([0.0, 8.0, 2.0, 0.0])}]
    retain_fi = [{"w": torch.tensor([0.0, 2.0, 2.0, 0.0])}]
    base, constraints = firm_merge(forget_tv, forget_fi, ["bio", "bio"], retain_tv, retain_fi, gamma=0.5, alpha=1.0, eps0=1e-8)
    # pooled forget tau = [3, 0, -2, 1], pooled Fisher normalised = [1, 0, 1, 0]; retain normalised = [0, 1, 1, 0]
    w = 1.0 / (1.0 + 1e-8)
    expected = 0.5 * torch.tensor([3.0 * w / (w + 1e-8), 8.0 * w / (w + 1e-8), (-2.0 + 2.0) * w / (w + 1e-8), 0.0])
    assert torch.allclose(base["w"], expected, atol=1e-6)
    assert len(constraints["w"]) == 1 and torch.allclose(constraints["w"][0], torch.tensor([0.0, 1.0, 1.0, 0.0]))
    projected, reports = firm_project_all(base, constraints, epsilon=1.0)
    assert proxy_damage(projected["w"], constraints["w"][0]) <= 1.0 * (1 + 1e-6)
    assert reports["w"].lambdas[0] > 0


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: normalise_and_sparsify(torch.ones(3), alpha=0.0, eps0=1e-8), "firm.alpha"),
        (lambda: normalise_and_sparsify(torch.ones(3), alpha=1.5, eps0=1e-8), "firm.alpha"),
        (lambda: normalise_and_sparsify(torch.ones(3), alpha=0.1, eps0=0.0), "firm.eps0"),
        (lambda: normalise_and_sparsify(torch.tensor([1.0, -1.0]), alpha=0.5, eps0=1e-8), "non-negative"),
        (lambda: normalise_and_sparsify(torch.tensor([1.0, math.nan]), alpha=0.5, eps0=1e-8), "finite"),
        (lambda: project(torch.ones(3), [torch.ones(3)], 0.0), "firm.epsilon"),
        (lambda: project(torch.ones(3), [torch.ones(3)], -1.0), "firm.epsilon"),
        (lambda: project(torch.ones(3), [torch.ones(4)], 1.0), "shapes differ"),
        (lambda: project(torch.ones(3), [torch.tensor([1.0, math.inf, 0.0])], 1.0), "finite"),
        (lambda: project(torch.ones(3), [torch.ones(3), torch.tensor([1.0, -1.0, 0.0])], 1.0), "non-negative"),
        (lambda: project(torch.ones(3), [torch.tensor([0.0, math.nan, 0.0])], 1.0), "finite"),
        (lambda: fisher_weighted_average([torch.ones(3)], [torch.ones(2)], 1e-8), "shapes differ"),
        (lambda: firm_merge([{"w": torch.ones(2)}], [{"w": torch.ones(2)}], [0], [], [], gamma=-1.0), "firm.gamma"),
    ],
)
def test_bad_settings_raise_one_line_value_errors(call, key):
    with pytest.raises(ValueError, match=key) as info:
        call()
    assert "\n" not in str(info.value)


def test_validate_upload_names_the_problem():
    shapes = {"a": (2, 3), "b": (4,)}
    good_tv = {"a": torch.zeros(2, 3), "b": torch.zeros(4)}
    good_fi = {"a": torch.ones(2, 3), "b": torch.ones(4)}
    assert validate_upload(good_tv, good_fi, shapes) is None
    assert "keys" in validate_upload({"a": torch.zeros(2, 3)}, good_fi, shapes)
    assert "shape" in validate_upload({**good_tv, "b": torch.zeros(5)}, good_fi, shapes)
    assert "negative" in validate_upload(good_tv, {**good_fi, "b": -torch.ones(4)}, shapes)
    assert "NaN" in validate_upload({**good_tv, "a": torch.full((2, 3), math.nan)}, good_fi, shapes)
    assert "NaN" in validate_upload(good_tv, {**good_fi, "a": torch.full((2, 3), math.inf)}, shapes)
