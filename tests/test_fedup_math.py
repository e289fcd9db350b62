"""FedUP server math: DP calibration round trip, paper eq. 22, eq. 12 aggregation, upload and setting checks."""

import math

import numpy as np
import pytest
import torch

from strategies.fedup.maths import (
    aggregate_centroids,
    calibrate_sigma,
    centroid_sensitivity,
    classical_sigma,
    epsilon_spent,
    paper_eq22_epsilon,
    resolve_delta,
    validate_centroid_upload,
)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 3.0, 10.0])
@pytest.mark.parametrize("delta, sensitivity", [(1e-5, 1.0), (1e-3, 0.04)])
def test_calibrate_then_account_round_trips(epsilon, delta, sensitivity):
    sigma = calibrate_sigma(epsilon, delta, sensitivity)
    assert sigma > 0
    assert epsilon_spent(sigma, delta, sensitivity) == pytest.approx(epsilon, rel=1e-3)


def test_sigma_scales_with_sensitivity_and_shrinks_with_epsilon():
    assert calibrate_sigma(1.0, 1e-5, 2.0) == pytest.approx(2 * calibrate_sigma(1.0, 1e-5, 1.0), rel=1e-9)
    assert calibrate_sigma(2.0, 1e-5, 1.0) < calibrate_sigma(1.0, 1e-5, 1.0)


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 0.9])
def test_analytic_calibration_is_tighter_than_classical_bound(epsilon):
    assert classical_sigma(epsilon, 1e-5, 1.0) >= calibrate_sigma(epsilon, 1e-5, 1.0)


def test_no_noise_and_no_target_edge_cases():
    assert epsilon_spent(0.0, 1e-5, 1.0) == math.inf
    assert calibrate_sigma(math.inf, 1e-5, 1.0) == 0.0
    assert paper_eq22_epsilon(0.0, 100, 1.0) == math.inf


def test_paper_eq22_matches_hand_computation():
    # n = 1000, sensitivity 0.02, sigma 0.01: sqrt(2 ln 1250) * 2 = 2 * 3.7768...
    expected = math.sqrt(2 * math.log(1250.0)) * 0.02 / 0.01
    assert paper_eq22_epsilon(0.01, 1000, 0.02) == pytest.approx(expected, rel=1e-12)
    assert paper_eq22_epsilon(0.01, 1000, 0.02) == pytest.approx(7.5536, abs=1e-3)


def test_centroid_sensitivity_bounds():
    assert centroid_sensitivity(2.0, [5, 3, 10]) == pytest.approx(2 * 2.0 / 3)
    assert centroid_sensitivity(2.0, torch.tensor([5, 3, 10, 1]), bound="any-clustering") == pytest.approx(8.0)
    # the safe bound is never below the fixed-cluster one
    assert centroid_sensitivity(1.0, [1, 4], bound="any-clustering") >= centroid_sensitivity(1.0, [1, 4])
    with pytest.raises(ValueError, match="bound"):
        centroid_sensitivity(1.0, [1], bound="tight")
    with pytest.raises(ValueError, match="counts"):
        centroid_sensitivity(1.0, [0, 2])


def test_eq21_sensitivity_is_the_diameter_over_the_client_count():
    # paper eq. 21: max_{p,q} ||d_p - d_q|| / n_i, n_i the client's released samples (the counts' sum)
    assert centroid_sensitivity(math.inf, [5, 3, 2], bound="eq21", diameter=4.0) == pytest.approx(0.4)
    assert centroid_sensitivity(1.0, [5, 3, 2], bound="eq21", diameter=4.0) == pytest.approx(0.4)  # clip unused
    for diameter in (None, 0.0, math.inf):
        with pytest.raises(ValueError, match="diameter"):
            centroid_sensitivity(math.inf, [5], bound="eq21", diameter=diameter)


@pytest.mark.parametrize("bound", ["fixed-clusters", "any-clustering"])
def test_clip_bounds_need_a_finite_clip(bound):
    with pytest.raises(ValueError, match="fedup.clip"):
        centroid_sensitivity(math.inf, [5, 3], bound=bound)


def test_delta_zero_means_one_over_the_client_count():
    assert resolve_delta(0.0, 250) == pytest.approx(1 / 250)
    assert resolve_delta(1e-5, 250) == 1e-5
    with pytest.raises(ValueError, match="n >= 2"):
        resolve_delta(0.0, 1)


def test_paper_setting_gives_the_papers_scale_of_noise():
    """epsilon 10 at delta 1/n_i and eq. 21's sensitivity: sigma is a fraction of the sensitivity, and the
    analytic Gaussian asks for at least the paper's classical sigma (which is not valid above epsilon 1)."""
    n, diameter = 200, 30.0
    sensitivity = centroid_sensitivity(math.inf, [n], bound="eq21", diameter=diameter)
    sigma = calibrate_sigma(10.0, resolve_delta(0.0, n), sensitivity)
    assert sigma >= classical_sigma(10.0, 1 / n, sensitivity)
    assert 0.2 * sensitivity < sigma < 0.5 * sensitivity
    assert paper_eq22_epsilon(sigma, n, sensitivity) < 10.0 < paper_eq22_epsilon(0.5 * sigma, n, sensitivity)


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: calibrate_sigma(0.0, 1e-5, 1.0), "fedup.epsilon"),
        (lambda: calibrate_sigma(1.0, 1.0, 1.0), "fedup.delta"),
        (lambda: calibrate_sigma(1.0, 1e-5, 0.0), "sensitivity"),
        (lambda: epsilon_spent(-1.0, 1e-5, 1.0), "fedup.sigma"),
    ],
)
def test_bad_privacy_arguments_rejected(call, key):
    with pytest.raises(ValueError, match=key):
        call()


def test_aggregate_is_concatenation_in_client_order():
    a = (torch.ones(2, 3), torch.tensor([0, 1]))
    b = (torch.zeros(1, 3), torch.tensor([2]))
    c, y = aggregate_centroids([a, b])
    assert torch.equal(c, torch.cat([a[0], b[0]]))
    assert y.tolist() == [0, 1, 2] and y.dtype == torch.long
    with pytest.raises(ValueError, match="uploads"):
        aggregate_centroids([])


def good_upload():
    return torch.randn(4, 6), torch.tensor([0, 1, 2, 2])


def test_valid_upload_passes():
    c, y = good_upload()
    assert validate_centroid_upload(c, y, feature_dim=6, num_classes=3) is None
    assert validate_centroid_upload(c.numpy(), y.numpy(), feature_dim=6, num_classes=3) is None


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda c, y: (c.clone().index_fill_(0, torch.tensor([1]), float("nan")), y), "NaN"),
        (lambda c, y: (c.clone().index_fill_(0, torch.tensor([0]), float("inf")), y), "Inf"),
        (lambda c, y: (c[:, :5], y), "width"),
        (lambda c, y: (c[None], y), "2-D"),
        (lambda c, y: (c, y[:, None]), "1-D"),
        (lambda c, y: (c, torch.tensor([0, 1, 3, 2])), "outside"),
        (lambda c, y: (c, torch.tensor([0, -1, 2, 2])), "outside"),
        (lambda c, y: (c, y[:3]), "labels"),
        (lambda c, y: (c[:0], y[:0]), "no centroids"),
        (lambda c, y: (c, y.float()), "integers"),
        (lambda c, y: (c.long(), y), "floating"),
    ],
)
def test_bad_uploads_give_a_reason(mutate, fragment):
    c, y = mutate(*good_upload())
    reason = validate_centroid_upload(c, y, feature_dim=6, num_classes=3)
    assert reason is not None and fragment in reason and "\n" not in reason


def test_numpy_floats_accepted():
    assert calibrate_sigma(np.float64(1.0), np.float64(1e-5), np.float32(1.0)) > 0
