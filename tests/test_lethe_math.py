"""Lethe rectification math (the Lethe paper, eqs. 8-13, Proposition IV.1)."""

import math

import pytest
import torch

from strategies.common.updates import apply_update, weighted_average
from strategies.lethe.maths import (
    check_gamma,
    clip_to_reference,
    feasible_gamma_range,
    gamma_bounds,
    layer_alignment,
    layer_gammas,
    remove_forget_component,
    rectify,
)

SHAPES = {"conv.weight": (4, 3, 3, 3), "conv.bias": (4,), "fc.weight": (10, 7), "fc.bias": (10,), "zero.weight": (5, 2)}


def random_streams(seed: int, correlation: float):
    """Retain/forget layers where the retain stream partly follows the forget stream; one zero forget layer."""
    g = torch.Generator().manual_seed(seed)
    forget, retain = {}, {}
    for name, shape in SHAPES.items():
        u = torch.randn(shape, generator=g)
        if name == "zero.weight":
            u = torch.zeros(shape)
        sign = 1.0 if torch.rand((), generator=g) < 0.6 else -1.0
        retain[name] = sign * correlation * u + torch.randn(shape, generator=g)
        forget[name] = u
    return retain, forget


def inner(a, b):
    return float(torch.dot(a.reshape(-1).double(), b.reshape(-1).double()))


def tolerance(a, b):
    return 1e-5 * (a.double().norm() * b.double().norm()).item() + 1e-12


@pytest.mark.parametrize("seed", range(40))
def test_gamma_inside_bounds_gives_prop_iv1_inequalities_in_every_layer(seed):
    retain, forget = random_streams(seed, correlation=0.3 + 0.1 * (seed % 7))
    bounds = gamma_bounds(retain, forget)
    alignment = layer_alignment(retain, forget)
    assert bounds["zero.weight"] is None  # zero forget layer -> s = 0
    for name, bound in bounds.items():
        # one gamma per layer, drawn inside that layer's own interval (eq. 13)
        gamma = 1.0 if bound is None else bound[0] + (bound[1] - bound[0]) * ((seed % 5) / 4)
        assert check_gamma(bounds, gamma)[name]
        rectified = rectify(retain, forget, gamma)[name]
        assert inner(rectified, forget[name]) <= tolerance(rectified, forget[name])
        assert inner(rectified, retain[name]) >= -tolerance(rectified, retain[name])
        if alignment[name] <= 0:
            assert torch.equal(rectified, -forget[name])
        else:
            assert torch.allclose(rectified, retain[name] - gamma * forget[name])


def test_negative_alignment_returns_negated_forget_for_any_gamma():
    u = torch.tensor([1.0, 2.0, -1.0])
    r = torch.tensor([-3.0, 0.5, 1.0])  # <r, u> = -3 + 1 - 1 = -3
    for gamma in (0.01, 1.0, 50.0):
        out = rectify({"a": r}, {"a": u}, gamma)
        assert torch.equal(out["a"], -u)
    assert gamma_bounds({"a": r}, {"a": u})["a"] is None
    assert check_gamma({"a": None}, 123.0)["a"]


@pytest.mark.parametrize("seed", range(10))
def test_gamma_outside_bounds_is_flagged_and_violates_an_inequality(seed):
    retain, forget = random_streams(seed, correlation=2.0)
    bounds = gamma_bounds(retain, forget)
    active = [n for n, b in bounds.items() if b is not None]
    assert active
    for name in active:
        low, high = bounds[name]
        for gamma, which in ((0.5 * low, "forget"), (2.0 * high, "retain")):
            assert not check_gamma(bounds, gamma)[name]
            rectified = rectify(retain, forget, gamma)[name]
            if which == "forget":  # too weak: still moves along the forget stream
                assert inner(rectified, forget[name]) > 0
            else:  # too strong: works against the retain stream
                assert inner(rectified, retain[name]) < 0


def test_bounds_match_eq13_and_feasible_range_is_eq18():
    r = {"a": torch.tensor([2.0, 0.0]), "b": torch.tensor([1.0, 1.0])}
    u = {"a": torch.tensor([1.0, 1.0]), "b": torch.tensor([0.0, -1.0])}
    bounds = gamma_bounds(r, u)
    assert bounds["a"] == pytest.approx((2.0 / 2.0, 4.0 / 2.0))
    assert bounds["b"] is None
    assert feasible_gamma_range(bounds) == pytest.approx((1.0, 2.0))
    assert feasible_gamma_range({"b": None}) is None


def test_apply_update_adds_rectified_update_and_keeps_other_layers():
    w = {"a": torch.tensor([1.0, 2.0]), "n": torch.tensor(3)}
    out = apply_update(w, {"a": torch.tensor([0.5, -1.0])})
    assert torch.equal(out["a"], torch.tensor([1.5, 1.0]))
    assert torch.equal(out["n"], w["n"])
    half = apply_update(w, {"a": torch.tensor([0.5, -1.0])}, server_lr=0.5)
    assert torch.equal(half["a"], torch.tensor([1.25, 1.5]))
    assert torch.equal(w["a"], torch.tensor([1.0, 2.0]))  # input untouched


def test_weighted_average_uses_normalised_counts():
    g = torch.Generator().manual_seed(0)
    ups = [{"x": torch.randn(3, 2, generator=g)} for _ in range(3)]
    counts = [10, 30, 60]
    expected = sum(c / 100 * u["x"] for c, u in zip(counts, ups))
    assert torch.allclose(weighted_average(ups, counts)["x"], expected, atol=1e-6)
    assert torch.allclose(weighted_average(ups, [1, 0, 0])["x"], ups[0]["x"])


@pytest.mark.parametrize("gamma", [0, -1.0, math.nan, math.inf])
def test_bad_gamma_names_the_setting(gamma):
    with pytest.raises(ValueError, match="lethe.gamma"):
        rectify({"a": torch.ones(2)}, {"a": torch.ones(2)}, gamma)
    with pytest.raises(ValueError, match="lethe.gamma"):
        check_gamma({"a": None}, gamma)


def test_mismatched_layers_name_the_layer():
    with pytest.raises(ValueError, match="fc.bias"):
        rectify({"fc.bias": torch.ones(2)}, {"fc.bias": torch.ones(3)}, 1.0)
    with pytest.raises(ValueError, match="only_here"):
        layer_alignment({"a": torch.ones(2), "only_here": torch.ones(1)}, {"a": torch.ones(2)})
    with pytest.raises(ValueError, match="fc.weight"):
        weighted_average([{"fc.weight": torch.ones(2)}, {"fc.weight": torch.ones(2, 1)}], [1, 1])
    with pytest.raises(ValueError, match="ghost"):
        apply_update({"a": torch.ones(1)}, {"ghost": torch.ones(1)})
    with pytest.raises(ValueError, match="weights"):
        weighted_average([{"a": torch.ones(1)}], [0])


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("gamma", [1e-3, 0.2, 1.0, 100.0])
def test_clamped_gammas_satisfy_proposition_for_any_configured_gamma(seed, gamma):
    g = torch.Generator().manual_seed(seed)
    forget = {f"l{i}": torch.randn(5, 4, generator=g) for i in range(4)}
    retain = {k: 0.5 * v + 0.7 * torch.randn(5, 4, generator=g) for k, v in forget.items()}
    gammas = layer_gammas(gamma_bounds(retain, forget), gamma, "clamp")
    for k in retain:
        out = rectify({k: retain[k]}, {k: forget[k]}, gammas[k])[k]
        assert torch.dot(out.flatten(), forget[k].flatten()) <= 1e-5
        assert torch.dot(out.flatten(), retain[k].flatten()) >= -1e-5
    assert layer_gammas(gamma_bounds(retain, forget), gamma, "fixed") == {k: gamma for k in retain}


def test_clip_to_reference_bounds_the_norm_and_keeps_direction():
    update = {"a": torch.full((3,), 4.0), "b": torch.full((2,), 3.0)}
    reference = {"a": torch.ones(3), "b": torch.zeros(2)}
    out = clip_to_reference(update, reference, 2.0)
    norm = torch.sqrt(sum((v ** 2).sum() for v in out.values()))
    assert norm == pytest.approx(2.0 * 3 ** 0.5, rel=1e-6)
    assert torch.allclose(out["a"] / out["a"].norm(), update["a"] / update["a"].norm())
    assert clip_to_reference(update, reference, 0.0) is update
    small = {"a": torch.full((3,), 0.1), "b": torch.zeros(2)}
    assert clip_to_reference(small, reference, 1.0) is small


@pytest.mark.parametrize("seed", range(8))
def test_upper_gamma_is_the_strongest_forgetting_that_keeps_the_retain_stream(seed):
    g = torch.Generator().manual_seed(seed)
    forget = {f"l{i}": torch.randn(5, 4, generator=g) for i in range(4)}
    retain = {k: 0.5 * v + 0.7 * torch.randn(5, 4, generator=g) for k, v in forget.items()}
    bounds = gamma_bounds(retain, forget)
    upper = layer_gammas(bounds, 0.2, "upper")
    clamped = layer_gammas(bounds, 0.2, "clamp")
    for k in retain:
        out = rectify({k: retain[k]}, {k: forget[k]}, upper[k])[k]
        if bounds[k] is None:
            assert upper[k] == 0.2
            continue
        assert upper[k] == bounds[k][1] >= clamped[k]
        # on the upper bound the update is orthogonal to the retain stream ...
        assert torch.dot(out.flatten(), retain[k].flatten()) == pytest.approx(0.0, abs=1e-4)
        # ... and opposes the forget stream at least as much as any clamped gamma's update
        mild = rectify({k: retain[k]}, {k: forget[k]}, clamped[k])[k]
        assert torch.dot(out.flatten(), forget[k].flatten()) <= torch.dot(mild.flatten(), forget[k].flatten()) + 1e-5


@pytest.mark.parametrize("seed", range(8))
def test_removing_the_forget_component_never_relearns_and_still_helps_retain(seed):
    g = torch.Generator().manual_seed(seed)
    forget = {f"l{i}": torch.randn(6, 3, generator=g) for i in range(5)}
    retain = {k: (0.6 if i % 2 else -0.6) * v + torch.randn(6, 3, generator=g)
              for i, (k, v) in enumerate(forget.items())}
    out = remove_forget_component(retain, forget)
    aligned = {k: s > 0 for k, s in layer_alignment(retain, forget).items()}
    assert any(aligned.values()) and not all(aligned.values())
    for k in retain:
        dot_u = float(torch.dot(out[k].flatten(), forget[k].flatten()))
        if aligned[k]:
            assert dot_u == pytest.approx(0.0, abs=1e-4)  # orthogonal to the forget stream
        else:
            assert torch.equal(out[k], retain[k])  # untouched where they do not align
        assert dot_u <= 1e-4
        assert float(torch.dot(out[k].flatten(), retain[k].flatten())) >= -1e-5
        assert out[k].norm() <= retain[k].norm() + 1e-6
    zero = remove_forget_component({"a": torch.ones(3)}, {"a": torch.zeros(3)})
    assert torch.equal(zero["a"], torch.ones(3))


def test_per_layer_gammas_match_one_call_per_layer():
    retain, forget = random_streams(3, correlation=0.5)
    gammas = {k: 0.1 * (i + 1) for i, k in enumerate(retain)}
    together = rectify(retain, forget, gammas)
    for k in retain:
        assert torch.equal(together[k], rectify({k: retain[k]}, {k: forget[k]}, gammas[k])[k])
    bounds = gamma_bounds(retain, forget)
    assert check_gamma(bounds, gammas) == {k: check_gamma({k: bounds[k]}, gammas[k])[k] for k in bounds}
    with pytest.raises(ValueError, match="no gamma for layer"):
        rectify(retain, forget, dict(list(gammas.items())[1:]))
