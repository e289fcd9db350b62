"""FUSED's client side: the local objective ``fused-overwrite`` (a ``train`` message's ``objective``).

The client trains only the adapters (``scope="plugins"``: the base frozen, only the plug-in's
tensors go back up) by SGD on cross-entropy of the data of the message's role. With ``relabel``
(class unlearning) every sample of ``forget-class`` gets a label drawn uniformly from the other
classes first (:func:`strategies.fused.maths.relabel_forgotten`), so the adapters overwrite that
class with the remaining knowledge. LoRA dropout draws from torch's global generator, which is
seeded with the round's seed, as are the relabelling and the batch order: same seed, same run.
"""

from __future__ import annotations

import torch

from strategies.fused.maths import relabel_forgotten
from tasks.training import train_local


def overwrite(model, x, y, *, cfg, conf, seed, device) -> float:
    """The registered objective: adapter-only local training, forgotten class relabelled on request."""
    if bool(conf.get("relabel", False)):
        y = relabel_forgotten(y, cfg["forget-class"], cfg.num_classes, torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    return train_local(model, x, y, epochs=int(conf["epochs"]), batch_size=cfg["batch-size"], lr=float(conf["lr"]),
                       momentum=cfg["momentum"], seed=seed, scope="plugins", device=device)
