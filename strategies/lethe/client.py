"""Lethe's client-side work: the ``adapter-ascent`` objective of a ``train`` message (vision tasks).

Phase 1 ("amplify"): only the temporary adapter (the last plug-in) moves, by gradient ascent on the
forget data (``strategies.lethe.adapter.train_adapter_ascent``; bounded with ``guard.bounded-ascent``).
"""

from __future__ import annotations

import torch

from strategies.lethe.adapter import train_adapter_ascent


def adapter_ascent(model, x: torch.Tensor, y: torch.Tensor, *, cfg, conf: dict, seed: int, device) -> float:
    """The registered ``adapter-ascent`` objective: ``max-steps`` ascent steps of size ``lr``; the
    forget loss at the end."""
    lr = float(conf.get("lr", cfg["lr"]))
    return train_adapter_ascent(model, len(model.plugins) - 1, (x, y), steps=int(conf["max-steps"]), lr=lr,
                                seed=seed, batch_size=cfg["batch-size"],
                                max_loss=cfg["guard.bounded-ascent"])["loss_end"]
