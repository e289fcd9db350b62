"""Local training and inference for vision models (what a client does with its data).

Local training minimises cross-entropy by default (FedAvg, retrain, continued training, every
stream that trains on its data); a method with its own local loss passes ``loss_fn`` (from the
objective it registers, ``tasks.base``), and one with its own loop brings it.

``scope`` chooses what trains: ``all``, ``base`` (everything but plug-ins: the backbone with the
plug-ins frozen) or ``plugins`` (only the plug-ins, the backbone frozen).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.optim.sgd import sgd

from tasks.model import PLUGIN_PREFIX

SCOPES = ("all", "base", "plugins")


def device_for(preference: str = "auto") -> torch.device:
    """CUDA when present (or asked), else CPU."""
    if preference == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def set_trainable(model: nn.Module, scope: str) -> list[nn.Parameter]:
    """Freeze everything outside ``scope``; return the parameters left trainable."""
    if scope not in SCOPES:
        raise ValueError(f"train scope {scope!r} is unknown: must be one of {', '.join(SCOPES)}")
    trainable = []
    for name, param in model.named_parameters():
        is_plugin = name.startswith(PLUGIN_PREFIX)
        param.requires_grad_(scope == "all" or (scope == "plugins") == is_plugin)
        if param.requires_grad:
            trainable.append(param)
    return trainable


class MomentumSGD:
    """``torch.optim.SGD(params, lr, momentum)`` without the class: each step runs torch's own
    functional SGD (``torch.optim.sgd.sgd``, the function ``SGD.step`` calls, with the same
    arguments), so every update is bit for bit the class's.

    Why not the class: its ``zero_grad`` and ``add_param_group`` are wrapped to import
    ``torch._dynamo`` on their first call, about 2.3 CPU-seconds; on a SuperNode every message
    runs in a fresh ClientApp process, so each training message paid it again (docs/deployment.md,
    "Where a ClientApp process's CPU goes")."""

    def __init__(self, params, *, lr: float, momentum: float):
        self.params = list(params)
        self.lr, self.momentum = lr, momentum
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    def zero_grad(self) -> None:
        """Drop the gradients (the class's default, ``set_to_none=True``)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One step on the parameters that have a gradient, as ``SGD.step`` takes them."""
        live = [i for i, param in enumerate(self.params) if param.grad is not None]
        buffers = [self.buffers[i] for i in live]
        sgd([self.params[i] for i in live], [self.params[i].grad for i in live], buffers,
            weight_decay=0.0, momentum=self.momentum, lr=self.lr, dampening=0.0, nesterov=False, maximize=False)
        for i, buffer in zip(live, buffers):  # sgd fills in the buffers a first step creates
            self.buffers[i] = buffer


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                lr: float, momentum: float, seed: int, scope: str = "all",
                max_steps: int | None = None, device: torch.device | None = None,
                loss_fn: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
                extra_params: list[nn.Parameter] | tuple = (), max_grad_norm: float | None = None) -> float:
    """SGD over (x, y) in seeded shuffled mini-batches; returns the mean training loss of the last epoch.

    ``loss_fn(model, xb, yb)`` is the loss minimised; default: cross-entropy of ``model(xb)``. ``y``
    may have more than one column (a loss that also reads other per-sample targets), and
    ``extra_params`` (parameters outside ``model``, already on ``device``) are stepped with it.
    ``max_grad_norm``, when given, clips each step's gradient to that global norm
    (``torch.nn.utils.clip_grad_norm_``); a step below it is left bit-for-bit as it was."""
    device = device or torch.device("cpu")
    model.to(device).train()
    params = set_trainable(model, scope) + list(extra_params)
    optimizer = MomentumSGD(params, lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    steps, last_losses = 0, []
    try:
        for _ in range(epochs):
            last_losses = []
            order = torch.randperm(len(y), generator=generator)
            for start in range(0, len(y), batch_size):
                idx = order[start:start + batch_size]
                xb, yb = x[idx].to(device), y[idx].to(device)
                loss = loss_fn(model, xb, yb) if loss_fn is not None else F.cross_entropy(model(xb), yb)
                optimizer.zero_grad()
                loss.backward()
                if max_grad_norm:
                    nn.utils.clip_grad_norm_(params, max_grad_norm)
                optimizer.step()
                last_losses.append(loss.item())
                steps += 1
                if max_steps is not None and steps >= max_steps:
                    return sum(last_losses) / len(last_losses)
    finally:
        set_trainable(model, "all")
    return sum(last_losses) / len(last_losses) if last_losses else 0.0


@torch.no_grad()
def predict_proba(model: nn.Module, x: torch.Tensor, batch_size: int = 512,
                  device: torch.device | None = None) -> torch.Tensor:
    """Softmax probabilities, (n, classes), on the CPU."""
    device = device or torch.device("cpu")
    model.to(device).eval()
    if len(x) == 0:
        return torch.zeros(0, 0)
    out = [F.softmax(model(x[i:i + batch_size].to(device)), dim=1).cpu() for i in range(0, len(x), batch_size)]
    return torch.cat(out)


@torch.no_grad()
def penultimate_features(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """What the head sees (after plug-ins), for diagnostics; on the CPU, wherever the model is (the rows
    are moved to the model's device batch by batch, as ``predict_proba`` does)."""
    model.eval()
    if not len(x):
        return torch.zeros(0, model.feature_dim)
    device = next(model.parameters()).device
    return torch.cat([model.penultimate(x[i:i + batch_size].to(device)).cpu() for i in range(0, len(x), batch_size)])
