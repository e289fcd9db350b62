"""Lethe's temporary adapter (the Lethe paper, section IV-A, Phase 1 "amplify").

The paper only says "a lightweight temporary adapter φ" attached to the frozen backbone and trained
by gradient ascent on the unlearning set (eq. 6). It does not give its form. Our choice, so that it
works for every vision model here without knowing the architecture: a residual bottleneck adapter
that sits in ``SplitModel.plugins`` between the feature extractor and the head,

    adapter(z) = z + W_up · relu(W_down · z + b_down) + b_up,     z ∈ R^(B×d),

with ``W_down: d -> h`` initialised from a seeded generator (Kaiming-uniform, like ``nn.Linear``)
and ``W_up, b_up`` zero-initialised, so a freshly attached adapter is exactly the identity and the
composite model starts as the original model. ``h = max(1, d // 4)`` unless given.

Eq. 6 is plain gradient ascent, ``φ ← φ + η ∇_φ L(w_ori, φ; D_u)`` with cross-entropy ``L``, for S_φ
steps: :func:`train_adapter_ascent` with ``max_loss = inf`` (the default). A step that would make an
adapter parameter non-finite is undone and ends the ascent (a model must stay finite to be used).

With the ``guard.bounded-ascent`` guard (a finite ``max_loss``), the steps are *normalised*,
``φ ← φ + η ∇_φ L / ‖∇_φ L‖`` (global norm over the adapter): a memorised forget set starts with
near-zero gradients that grow with the loss, so plain steps first crawl and then explode, while
normalised steps move the adapter the same distance each time. Ascent on cross-entropy has no
maximum, so it stops once a batch's loss reaches ``max_loss``; and where the float32 cross-entropy is
exactly 0 (its gradient underflows), a step ascends the label margin instead (:func:`_margin_loss`).

The backbone is frozen: only the adapter's parameters are changed, gradients are taken with
``torch.autograd.grad`` with respect to the adapter only (no ``.grad`` is written anywhere), and the
rest of the model runs in ``eval`` mode so BatchNorm statistics do not move; training flags are
restored afterwards. The backbone is therefore bit-identical after the call.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.nn import functional as F

from tasks.model import SplitModel

ADAPTER_KIND = "lethe-adapter"  # the plug-in kind this package registers


class LetheAdapter(nn.Module):
    """Residual bottleneck ``z + up(relu(down(z)))`` on (B, dim) features; identity at initialisation."""

    def __init__(self, dim: int, seed: int, hidden: int | None = None):
        super().__init__()
        if dim < 1:
            raise ValueError(f"dim must be >= 1 (the model's feature_dim), got {dim}")
        hidden = max(1, dim // 4) if hidden is None else hidden
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.dim = dim
        self.down = nn.Linear(dim, hidden)
        self.up = nn.Linear(hidden, dim)
        generator = torch.Generator().manual_seed(seed)
        bound = 1.0 / math.sqrt(dim)  # nn.Linear's default range, drawn from our own generator
        with torch.no_grad():
            self.down.weight.uniform_(-bound, bound, generator=generator)
            self.down.bias.uniform_(-bound, bound, generator=generator)
            self.up.weight.zero_()
            self.up.bias.zero_()

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        if z.dim() != 2 or z.shape[1] != self.dim:
            raise ValueError(f"LetheAdapter expects features of shape (batch, {self.dim}), got {tuple(z.shape)}")
        return z + self.up(F.relu(self.down(z)))


def _batches(data, batch_size: int, generator: torch.Generator) -> Iterator[tuple[torch.Tensor, ...]]:
    """Endless stream of (x, y) batches from a tensor pair (seeded reshuffles) or a re-iterable loader."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(isinstance(t, torch.Tensor) for t in data):
        x, y = data
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"forget data: need equally many (> 0) inputs and labels, got {len(x)} and {len(y)}")
        while True:
            order = torch.randperm(len(x), generator=generator)
            for start in range(0, len(x), batch_size):
                idx = order[start : start + batch_size]
                yield x[idx], y[idx]
    if not isinstance(data, Iterable):
        raise ValueError("forget data must be an (inputs, labels) tensor pair or an iterable of such batches")
    while True:
        empty = True
        for x, y in data:
            empty = False
            yield x, y
        if empty:
            raise ValueError("forget data loader yielded no batches")


def train_adapter_ascent(
    model: SplitModel,
    adapter_index: int,
    data,
    steps: int,
    lr: float,
    seed: int,
    max_loss: float = math.inf,
    batch_size: int = 32,
) -> dict[str, float]:
    """Eq. 6: ``steps`` gradient-ascent steps of step size ``lr`` on the forget set, updating only
    ``model.plugins[adapter_index]``. ``max_loss`` finite (``guard.bounded-ascent``): normalised steps of
    length ``lr``, a stop once a batch's loss reaches it, the label margin where the loss is saturated.

    ``data`` is an ``(inputs, labels)`` tensor pair (shuffled into ``batch_size`` mini-batches with
    a generator seeded by ``seed``) or any re-iterable of ``(inputs, labels)`` batches such as a
    DataLoader (its own order is used; it is cycled if ``steps`` exceeds its length).
    ``steps == 0`` changes nothing. Returns ``{"steps": steps actually taken, "loss_start": loss of
    the first batch before any step, "loss_end": last measured batch loss, "stopped_early": 0/1,
    "margin_steps": steps that ascended the label margin (:func:`_margin_loss`) because the
    cross-entropy's gradient was exactly 0}`` (losses are ``nan`` when ``steps == 0``).
    """
    if steps < 0:
        raise ValueError(f"lethe.adapter-steps must be >= 0, got {steps}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lethe.adapter-lr must be a finite number > 0, got {lr}")
    if not max_loss > 0:
        raise ValueError(f"max_loss must be > 0 (inf = the paper's plain ascent), got {max_loss}")
    bounded = math.isfinite(max_loss)
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if not 0 <= adapter_index < len(model.plugins):
        raise ValueError(f"adapter_index must index model.plugins (0..{len(model.plugins) - 1}), got {adapter_index}")
    adapter = model.plugins[adapter_index]
    params = [p for p in adapter.parameters() if p.is_floating_point()]
    if not params:
        raise ValueError(f"model.plugins[{adapter_index}] has no parameters to train")

    metrics = {"steps": 0.0, "loss_start": math.nan, "loss_end": math.nan, "stopped_early": 0.0, "margin_steps": 0.0}
    if steps == 0:
        return metrics

    device = params[0].device
    was_training = {m: m.training for m in model.modules()}
    model.eval()
    adapter.train()
    batches = _batches(data, batch_size, torch.Generator().manual_seed(seed))
    try:
        for _ in range(steps):
            x, y = next(batches)
            logits, y = model(x.to(device)), y.to(device)
            loss = F.cross_entropy(logits, y)
            value = float(loss.detach())
            if math.isnan(metrics["loss_start"]):
                metrics["loss_start"] = value
            metrics["loss_end"] = value
            if not math.isfinite(value) or value >= max_loss:
                metrics["stopped_early"] = 1.0
                break
            grads = torch.autograd.grad(loss, params, retain_graph=bounded)
            norm = _norm(grads)
            if bounded and norm == 0.0:  # saturated: the cross-entropy's gradient underflowed to 0
                grads = torch.autograd.grad(_margin_loss(logits, y), params)
                norm = _norm(grads)
                metrics["margin_steps"] += 1
            if not math.isfinite(norm) or (bounded and norm == 0.0):
                metrics["stopped_early"] = 1.0  # nothing to ascend along
                break
            before = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, g in zip(params, grads):
                    # bounded: φ ← φ + η ∇φ L / ‖∇φ L‖; the paper: φ ← φ + η ∇φ L
                    _add_scaled(p, g, lr / norm if bounded else lr)
                if not all(bool(torch.isfinite(p).all()) for p in params):
                    for p, old in zip(params, before):
                        p.copy_(old)
                    metrics["stopped_early"] = 1.0
                    break
            metrics["steps"] += 1
    finally:
        for module, flag in was_training.items():
            module.train(flag)
    return metrics


def _norm(grads) -> float:
    return float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))


def _margin_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean of (largest other logit - the label's logit): what a step that lowers the label's margin
    ascends. Used where the cross-entropy is saturated (float32 loss 0, gradient exactly 0: a model
    that predicts every forget sample with a huge margin, from which amplify could not move). As the margin grows,
    the cross-entropy's gradient with respect to the logits, normalised, tends to the runner-up's
    logit minus the label's, which is this loss's gradient: the same ascent direction, without the
    underflow."""
    label = logits.gather(1, y[:, None]).squeeze(1)
    others = logits.masked_fill(F.one_hot(y, logits.shape[1]).bool(), -math.inf).amax(1)
    return (others - label).mean()


def _add_scaled(param: torch.Tensor, grad: torch.Tensor, scale: float) -> None:
    """``param += scale * grad``. On a model saturated on the forget data the gradient can be so small
    that ``1 / norm`` exceeds the largest float32, which torch refuses as ``alpha``; the product is
    formed in float64 there (elsewhere the float32 ``alpha`` path)."""
    if scale < torch.finfo(param.dtype).max:
        param.add_(grad, alpha=scale)
    else:
        param.add_((grad.double() * scale).to(param.dtype))


@torch.no_grad()
def loss_without_adapter(model: SplitModel, x: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Mean cross-entropy of the model with every ``LetheAdapter`` plug-in bypassed (other plug-ins,
    e.g. a filter, stay), in eval mode: how much the *backbone* alone has forgotten ``(x, y)``.

    The loss stop of rectification reads this figure (``guard.stop-loss``); the composite model's own
    loss says nothing about it, since the adapter was trained to make it large. Clients report it
    in their ``train`` reply (``loss-before``, the task's ``loss_bypassing`` of this kind).
    """
    return model.loss_bypassing(x, y, {ADAPTER_KIND}, batch_size)


def build_plugin(spec: dict, feature_dim: int) -> LetheAdapter:
    """The registered builder of plug-in kind :data:`ADAPTER_KIND`."""
    return LetheAdapter(feature_dim, seed=int(spec.get("seed", 0)))
