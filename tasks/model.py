"""The model shape every vision task shares: feature extractor -> plug-ins -> classifier head.

FedUP inserts its filter and Lethe its temporary adapter between the extractor and the head, so
both methods work on every architecture without knowing it. Plug-ins live in ``self.plugins``
(state-dict keys ``plugins.<i>.*``); everything else is the *base* model, which plugging and
unplugging never touches.
"""

from __future__ import annotations

import torch
from torch import nn

PLUGIN_PREFIX = "plugins."


class SplitModel(nn.Module):
    """``head(plugins(features(x)))`` with a flat feature vector of ``feature_dim`` in between."""

    def __init__(self, features: nn.Module, head: nn.Module, feature_dim: int):
        super().__init__()
        self.features = features
        self.head = head
        self.feature_dim = feature_dim
        self.plugins = nn.ModuleList()

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


def base_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """State dict without plug-in entries."""
    return {k: v for k, v in model.state_dict().items() if not k.startswith(PLUGIN_PREFIX)}
