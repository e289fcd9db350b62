"""Resurfacing diagnostics (the Lethe paper, eq. 5, eq. 24, section V-D)."""

import math

import pytest
import torch

from tasks.diagnostics import (
    forgetting_dispersion,
    interpolate_states,
    kr_curve_rr,
    lmc_barrier,
    pca_scatter_png,
    resurfacing_summary,
    rollback_tendency,
)


def test_rr_zero_when_curve_stays_at_or_below_retrain():
    assert kr_curve_rr(0.99, 0.05, [0.01, 0.03, 0.05]) == 0.0


def test_rr_hundred_when_curve_climbs_back_to_original():
    assert kr_curve_rr(0.9, 0.1, [0.1, 0.5, 0.9, 0.7]) == pytest.approx(100.0)


def test_rr_partial_uses_the_peak_not_the_last_round():
    assert kr_curve_rr(0.8, 0.0, [0.2, 0.4, 0.1]) == pytest.approx(50.0)


def test_rr_degenerate_denominator_is_nan():
    assert math.isnan(kr_curve_rr(0.1, 0.1, [0.5]))
    assert math.isnan(kr_curve_rr(0.05, 0.1, [0.5]))
    assert math.isnan(kr_curve_rr(0.9, 0.1, []))  # no continued round: nothing to measure


def test_resurfacing_summary_ct_kr_is_last_round():
    summary = resurfacing_summary(0.9, 0.02, 0.1, [0.1, 0.5, 0.3])
    assert summary["ct_kr"] == 0.3
    assert math.isnan(resurfacing_summary(0.9, 0.02, 0.1, [])["ct_kr"])
    assert summary["kr_unlearned"] == 0.02
    assert summary["rr"] == pytest.approx(50.0)
    assert set(summary) == {"kr_original", "kr_unlearned", "kr_retrain", "kr_curve", "ct_kr", "rr"}


def test_fd_identical_points_zero_and_spread_points_positive():
    assert forgetting_dispersion(torch.ones(10, 4) * 3.0) == 0.0
    # points at +-e_i around 0: each squared distance to the mean is 1
    spread = torch.cat([torch.eye(3), -torch.eye(3)])
    assert forgetting_dispersion(spread) == pytest.approx(1.0)
    assert forgetting_dispersion(2 * spread) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="features"):
        forgetting_dispersion(torch.ones(5))


def test_rollback_tendency_on_constructed_updates():
    original = {"w": torch.tensor([1.0, 0.0]), "n": torch.tensor(5)}
    unlearned = {"w": torch.tensor([0.0, 0.0]), "n": torch.tensor(7)}
    continued = [
        {"w": torch.tensor([0.5, 0.0]), "n": torch.tensor(8)},  # straight back to original: +1
        {"w": torch.tensor([0.5, 2.0]), "n": torch.tensor(9)},  # orthogonal: 0
        {"w": torch.tensor([0.0, 2.0]), "n": torch.tensor(9)},  # away from original: -1
        {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(9)},  # 45 degrees
        {"w": torch.tensor([1.0, 3.0]), "n": torch.tensor(9)},  # no update: undefined
    ]
    rt = rollback_tendency(original, unlearned, continued)
    assert rt[:4] == pytest.approx([1.0, 0.0, -1.0, 1 / math.sqrt(2)])
    assert math.isnan(rt[4])
    with pytest.raises(ValueError, match="'w'"):
        rollback_tendency(original, unlearned, [{"n": torch.tensor(1)}])


def test_pca_png_is_written_atomically_and_valid(tmp_path):
    g = torch.Generator().manual_seed(0)
    feats = {
        name: (torch.randn(40, 6, generator=g), torch.randn(15, 6, generator=g) * scale + 3)
        for name, scale in (("original", 0.1), ("retrained", 2.0), ("unlearned", 1.0))
    }
    target = tmp_path / "plots" / "pca.png"
    assert pca_scatter_png(target, feats) == str(target)
    data = target.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 1000
    assert [p.name for p in target.parent.iterdir()] == ["pca.png"]  # no temp file left
    with pytest.raises(ValueError, match="original"):
        pca_scatter_png(target, {"original": (torch.randn(3, 4), torch.randn(3, 5))})


def test_lmc_barrier_flat_path_zero_and_hill_positive():
    assert lmc_barrier(lambda a: 2.0 + 3.0 * a)["barrier"] == pytest.approx(0.0)
    hill = lmc_barrier(lambda a: 1.0 + 4.0 * a * (1 - a), num_points=5)
    assert hill["barrier"] == pytest.approx(1.0)
    assert hill["alphas"] == [0.0, 0.25, 0.5, 0.75, 1.0]


def test_interpolate_states_end_points_and_midpoint():
    a = {"w": torch.zeros(3), "n": torch.tensor(1)}
    b = {"w": torch.full((3,), 2.0), "n": torch.tensor(9)}
    assert torch.equal(interpolate_states(a, b, 0.0)["w"], a["w"])
    assert torch.equal(interpolate_states(a, b, 1.0)["w"], b["w"])
    mid = interpolate_states(a, b, 0.5)
    assert torch.equal(mid["w"], torch.ones(3)) and mid["n"] == 1
