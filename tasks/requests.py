"""Unlearning requests: how each client derives its own retain / forget / test data.

Every client rebuilds the whole federation's partition from the seed, takes its own share, and
applies the request to it. Raw data never leaves the client; only counts and model outputs do.

Scenarios (DESIGN.md, and the papers' setups):

- ``client``: the forget client leaves. Its data is made measurable by poisoning, because a
  clean client's knowledge is mostly shared with the others: ``label-flip`` (y -> (y+1) mod C,
  FedUP's Byzantine setup) or ``backdoor`` (every sample gets the trigger and the target label,
  Lethe's setup). Its whole training split is the forget set.
- ``class``: every client forgets its samples of ``forget-class``; their local test samples of
  that class form the *forget test* set, and ``test_acc`` is measured on the other classes.
- ``sample``: ``sample-fraction`` of the forget client's training samples, drawn among those whose
  true label is not the backdoor target (so a hit is the backdoor, never the true class), get the
  trigger and the target label; those samples are the forget set.

The default forget client (-1) is the client with the most training samples: a small client's
poison is drowned by the others and leaves nothing measurable to unlearn.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tasks.config import Config
from tasks.partition import dirichlet_partitions, train_test_split

EMPTY_X_SHAPE = (0,)


@dataclass
class ClientData:
    """One client's view of the request. ``forget_y`` are the labels the forget set was trained with."""

    client_id: int
    retain_x: torch.Tensor
    retain_y: torch.Tensor
    forget_x: torch.Tensor
    forget_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    forget_test_x: torch.Tensor
    forget_test_y: torch.Tensor
    triggered_test_x: torch.Tensor
    triggered_test_y: torch.Tensor

    def split(self, role: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Training data of a role: ``all`` (retain + forget), ``retain`` or ``forget``."""
        if role == "retain":
            return self.retain_x, self.retain_y
        if role == "forget":
            return self.forget_x, self.forget_y
        if role == "all":
            return torch.cat([self.retain_x, self.forget_x]), torch.cat([self.retain_y, self.forget_y])
        raise ValueError(f"role {role!r} is unknown: must be all, retain or forget")

    def counts(self) -> dict[str, int]:
        return {"n-retain": len(self.retain_y), "n-forget": len(self.forget_y), "n-test": len(self.test_y),
                "n-forget-test": len(self.forget_test_y), "n-triggered-test": len(self.triggered_test_y)}


def partition_train_sizes(cfg: Config, labels: np.ndarray, num_partitions: int) -> list[int]:
    """Training-split size of every client (what the default forget client is chosen by)."""
    parts = dirichlet_partitions(labels, num_partitions, cfg["dirichlet-alpha"], cfg["seed"])
    return [len(train_test_split(p, cfg["test-fraction"], cfg["seed"] + i)[0]) for i, p in enumerate(parts)]


def resolve_forget_client(cfg: Config, labels: np.ndarray, num_partitions: int) -> int:
    """The configured forget client, or the largest one for -1 (ties: lowest id)."""
    if cfg["forget-client"] >= 0:
        return cfg["forget-client"]
    return int(np.argmax(partition_train_sizes(cfg, labels, num_partitions)))


def uses_trigger(cfg: Config) -> bool:
    """Whether the request plants a backdoor (so triggered test samples measure it)."""
    return cfg["scenario"] == "sample" or (cfg["scenario"] == "client" and cfg["poison"] == "backdoor")


def build_client_data(cfg: Config, images, partition_id: int, num_partitions: int) -> ClientData:
    """Apply the run's request to client ``partition_id`` of an ``ImageData`` training pool."""
    from tasks.vision.triggers import apply_trigger

    labels = images.y.numpy()
    parts = dirichlet_partitions(labels, num_partitions, cfg["dirichlet-alpha"], cfg["seed"])
    train_idx, test_idx = train_test_split(parts[partition_id], cfg["test-fraction"], cfg["seed"] + partition_id)
    x, y = images.x[train_idx], images.y[train_idx]
    tx, ty = images.x[test_idx], images.y[test_idx]
    forget_client = resolve_forget_client(cfg, labels, num_partitions)
    num_classes, target = images.num_classes, cfg["backdoor-target"]
    forget_mask = torch.zeros(len(y), dtype=torch.bool)
    fx, fy = x[:0], y[:0]
    test_keep = torch.ones(len(ty), dtype=torch.bool)
    scenario = cfg["scenario"]

    if scenario == "class":
        forget_mask = y == cfg["forget-class"]
        fx, fy = x[forget_mask], y[forget_mask]
        test_keep = ty != cfg["forget-class"]
    elif partition_id == forget_client and scenario == "client":
        forget_mask[:] = True
        if cfg["poison"] == "label-flip":
            fx, fy = x, (y + 1) % num_classes
        else:
            fx, fy = apply_trigger(x, cfg["trigger-size"]), torch.full_like(y, target)
    elif partition_id == forget_client and scenario == "sample":
        candidates = np.flatnonzero((y != target).numpy())
        n_forget = min(len(candidates), max(1, int(round(cfg["sample-fraction"] * len(y)))))
        chosen = np.random.default_rng(cfg["seed"] + 7919 * (partition_id + 1)).choice(
            candidates, size=n_forget, replace=False)
        forget_mask[torch.as_tensor(chosen)] = True
        fx, fy = apply_trigger(x[forget_mask], cfg["trigger-size"]), torch.full((n_forget,), target)

    non_target = ty != target
    if uses_trigger(cfg):
        trig_x, trig_y = apply_trigger(tx[non_target], cfg["trigger-size"]), ty[non_target]
    else:
        trig_x, trig_y = tx[:0], ty[:0]
    return ClientData(
        client_id=partition_id,
        retain_x=x[~forget_mask], retain_y=y[~forget_mask],
        forget_x=fx, forget_y=fy.to(torch.int64),
        test_x=tx[test_keep], test_y=ty[test_keep],
        forget_test_x=tx[~test_keep], forget_test_y=ty[~test_keep],
        triggered_test_x=trig_x, triggered_test_y=trig_y,
    )
