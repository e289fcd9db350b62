"""The model shape every vision task shares: feature extractor -> plug-ins -> classifier head.

Methods insert their plug-ins (a filter, a temporary adapter) between the extractor and the head,
so they work on every architecture without knowing it. Plug-ins live in ``self.plugins``
(state-dict keys ``plugins.<i>.*``); everything else is the *base* model, which plugging and
unplugging never touches.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

PLUGIN_PREFIX = "plugins."


class SplitModel(nn.Module):
    """``head(plugins(features(x)))`` with a flat feature vector of ``feature_dim`` in between."""

    def __init__(self, features: nn.Module, head: nn.Module, feature_dim: int):
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = feature_dim
        self.plugins = nn.ModuleList()
        self.plugin_kinds: list[str] = []

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """Features of the frozen extractor, before any plug-in: shape (batch, feature_dim)."""
        return self.features(x)

    def filtered(self, z: torch.Tensor) -> torch.Tensor:
        """Pass extractor features through the plug-ins in order."""
        for plugin in self.plugins:
            z = plugin(z)
        return z

    def penultimate(self, x: torch.Tensor) -> torch.Tensor:
        """What the head sees: features after the plug-ins (used by diagnostics and MIA)."""
        return self.filtered(self.embed(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.penultimate(x))

    @torch.no_grad()
    def loss_bypassing(self, x: torch.Tensor, y: torch.Tensor, kinds: set[str], batch_size: int = 512) -> float:
        """Mean cross-entropy on ``(x, y)`` in eval mode with the plug-ins of ``kinds`` bypassed (the
        others stay): what the model without a temporary plug-in has learned of ``(x, y)``."""
        if len(y) == 0:
            raise ValueError("loss_bypassing needs at least one sample")
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        total = 0.0
        try:
            for start in range(0, len(y), batch_size):
                z = self.embed(x[start:start + batch_size].to(device))
                for plugin, kind in zip(self.plugins, self.plugin_kinds):
                    if kind not in kinds:
                        z = plugin(z)
                logits = self.head(z)
                total += float(F.cross_entropy(logits, y[start:start + batch_size].to(device), reduction="sum"))
        finally:
            self.train(was_training)
        return total / len(y)


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict without plug-in entries."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(PLUGIN_PREFIX)}
