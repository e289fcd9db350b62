"""FedUP's plug-in filter (the FedUP paper, sec. 3.2.3) and its server-side training on class centroids.

The filter sits between the frozen feature extractor and the frozen head of a ``SplitModel``
(``model.plugins.append(filter)``, eq. 13); removing it restores the original model (eq. 20).

Architecture (the paper: "a straightforward encoder-decoder", bottleneck 32, Table 5; the layers
are the official code's ``Adapter``), ``fedup.filter``:

    official:  z (B, d) -> Linear(d, b, no bias) -> ReLU -> Linear(b, d, no bias) -> ReLU
    signed:    z (B, d) -> Linear(d, b) -> ReLU -> Linear(b, d)

``signed`` (not the paper's) keeps biases and drops the output ReLU, so it can reproduce signed
features (pooled transformer features); ``official`` outputs non-negative features only. Weights
are initialised from ``seed`` with PyTorch's default Linear init (as the official code).

Training (eq. 15-19) on the aggregated centroids ``mu`` with targets ``y``::

    L = alpha * CE(head(filter(mu)), y) + (1 - alpha) * mean((filter(mu) - mu)^2)

``mean`` runs over the batch and the ``d`` coordinates (eq. 17). Only the filter's parameters are
optimised; the head is called with detached copies of its parameters in eval mode, so it receives
no gradients, no running-stat updates and no change of any kind. The centroids are shuffled every
epoch and the last, smaller batch is kept (the official code shuffles once and drops it).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from strategies.fedup.settings import FILTER_SHAPES, OPTIMIZERS, SETTINGS

# One source of defaults: the run config's (``strategies.fedup.settings``). The learning rate has
# none here: the run's default (0) means the run's own ``lr`` (``settings.filter_lr``).
_DEFAULTS = {s.key: s.default for s in SETTINGS}
DEFAULT_BOTTLENECK = _DEFAULTS["fedup.bottleneck"]
DEFAULT_SHAPE = _DEFAULTS["fedup.filter"]
DEFAULT_ALPHA = _DEFAULTS["fedup.alpha"]
DEFAULT_EPOCHS = _DEFAULTS["fedup.epochs"]
DEFAULT_BATCH_SIZE = _DEFAULTS["fedup.batch-size"]
DEFAULT_OPTIMIZER = _DEFAULTS["fedup.optimizer"]


class FedUPFilter(nn.Module):
    """Encoder-decoder ``d -> bottleneck -> d`` plug-in of shape ``official`` or ``signed``; see the module docstring."""

    def __init__(self, feature_dim: int, bottleneck: int = DEFAULT_BOTTLENECK, *, seed: int = 0,
                 shape: str = DEFAULT_SHAPE):
        super().__init__()
        if feature_dim <= 0:
            raise ValueError(f"feature_dim must be > 0, got {feature_dim}")
        if bottleneck <= 0:
            raise ValueError(f"fedup.bottleneck must be > 0, got {bottleneck}")
        if shape not in FILTER_SHAPES:
            raise ValueError(f"fedup.filter must be one of {', '.join(FILTER_SHAPES)}, got {shape!r}")
        self.shape = shape
        bias = shape == "signed"
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = nn.Linear(feature_dim, bottleneck, bias=bias)
            self.decoder = nn.Linear(bottleneck, feature_dim, bias=bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        out = self.decoder(torch.relu(self.encoder(z)))
        return torch.relu(out) if self.shape == "official" else out


def train_filter(
    filter: FedUPFilter,
    head: nn.Module,
    centroids: torch.Tensor,
    labels: torch.Tensor,
    *,
    lr: float,
    alpha: float = DEFAULT_ALPHA,
    epochs: int = DEFAULT_EPOCHS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    optimizer: str = DEFAULT_OPTIMIZER,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Train ``filter`` in place on ``centroids (M, d)`` and their targets with the frozen ``head``.

    ``labels`` are class indices ``(M,)`` or class probabilities ``(M, C)`` (``divert_targets``;
    the CE of eq. 16 then uses the soft target).

    ``seed`` fixes the mini-batch order (the filter's init was fixed at construction), so two calls
    with equal inputs give bit-identical filters on the same device. ``optimizer`` is plain
    ``"sgd"`` (no momentum, eq. 19, the official code) or ``"adam"``. Returns per-epoch means: ``total``, ``ce``, ``re`` losses
    and ``accuracy`` (fraction of centroids that ``head(filter(mu))`` assigns to their label; for soft
    targets, to any class of non-zero target probability).
    """
    if not 0 <= alpha <= 1:
        raise ValueError(f"fedup.alpha must be in [0, 1], got {alpha}")
    if epochs <= 0:
        raise ValueError(f"fedup.epochs must be > 0, got {epochs}")
    if not lr > 0:
        raise ValueError(f"fedup.lr must be > 0, got {lr}")
    if batch_size <= 0:
        raise ValueError(f"fedup.batch-size must be > 0, got {batch_size}")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"fedup.optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    rows = centroids.shape[:1]
    if centroids.ndim != 2 or rows == (0,) or labels.shape[:1] != rows or labels.ndim > 2:
        raise ValueError(
            "centroids must be (M, d) with M > 0 and labels (M,) or (M, C), "
            f"got {tuple(centroids.shape)} and {tuple(labels.shape)}"
        )

    device = next(filter.parameters()).device
    x_all = centroids.detach().to(device=device, dtype=torch.float32)
    soft = labels.ndim == 2
    y_all = labels.detach().to(device=device, dtype=torch.float32 if soft else torch.long)
    frozen = {name: t.detach() for name, t in [*head.named_parameters(), *head.named_buffers()]}
    opt_cls = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    opt = opt_cls(filter.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    history: dict[str, list[float]] = {"total": [], "ce": [], "re": [], "accuracy": []}
    was_training = head.training
    head.eval()
    filter.train()
    try:
        for _ in range(epochs):
            sums = dict.fromkeys(history, 0.0)
            for idx in torch.randperm(len(x_all), generator=generator).split(batch_size):
                x, y = x_all[idx.to(device)], y_all[idx.to(device)]
                filtered = filter(x)
                logits = functional_call(head, frozen, (filtered,))
                ce = F.cross_entropy(logits, y)
                re = F.mse_loss(filtered, x)
                total = alpha * ce + (1 - alpha) * re
                opt.zero_grad()
                total.backward()
                opt.step()
                n = len(idx)
                sums["total"] += total.item() * n
                sums["ce"] += ce.item() * n
                sums["re"] += re.item() * n
                predicted = logits.argmax(dim=1)
                hits = y.gather(1, predicted[:, None]).squeeze(1) > 0 if soft else predicted == y
                sums["accuracy"] += hits.sum().item()
            for key, value in sums.items():
                history[key].append(value / len(x_all))
    finally:
        head.train(was_training)
    return history


FILTER_KIND = "fedup-filter"  # the plug-in kind this package registers


def build_plugin(spec: dict, feature_dim: int) -> FedUPFilter:
    """The registered builder of plug-in kind :data:`FILTER_KIND`. A spec without ``shape`` was written
    before the key existed, when every filter was ``signed``."""
    return FedUPFilter(feature_dim, bottleneck=int(spec["bottleneck"]), seed=int(spec.get("seed", 0)),
                       shape=str(spec.get("shape", "signed")))
