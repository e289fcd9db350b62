"""One client's RMU update of the LoRA adapter, without Flower: the loss is ``RMULoss``
(``strategies.objectives.losses``, the one implementation FIRM's ``rmu`` forget objective uses too).

Forget batch i is paired with retain batch i mod n_r, as the official loop pairs one forget and one
retain batch per step; the frozen hidden states of the retain batches are the received model's,
taken once before the first step. Only the LoRA factors of ``down_proj`` in the plan's updated
layers train; which parameters train is put back afterwards (the model is shared per process).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import torch

from strategies.objectives.losses import (
    RMULoss,
    attach_reference_hidden,
    decoder_layers,
    restrict_trainable_lora,
)
from strategies.rmu.settings import SETTINGS, UPDATED_MODULE, RMUPlan, plan
from tasks.llm.train import finetune


def model_plan(cfg, model) -> RMUPlan:
    """The run's RMU plan on ``model`` (a peft causal LM)."""
    return plan(cfg, len(decoder_layers(model)), int(model.config.hidden_size))


def default_plan(model, seed: int) -> RMUPlan:
    """The plan of the ``rmu.*`` defaults on ``model``, u drawn from ``seed`` (outside a run)."""
    return plan({**{s.key: s.default for s in SETTINGS}, "seed": seed}, len(decoder_layers(model)),
                int(model.config.hidden_size))


def rmu_loss(rmu: RMUPlan) -> RMULoss:
    return RMULoss(layer=rmu.layer, steering_coeff=rmu.steering_coeff, alpha=rmu.alpha, seed=rmu.seed)


@contextlib.contextmanager
def updating_only(model, layers: Sequence[int]) -> Iterator[list[str]]:
    """Within the block only the ``down_proj`` LoRA factors of ``layers`` require gradients."""
    before = {name: p.requires_grad for name, p in model.named_parameters()}
    try:
        yield restrict_trainable_lora(model, layers, (UPDATED_MODULE,))
    finally:
        for name, p in model.named_parameters():
            p.requires_grad_(before[name])


def rmu_update(model, forget: Sequence[dict], retain: Sequence[dict], rmu: RMUPlan, *, epochs: int, lr: float,
               seed: int) -> list[float]:
    """Train ``model``'s adapter in place with RMU; the mean loss of each epoch.

    ``retain`` may be empty: the forget term alone (FIRM's forget clients, a client without retained data)."""
    if not forget:
        raise ValueError("rmu needs at least one forget batch")
    device = next(model.parameters()).device
    on_device = [{k: v.to(device) for k, v in b.items()} for b in retain]
    frozen = attach_reference_hidden(model, on_device, rmu.layer, disable_adapter=False) if on_device else []
    paired = [dict(b, retain=frozen[i % len(frozen)]) if frozen else dict(b) for i, b in enumerate(forget)]
    loss = rmu_loss(rmu)

    def loss_fn(m, batch: dict) -> torch.Tensor:
        return loss(m, batch, retain_batch=batch.get("retain"))

    with updating_only(model, rmu.updated_layers):
        return finetune(model, paired, epochs, lr, seed, loss_fn=loss_fn)
