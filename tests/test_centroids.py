"""Client-side FedUP pieces: per-class KMeans centroids, forget-class relabelling, clipping, diameter, noise."""

import math

import pytest
import torch

from strategies.fedup.centroids import (
    add_gaussian_noise,
    class_centroids,
    clip_rows,
    divert_targets,
    feature_diameter,
    relabel_forget_rows,
    relabel_per_class,
)


def features(n_per_class=(20, 7, 3), d=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.cat([torch.full((n,), k) for k, n in enumerate(n_per_class)])
    return torch.randn(len(y), d, generator=g) + 3 * y[:, None].float(), y


@pytest.mark.parametrize("rho", [0.1, 0.5, 0.8])
def test_cluster_count_per_class_is_ceil_rho_n(rho):
    x, y = features()
    c, cy, counts = class_centroids(x, y, rho=rho, seed=0)
    for k, n in enumerate((20, 7, 3)):
        assert int((cy == k).sum()) == math.ceil(rho * n)
        assert int(counts[cy == k].sum()) == n
    assert c.shape == (len(cy), 5) and c.dtype == x.dtype


def test_centroids_are_exact_means_of_their_points():
    x, y = features()
    c, cy, counts = class_centroids(x, y, rho=0.2, seed=1)
    for k in range(3):
        # the count-weighted mean of a class's centroids is the class mean
        weighted = (c[cy == k] * counts[cy == k, None]).sum(0) / counts[cy == k].sum()
        assert torch.allclose(weighted, x[y == k].mean(0), atol=1e-5)


def test_rho_one_keeps_every_distinct_point():
    x, y = features()
    x[1] = x[0]  # a duplicate inside class 0
    c, cy, counts = class_centroids(x, y, rho=1.0, seed=0)
    assert len(c) == len(x) - 1
    assert int(counts.max()) == 2 and int(counts.sum()) == len(x)
    for row in x:
        assert bool((c == row).all(dim=1).any())


def test_tiny_and_degenerate_classes():
    x = torch.tensor([[1.0, 2.0], [5.0, 5.0], [5.0, 5.0], [5.0, 5.0], [0.0, 0.0], [1.0, 1.0]])
    y = torch.tensor([0, 1, 1, 1, 2, 2])
    c, cy, counts = class_centroids(x, y, rho=1.0, seed=0)
    assert torch.equal(c[cy == 0], torch.tensor([[1.0, 2.0]]))  # one point -> the point itself
    assert torch.equal(c[cy == 1], torch.tensor([[5.0, 5.0]]))  # identical points -> one centroid
    assert counts[cy == 1].tolist() == [3]
    c, cy, counts = class_centroids(x, y, rho=0.4, seed=0)  # K = 1 -> the class mean
    assert torch.allclose(c[cy == 2], torch.tensor([[0.5, 0.5]]))


def test_centroids_are_deterministic_under_seed():
    x, y = features((60, 40), seed=3)
    a = class_centroids(x, y, rho=0.1, seed=7)
    b = class_centroids(x, y, rho=0.1, seed=7)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_kmeans_finds_well_separated_clusters():
    """Random starts with 5 restarts (the official code's KMeans) recover three far-apart blobs."""
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    x = centres.repeat_interleave(20, dim=0) + 0.1 * torch.randn(60, 2, generator=g)
    c, _, counts = class_centroids(x, torch.zeros(60, dtype=torch.long), rho=0.05, seed=1)
    assert sorted(counts.tolist()) == [20, 20, 20]
    assert all(float((c - m).norm(dim=1).min()) < 0.1 for m in centres)


def test_bad_rho_and_shapes_rejected():
    x, y = features()
    for rho in (0.0, 1.5, -0.2):
        with pytest.raises(ValueError, match="fedup.rho"):
            class_centroids(x, y, rho=rho, seed=0)
    with pytest.raises(ValueError, match="features"):
        class_centroids(x, y[:-1], rho=0.5, seed=0)


def test_relabelled_forget_rows_go_to_every_other_class_only():
    y = torch.tensor([0, 1, 2, 3] * 100)
    mask = y == 2
    out = relabel_forget_rows(y, mask, num_classes=4, seed=0)
    assert not bool((out == 2).any())
    assert set(out[mask].tolist()) == {0, 1, 3}
    assert torch.equal(out[~mask], y[~mask])
    assert torch.equal(out, relabel_forget_rows(y, mask, 4, seed=0))
    assert not torch.equal(out, relabel_forget_rows(y, mask, 4, seed=1))


def test_relabel_mixed_labels_never_keeps_own_label():
    y = torch.tensor([0, 1, 2, 3] * 50)
    mask = torch.arange(200) % 3 == 0
    out = relabel_forget_rows(y, mask, num_classes=4, seed=3)
    assert bool((out[mask] != y[mask]).all()) and torch.equal(out[~mask], y[~mask])


def test_relabel_rejects_bad_mask():
    with pytest.raises(ValueError, match="forget_mask"):
        relabel_forget_rows(torch.tensor([0, 1]), torch.tensor([1, 0]), num_classes=3, seed=0)


def test_divert_targets_is_uniform_over_other_classes():
    y = torch.tensor([0, 2, 1])
    t = divert_targets(y, torch.tensor([False, True, True]), num_classes=3)
    assert torch.equal(t[0], torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(t[1], torch.tensor([0.5, 0.5, 0.0]))
    assert torch.allclose(t[2], torch.tensor([0.5, 0.0, 0.5]))
    assert torch.allclose(t.sum(1), torch.ones(3))


def test_clip_rows_bounds_norms_and_leaves_short_rows_alone():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0], [-6.0, 8.0]])
    out = clip_rows(x, 1.0)
    assert torch.allclose(out.norm(dim=1), torch.tensor([1.0, 0.5, 0.0, 1.0]))
    assert torch.equal(out[1:3], x[1:3])
    assert torch.allclose(out[3], torch.tensor([-0.6, 0.8]))  # direction kept
    with pytest.raises(ValueError, match="fedup.clip"):
        clip_rows(x, 0.0)


def test_infinite_clip_is_no_clipping():
    x = torch.tensor([[300.0, 400.0], [0.3, 0.4]])
    out = clip_rows(x, math.inf)
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_feature_diameter_is_the_largest_pairwise_distance():
    x = torch.tensor([[0.0, 0.0], [3.0, 4.0], [1.0, 1.0], [-3.0, -4.0]])
    assert feature_diameter(x) == pytest.approx(10.0)
    assert feature_diameter(x, block=1) == pytest.approx(10.0)  # blocks see every pair
    assert feature_diameter(x[:1]) == 0.0
    g = torch.Generator().manual_seed(0)
    y = torch.randn(50, 7, generator=g)
    assert feature_diameter(y, block=8) == pytest.approx(float(torch.cdist(y, y).max()), rel=1e-6)


def test_per_class_relabelling_sends_each_class_to_one_other_class():
    """The official code's class scenario: all of a client's forget-class rows get the same random other
    class; another client (seed) may draw another one."""
    y = torch.tensor([2] * 30 + [0] * 5)
    out = relabel_per_class(y, num_classes=4, seed=0)
    assert len(set(out[:30].tolist())) == 1 and int(out[0]) != 2
    assert len(set(out[30:].tolist())) == 1 and int(out[30]) != 0
    assert torch.equal(out, relabel_per_class(y, 4, seed=0))
    draws = {int(relabel_per_class(y[:30], 4, seed=s)[0]) for s in range(40)}
    assert draws == {0, 1, 3}  # across clients: several classes, never the forgotten one
    assert relabel_per_class(torch.zeros(0, dtype=torch.long), 4, seed=0).numel() == 0
    with pytest.raises(ValueError, match="labels"):
        relabel_per_class(torch.tensor([4]), 4, seed=0)


def test_gaussian_noise_has_requested_std_and_is_seeded():
    c = torch.zeros(200, 100)
    noisy = add_gaussian_noise(c, 0.3, seed=0)
    assert abs(noisy.std().item() - 0.3) < 0.01
    assert abs(noisy.mean().item()) < 0.01
    assert torch.equal(noisy, add_gaussian_noise(c, 0.3, seed=0))
    assert not torch.equal(noisy, add_gaussian_noise(c, 0.3, seed=1))
    assert torch.equal(add_gaussian_noise(c, 0.0, seed=0), c)
    with pytest.raises(ValueError, match="fedup.sigma"):
        add_gaussian_noise(c, -1.0, seed=0)
