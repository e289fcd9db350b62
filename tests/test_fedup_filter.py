"""FedUP's plug-in filter: shapes, validation, frozen head, determinism, and that it diverts a class."""

import pytest
import torch
from torch import nn

from strategies.fedup.centroids import class_centroids, divert_targets, relabel_per_class
from strategies.fedup.filter import FedUPFilter, build_plugin, train_filter
from tasks.model import SplitModel

NUM_CLASSES, DIM, FORGET = 4, 16, 0
LR = 0.05  # what fedup.lr=0 resolves to on the digits task (its lr)


def nearest_mean_head(means: torch.Tensor) -> nn.Linear:
    """A frozen linear head that predicts the class of the nearest mean."""
    head = nn.Linear(DIM, NUM_CLASSES)
    with torch.no_grad():
        head.weight.copy_(means)
        head.bias.copy_(-0.5 * (means**2).sum(dim=1))
    return head


def blob_problem(seed: int):
    """Four Gaussian blobs in d=16 and a frozen nearest-mean linear head that separates them."""
    g = torch.Generator().manual_seed(seed)
    means = 2.0 * torch.randn(NUM_CLASSES, DIM, generator=g)
    head = nearest_mean_head(means)

    def sample(per_class: int):
        y = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
        return means[y] + 0.5 * torch.randn(len(y), DIM, generator=g), y

    return head, sample


def small_data(seed=0, m=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, DIM, generator=g), torch.randint(0, NUM_CLASSES, (m,), generator=g)


def test_filter_maps_batch_to_same_shape_and_plugs_into_split_model():
    f = FedUPFilter(DIM, 32, seed=0)
    assert f(torch.randn(5, DIM)).shape == (5, DIM)
    model = SplitModel(nn.Identity(), nn.Linear(DIM, NUM_CLASSES), DIM)
    model.plugins.append(f)
    assert model(torch.randn(3, DIM)).shape == (3, NUM_CLASSES)
    assert f.encoder.out_features == 32


def test_official_shape_has_no_biases_and_a_relu_output_signed_has_both_the_other_way():
    official, signed = FedUPFilter(DIM, 32, seed=0), FedUPFilter(DIM, 32, seed=0, shape="signed")
    assert official.shape == "official"  # the default: the official code's Adapter
    assert official.encoder.bias is None and official.decoder.bias is None
    assert sorted(n for n, _ in official.named_parameters()) == ["decoder.weight", "encoder.weight"]
    z = torch.randn(64, DIM)
    assert bool((official(z) >= 0).all())
    assert signed.encoder.bias is not None and bool((signed(z) < 0).any())
    with pytest.raises(ValueError, match="fedup.filter"):
        FedUPFilter(DIM, shape="residual")


def test_plugin_spec_names_the_shape_and_an_old_spec_builds_the_signed_one():
    assert build_plugin({"bottleneck": 8, "seed": 1, "shape": "official"}, DIM).shape == "official"
    old = build_plugin({"bottleneck": 8, "seed": 1}, DIM)
    assert old.shape == "signed" and old.encoder.bias is not None


def test_filter_init_depends_only_on_seed():
    a, b, c = FedUPFilter(DIM, seed=3), FedUPFilter(DIM, seed=3), FedUPFilter(DIM, seed=4)
    assert torch.equal(a.encoder.weight, b.encoder.weight)
    assert not torch.equal(a.encoder.weight, c.encoder.weight)


@pytest.mark.parametrize("bottleneck", [0, -2])
def test_bad_bottleneck_rejected(bottleneck):
    with pytest.raises(ValueError, match="fedup.bottleneck"):
        FedUPFilter(DIM, bottleneck)


@pytest.mark.parametrize(
    "kwargs, key",
    [
        ({"alpha": -0.1}, "fedup.alpha"),
        ({"alpha": 1.5}, "fedup.alpha"),
        ({"epochs": 0}, "fedup.epochs"),
        ({"lr": 0.0}, "fedup.lr"),
        ({"batch_size": 0}, "fedup.batch-size"),
        ({"optimizer": "rmsprop"}, "fedup.optimizer"),
    ],
)
def test_bad_training_settings_rejected(kwargs, key):
    x, y = small_data()
    with pytest.raises(ValueError, match=key):
        train_filter(FedUPFilter(DIM), nn.Linear(DIM, NUM_CLASSES), x, y, **{"lr": LR, **kwargs})


def test_mismatched_centroids_and_labels_rejected():
    x, y = small_data()
    with pytest.raises(ValueError, match="centroids"):
        train_filter(FedUPFilter(DIM), nn.Linear(DIM, NUM_CLASSES), x, y[:-1], lr=LR)


def test_head_is_left_bit_identical_and_mode_restored():
    head = nn.Sequential(nn.Linear(DIM, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, NUM_CLASSES))
    head.train()
    before = {k: v.clone() for k, v in head.state_dict().items()}
    f = FedUPFilter(DIM, seed=0)
    f_before = [p.clone() for p in f.parameters()]
    x, y = small_data()
    train_filter(f, head, x, y, lr=LR, epochs=5, batch_size=8, seed=0)
    after = head.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in head.parameters())
    assert head.training
    assert any(not torch.equal(a, b) for a, b in zip(f_before, f.parameters()))


def test_training_is_deterministic_under_seed():
    x, y = small_data()
    head = nn.Linear(DIM, NUM_CLASSES)
    runs = []
    for seed in (1, 1, 2):
        f = FedUPFilter(DIM, seed=0)
        history = train_filter(f, head, x, y, epochs=5, batch_size=8, seed=seed, optimizer="sgd", lr=0.01)
        runs.append((f.state_dict(), history))
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])
    assert runs[0][1] == runs[1][1]
    assert any(not torch.equal(runs[0][0][k], runs[2][0][k]) for k in runs[0][0])


def test_history_has_one_entry_per_epoch_and_losses_combine_with_alpha():
    x, y = small_data()
    history = train_filter(FedUPFilter(DIM), nn.Linear(DIM, NUM_CLASSES), x, y, lr=LR, alpha=0.3, epochs=4,
                           batch_size=24)
    assert all(len(v) == 4 for v in history.values())
    for total, ce, re in zip(history["total"], history["ce"], history["re"]):
        assert total == pytest.approx(0.3 * ce + 0.7 * re, rel=1e-5)
    assert all(0.0 <= a <= 1.0 for a in history["accuracy"])


def nonnegative_blob_problem(seed: int):
    """Four blobs of non-negative features (as after a ReLU, like LeNet-5's) and a nearest-mean head."""
    g = torch.Generator().manual_seed(seed)
    means = 2.0 * torch.rand(NUM_CLASSES, DIM, generator=g) + 0.5 * (torch.rand(NUM_CLASSES, DIM, generator=g) > 0.5)
    head = nearest_mean_head(means)

    def sample(per_class: int):
        y = torch.arange(NUM_CLASSES).repeat_interleave(per_class)
        return torch.relu(means[y] + 0.3 * torch.randn(len(y), DIM, generator=g)), y

    return head, sample


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_paper_class_unlearning_with_the_default_filter_and_schedule(seed):
    """The paper's class scenario: three clients each relabel the forgotten class to one random other
    class, cluster at rho 0.1; the official filter with the default schedule (SGD, alpha 0.5, 50 epochs,
    batch 10) blocks the class on fresh samples and keeps the others."""
    head, sample = nonnegative_blob_problem(seed)
    centroids, labels = [], []
    for client in range(3):
        x, y = sample(300)
        y[y == FORGET] = relabel_per_class(y[y == FORGET], NUM_CLASSES, seed=100 * seed + client)
        c, cy, _ = class_centroids(x, y, rho=0.1, seed=seed)
        centroids.append(c), labels.append(cy)
    f = FedUPFilter(DIM, seed=seed)
    train_filter(f, head, torch.cat(centroids), torch.cat(labels), lr=LR, seed=seed)  # library defaults
    fresh, fresh_y = sample(200)
    with torch.no_grad():
        assert (head(fresh).argmax(1) == fresh_y).float().mean() > 0.99  # the original model knows all
        hit = head(f(fresh)).argmax(1) == fresh_y
    assert hit[fresh_y == FORGET].float().mean() <= 0.05
    assert hit[fresh_y != FORGET].float().mean() >= 0.95


def divert_accuracy(seed: int, optimizer: str) -> tuple[float, float]:
    """Forget / retained accuracy of head(filter(z)) on fresh blob samples after training with the
    non-default ``divert`` alternative: signed filter, soft targets, the former schedule passed explicitly."""
    head, sample = blob_problem(seed)
    x, y = sample(100)
    centroids, centroid_labels, _ = class_centroids(x, y, rho=0.1, seed=seed)
    target = divert_targets(centroid_labels, centroid_labels == FORGET, NUM_CLASSES)
    f = FedUPFilter(DIM, seed=seed, shape="signed")
    train_filter(f, head, centroids, target, optimizer=optimizer, seed=seed, alpha=0.8, epochs=200, lr=3e-3,
                 batch_size=256)
    fresh, fresh_y = sample(200)
    with torch.no_grad():
        assert (head(fresh).argmax(1) == fresh_y).float().mean() > 0.99  # the original model knows all
        hit = head(f(fresh)).argmax(1) == fresh_y
    return hit[fresh_y == FORGET].float().mean().item(), hit[fresh_y != FORGET].float().mean().item()


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_divert_alternative_diverts_forget_class_and_keeps_the_rest(seed, optimizer):
    forget_acc, retain_acc = divert_accuracy(seed, optimizer)
    assert forget_acc <= 0.05
    assert retain_acc >= 0.9
