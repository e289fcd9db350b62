"""FedAU's pure math (no Flower): auxiliary labels and the linear unlearning operation on heads.

A head is ``{"weight": (classes, features), "bias": (classes,)}``.
"""

from __future__ import annotations

import torch


def random_other_labels(labels: torch.Tensor, num_classes: int, seed: int) -> torch.Tensor:
    """For each label, one drawn uniformly among the *other* ``num_classes - 1`` classes (seeded:
    the same labels every round, as the public code fixes them once in its data set)."""
    if num_classes < 2:
        raise ValueError("random auxiliary labels need at least 2 classes")
    generator = torch.Generator().manual_seed(seed)
    offset = torch.randint(1, num_classes, (len(labels),), generator=generator)
    return (labels.to(torch.int64) + offset) % num_classes


def aux_labels(scenario: str, retain_y: torch.Tensor, forget_y: torch.Tensor, extra_y: torch.Tensor,
               num_classes: int, forget_class: int, seed: int) -> torch.Tensor:
    """The auxiliary head's labels for a forget holder's training data in ``split("all")`` order
    (retain, forget, then the pretraining-only samples).

    - ``class``: every sample is labelled ``forget_class`` (the head learns "always the class");
    - ``sample`` / ``client``: a retained or pretraining-only sample keeps its label, a forget
      sample gets a random label other than the one it is trained with.
    """
    if scenario == "class":
        return torch.full((len(retain_y) + len(forget_y) + len(extra_y),), forget_class, dtype=torch.int64)
    if scenario in ("sample", "client"):
        return torch.cat([retain_y.to(torch.int64), random_other_labels(forget_y, num_classes, seed),
                          extra_y.to(torch.int64)])
    raise ValueError(f"scenario {scenario!r} is unknown to FedAU: must be class, sample or client")


def mean_head(heads: list[dict]) -> dict:
    """The uniform mean of the holders' auxiliary heads (the paper and code weigh them equally)."""
    if not heads:
        raise ValueError("no auxiliary head to average")
    return {k: sum(h[k].to(torch.float64) for h in heads).div(len(heads)).to(heads[0][k].dtype) for k in heads[0]}


def unlearned_head(scenario: str, w1: dict, w2_mean: dict, alpha: float) -> dict:
    """The linear operation, applied to weight and bias alike:

    - ``class``: ``W1 - mean(W2)``;
    - ``sample`` / ``client``: ``(1 - alpha) W1 + alpha mean(W2)`` (the paper's formula; the public
      code of 2024 assigned ``alpha / n W2`` alone, dropping W1).
    """
    if scenario == "class":
        return {k: w1[k] - w2_mean[k] for k in w1}
    if scenario in ("sample", "client"):
        return {k: (1 - alpha) * w1[k] + alpha * w2_mean[k] for k in w1}
    raise ValueError(f"scenario {scenario!r} is unknown to FedAU: must be class, sample or client")


def mixed_start(w1: dict, w2: dict, gamma: float) -> dict:
    """Client scenario: the auxiliary head a round starts from, ``(1 - gamma) W1 + gamma W2``."""
    return {k: (1 - gamma) * w1[k] + gamma * w2[k] for k in w1}
