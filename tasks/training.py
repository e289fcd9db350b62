"""Local training and inference for vision models (what a client does with its data).

Local training minimises cross-entropy (FedAvg, retrain, both of Lethe's streams, restore rounds);
Lethe's gradient-ascent adapter has its own bounded loop in ``tasks.lethe_adapter``.

``scope`` chooses what trains: ``all``, ``base`` (everything but plug-ins: Lethe's backbone with
the adapter frozen) or ``plugins`` (only plug-ins: Lethe's adapter with the backbone frozen).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

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


def train_local(model: nn.Module, x: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int,
                lr: float, momentum: float, seed: int, scope: str = "all",
                max_steps: int | None = None, device: torch.device | None = None) -> float:
    """SGD over (x, y) in seeded shuffled mini-batches; returns the mean training CE of the last epoch."""
    device = device or torch.device("cpu")
    model.to(device).train()
    optimizer = torch.optim.SGD(set_trainable(model, scope), lr=lr, momentum=momentum)
    generator = torch.Generator().manual_seed(seed)
    steps, last_losses = 0, []
    try:
        for _ in range(epochs):
            last_losses = []
            order = torch.randperm(len(y), generator=generator)
            for start in range(0, len(y), batch_size):
                idx = order[start:start + batch_size]
                xb, yb = x[idx].to(device), y[idx].to(device)
                loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad()
                loss.backward()
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
    """What the head sees (after plug-ins), for diagnostics."""
    model.eval()
    return torch.cat([model.penultimate(x[i:i + batch_size]) for i in range(0, len(x), batch_size)]) \
        if len(x) else torch.zeros(0, model.feature_dim)
