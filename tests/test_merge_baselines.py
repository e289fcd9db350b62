"""Merge baselines AVG, SUM, TIES, FULM on hand-checkable vectors."""

import pytest
import torch

from strategies.merges.maths import (
    avg_merge,
    cluster_by_similarity,
    cosine_similarity_matrix,
    fulm_merge,
    sum_merge,
    ties_merge,
    trim_top_k,
)


def _tv(*values):
    return {"w": torch.tensor(values, dtype=torch.float32)}


def test_avg_and_sum_scale_the_mean_and_the_sum():
    tvs = [_tv(1.0, 2.0), _tv(3.0, -6.0)]
    assert torch.equal(avg_merge(tvs, scale=0.5)["w"], torch.tensor([1.0, -1.0]))
    assert torch.equal(sum_merge(tvs, scale=2.0)["w"], torch.tensor([8.0, -8.0]))


def test_trim_keeps_top_magnitudes_with_ties_and_at_least_one():
    t = torch.tensor([0.1, -5.0, 2.0, -2.0, 0.3])
    assert torch.equal(trim_top_k(t, 0.4), torch.tensor([0.0, -5.0, 2.0, -2.0, 0.0]))  # |2| tie kept
    assert torch.equal(trim_top_k(t, 0.01), torch.tensor([0.0, -5.0, 0.0, 0.0, 0.0]))


def test_ties_elects_sign_by_summed_values_and_takes_disjoint_mean():
    tvs = [_tv(3.0, 1.0, -1.0, 0.0), _tv(-1.0, 2.0, -2.0, 4.0), _tv(-1.0, 3.0, 6.0, 0.0)]
    merged = ties_merge(tvs, scale=2.0, density=1.0)["w"]
    # coord 0: sum +1 -> mean of {3} = 3; coord 1: mean{1,2,3} = 2; coord 2: sum +3 -> {6} = 6;
    # coord 3: only one non-zero entry (zeros are not counted) -> 4
    assert torch.equal(merged, 2.0 * torch.tensor([3.0, 2.0, 6.0, 4.0]))


def test_ties_trims_before_electing():
    tvs = [_tv(10.0, -1.0), _tv(-0.5, 9.0)]
    merged = ties_merge(tvs, scale=1.0, density=0.5)["w"]  # trimming removes -1.0 and -0.5
    assert torch.equal(merged, torch.tensor([10.0, 9.0]))


def test_cosine_clusters_are_connected_components_at_threshold():
    tvs = [_tv(1.0, 0.0, 0.0), _tv(0.9, 0.1, 0.0), _tv(0.0, 0.0, 1.0), _tv(0.0, 0.0, 2.0), _tv(0.0, 0.0, 0.0)]
    sim = cosine_similarity_matrix(tvs)
    assert sim[0, 1] == pytest.approx(0.9 / (0.82**0.5))
    assert sim[2, 3] == pytest.approx(1.0) and sim[0, 4] == 0.0
    assert cluster_by_similarity(tvs, 0.6) == [[0, 1], [2, 3], [4]]
    assert cluster_by_similarity(tvs, -1.0) == [[0, 1, 2, 3, 4]]


def test_fulm_sums_ties_centroids_of_clusters():
    tvs = [_tv(2.0, 0.0, 0.0), _tv(4.0, 2.0, 0.0), _tv(0.0, 0.0, 3.0)]
    # clusters {0, 1} (cos = 0.894) and {2}; TIES at density 1 inside: [3, 2, 0] and [0, 0, 3]
    merged = fulm_merge(tvs, scale=0.5, threshold=0.6, density=1.0)["w"]
    assert torch.equal(merged, 0.5 * torch.tensor([3.0, 2.0, 3.0]))
    mean = fulm_merge(tvs, scale=1.0, threshold=0.6, density=1.0, inter="mean")["w"]
    assert torch.equal(mean, torch.tensor([1.5, 1.0, 1.5]))


def test_fulm_grows_with_more_clusters_but_avg_does_not():
    tvs = [{"w": torch.eye(6)[i]} for i in range(6)]  # orthogonal: one cluster each
    norms_fulm = [float(fulm_merge(tvs[:n], scale=1.0)["w"].norm()) for n in (1, 6)]
    norms_avg = [float(avg_merge(tvs[:n])["w"].norm()) for n in (1, 6)]
    assert norms_fulm[1] > 2 * norms_fulm[0]
    assert norms_avg[1] < norms_avg[0]


@pytest.mark.parametrize(
    "call, key",
    [
        (lambda: avg_merge([]), "at least one"),
        (lambda: sum_merge([_tv(1.0)], scale=float("nan")), "merge-scale"),
        (lambda: ties_merge([_tv(1.0)], density=0.0), "ties.density"),
        (lambda: fulm_merge([_tv(1.0)], density=2.0), "fulm.density"),
        (lambda: fulm_merge([_tv(1.0)], inter="max"), "fulm-inter"),
        (lambda: fulm_merge([_tv(1.0)], threshold=2.0), "fulm.threshold"),
        (lambda: avg_merge([_tv(1.0), _tv(1.0, 2.0)]), "shapes"),
        (lambda: avg_merge([_tv(1.0), {"v": torch.ones(1)}]), "names"),
    ],
)
def test_bad_inputs_raise_value_errors(call, key):
    with pytest.raises(ValueError, match=key):
        call()
