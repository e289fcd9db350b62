"""Lethe's temporary adapter and its Phase-1 gradient ascent (the Lethe paper, eq. 6)."""

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from strategies.lethe.adapter import LetheAdapter, loss_without_adapter, train_adapter_ascent
from tasks.model import SplitModel, base_state

DIM, CLASSES = 8, 3


def tiny_model(seed: int = 0) -> SplitModel:
    torch.manual_seed(seed)
    features = nn.Sequential(nn.Flatten(), nn.Linear(16, DIM), nn.BatchNorm1d(DIM), nn.ReLU(), nn.Dropout(0.3))
    return SplitModel(features, nn.Linear(DIM, CLASSES), DIM)


def forget_data(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(48, 1, 4, 4, generator=g), torch.randint(0, CLASSES, (48,), generator=g)


def forget_loss(model, x, y):
    model.eval()
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def with_adapter(seed: int = 0) -> SplitModel:
    model = tiny_model(seed)
    model.plugins.append(LetheAdapter(DIM, seed=seed))
    return model


def test_fresh_adapter_is_identity():
    model = tiny_model()
    x, _ = forget_data()
    model.eval()
    before = model(x)
    model.plugins.append(LetheAdapter(DIM, seed=3))
    assert torch.equal(model(x), before)


def test_ascent_raises_forget_loss_and_leaves_backbone_bit_identical():
    model = with_adapter()
    x, y = forget_data()
    model.train()
    backbone = {k: v.clone() for k, v in base_state(model).items()}
    start = forget_loss(model, x, y)
    model.train()
    metrics = train_adapter_ascent(model, 0, (x, y), steps=30, lr=0.5, seed=7)
    assert model.training and model.features[2].training  # flags restored
    assert metrics["steps"] > 0
    assert forget_loss(model, x, y) > start + 0.1
    after = base_state(model)
    assert set(after) == set(backbone)
    assert all(torch.equal(after[k], backbone[k]) for k in backbone)  # weights and BatchNorm buffers
    assert all(p.grad is None for p in model.parameters())


def test_ascent_is_reproducible_and_accepts_a_loader():
    x, y = forget_data()
    runs = []
    for _ in range(2):
        model = with_adapter()
        train_adapter_ascent(model, 0, (x, y), steps=5, lr=0.2, seed=11, batch_size=16)
        runs.append(model.plugins[0].state_dict())
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    model = with_adapter()
    loader = [(x[:16], y[:16]), (x[16:], y[16:])]
    metrics = train_adapter_ascent(model, 0, loader, steps=5, lr=0.2, seed=0)  # cycles the 2 batches
    assert metrics["steps"] == 5


def test_zero_steps_is_a_no_op():
    model = with_adapter()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = train_adapter_ascent(model, 0, forget_data(), steps=0, lr=1.0, seed=0)
    assert metrics["steps"] == 0
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def test_loss_cap_stops_divergence():
    model = with_adapter()
    x, y = forget_data()
    cap = forget_loss(model, x, y) + 1.0
    metrics = train_adapter_ascent(model, 0, (x, y), steps=500, lr=5.0, seed=0, max_loss=cap)
    assert metrics["stopped_early"] == 1
    assert metrics["steps"] < 500
    assert metrics["loss_end"] >= cap
    assert all(torch.isfinite(p).all() for p in model.plugins[0].parameters())


def test_bad_arguments_are_rejected():
    model = with_adapter()
    data = forget_data()
    with pytest.raises(ValueError, match="adapter_index"):
        train_adapter_ascent(model, 1, data, steps=1, lr=0.1, seed=0)
    with pytest.raises(ValueError, match="lethe.adapter-steps"):
        train_adapter_ascent(model, 0, data, steps=-1, lr=0.1, seed=0)
    with pytest.raises(ValueError, match="lethe.adapter-lr"):
        train_adapter_ascent(model, 0, data, steps=1, lr=0.0, seed=0)
    with pytest.raises(ValueError, match="dim"):
        LetheAdapter(0, seed=0)


def test_loss_without_adapter_measures_the_backbone_alone():
    x, y = forget_data()
    plain = tiny_model()
    model = with_adapter()
    model.load_state_dict({**model.state_dict(), **plain.state_dict()})
    train_adapter_ascent(model, 0, (x, y), steps=30, lr=0.5, seed=7)
    backbone_loss = forget_loss(plain, x, y)
    assert forget_loss(model, x, y) > backbone_loss + 0.1  # the composite is amplified
    model.train()
    assert loss_without_adapter(model, x, y, batch_size=5) == pytest.approx(backbone_loss, rel=1e-5)
    assert model.training  # flag restored
    with pytest.raises(ValueError, match="at least one sample"):
        loss_without_adapter(model, x[:0], y[:0])


def test_each_ascent_step_moves_the_adapter_by_lr():
    model = with_adapter()
    before = [p.detach().clone() for p in model.plugins[0].parameters()]
    metrics = train_adapter_ascent(model, 0, forget_data(), steps=1, lr=0.3, seed=2, max_loss=1e6)
    moved = torch.sqrt(sum(((p.detach() - b) ** 2).sum() for p, b in zip(model.plugins[0].parameters(), before)))
    assert metrics["steps"] == 1 and float(moved) == pytest.approx(0.3, rel=1e-4)


def test_a_saturated_model_is_still_ascended_along_its_label_margin():
    """Every forget sample is class 0 with a logit lead of 200: the float32 cross-entropy is 0 and its
    gradient exactly 0. The bounded ascent (guard.bounded-ascent) then lowers the label's margin
    instead, by lr per step, and the margin shrinks; the paper's plain ascent has nothing to follow."""
    model = with_adapter()
    with torch.no_grad():
        model.head.bias.copy_(torch.tensor([200.0, 0.0, 0.0]))
    x, _ = forget_data()
    y = torch.zeros(len(x), dtype=torch.long)

    def margin():
        model.eval()
        with torch.no_grad():
            logits = model(x)
        return float((logits[:, 0] - logits[:, 1:].amax(1)).mean())

    assert forget_loss(model, x, y) == 0.0
    start = margin()
    plain = train_adapter_ascent(model, 0, (x, y), steps=5, lr=0.5, seed=3)
    assert plain["margin_steps"] == 0 and margin() == pytest.approx(start)
    metrics = train_adapter_ascent(model, 0, (x, y), steps=5, lr=0.5, seed=3, max_loss=10.0)
    assert metrics["steps"] == 5 and metrics["margin_steps"] == 5 and metrics["stopped_early"] == 0
    assert margin() < start - 0.1


def test_a_tiny_gradient_step_does_not_overflow_float32():
    """1 / norm of a 1e-41 gradient is past the largest float32 (torch refuses it as alpha); the step
    is formed in float64."""
    from strategies.lethe.adapter import _add_scaled

    param = torch.zeros(3)
    _add_scaled(param, torch.full((3,), 1e-41), 1e40)
    assert param.dtype == torch.float32 and torch.allclose(param, torch.full((3,), 0.1), rtol=1e-3)
    _add_scaled(param, torch.ones(3), 0.5)
    assert torch.allclose(param, torch.full((3,), 0.6), rtol=1e-3)
