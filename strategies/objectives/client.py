"""The ``train`` objectives GA, NPO and SimNPO registers for the LLM task (``tasks.base``'s llm signature).

Each trains the received adapter on the records of the message's role with its loss
(``strategies.objectives.losses``); NPO's reference is the received model (adapter included),
computed once before the first step.
"""

from __future__ import annotations

from strategies.objectives.losses import NPOLoss, SimNPOLoss, attach_reference_logprobs, gradient_ascent
from tasks.llm.federation_model import local_update


def _npo_reference(model, batches: list[dict]) -> list[dict]:
    device = next(model.parameters()).device
    on_device = [{k: v.to(device) for k, v in b.items()} for b in batches]
    return attach_reference_logprobs(model, on_device, disable_adapter=False)


def ascent(model, tokenizer, records, *, cfg, conf, seed, epochs, lr) -> float:
    return local_update(model, tokenizer, records, cfg=cfg, epochs=epochs, lr=lr, seed=seed, loss_fn=gradient_ascent)


def npo(model, tokenizer, records, *, cfg, conf, seed, epochs, lr) -> float:
    return local_update(model, tokenizer, records, cfg=cfg, epochs=epochs, lr=lr, seed=seed,
                        loss_fn=NPOLoss(beta=cfg["npo.beta"]), prepare=_npo_reference)


def simnpo(model, tokenizer, records, *, cfg, conf, seed, epochs, lr) -> float:
    return local_update(model, tokenizer, records, cfg=cfg, epochs=epochs, lr=lr, seed=seed,
                        loss_fn=SimNPOLoss(beta=cfg["simnpo.beta"], gamma=cfg["simnpo.gamma"]))
