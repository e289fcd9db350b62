"""FedAU's client side: training the auxiliary head during pretraining, and handing it over.

``aux_training`` is the local objective ``fedau-aux`` of FedAU's pretraining rounds (the server
names it in every pretraining ``train`` config, with ``fedau-original`` = the original's id).
A client without forget data trains exactly as plain FedAvg does (the task's cross-entropy).
A forget holder trains its model and, beside the classifier head ``W1``, a linear auxiliary head
``W2`` on the same penultimate features, minimising ``CE(W1 z, y) + CE(W2 z, y_aux)`` with the run's
SGD settings (``maths.aux_labels`` gives ``y_aux``). Only the model travels back; ``W2`` is written,
atomically, to the client's own folder (``conf["state-folder"]``, ``client_app.kept_models.folder``)
as ``fedau-aux-<original id>-client<id>.pt`` and read back at the next round: a ClientApp process
may answer one message only, so memory would not keep it. It is never aggregated. A kept head
from a round at or after the current one belongs to an earlier pretraining of the same original
(e.g. one whose model was degraded, hence not cached): the round then starts a fresh head.

``head_query`` (``query.fedau``) is the unlearning request: the holder replies with its ``W2``
(and what keeping it cost: rounds, training seconds, bytes on disk). The message carries no model.
"""

from __future__ import annotations

import os
import re
import time

import torch
from torch import nn
from torch.nn import functional as F

from strategies.fedau.maths import aux_labels, mixed_start
from tasks.training import train_local

HEAD_KEYS = ("weight", "bias")


def head_path(folder: str, original_id: str, client_id: int) -> str:
    if not re.fullmatch(r"[0-9a-f]{16}", original_id):
        raise ValueError(f"fedau-original {original_id!r} must be 16 hex digits (an original model's id)")
    return os.path.join(folder, f"fedau-aux-{original_id}-client{client_id}.pt")


def load_kept(path: str) -> dict | None:
    """The kept auxiliary head and its counters, or None when there is none (or it is unreadable)."""
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # a damaged file reads as missing: the round starts a fresh head, the query says so
        return None


def store_kept(path: str, kept: dict) -> None:
    from core.files import atomic_path

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with atomic_path(path) as tmp:
        torch.save(kept, tmp)


def aux_seed(cfg, client_id: int) -> int:
    return int(cfg["seed"]) * 7919 + 104729 + client_id


def aux_training(model, x, y, *, cfg, conf, seed, device, data) -> float:
    """The ``fedau-aux`` objective (role ``all``, pretraining): see the module docstring."""
    epochs = data.local_epochs("all", cfg, int(conf.get("epochs", cfg["local-epochs"])))
    lr = float(conf.get("lr", cfg["lr"]))
    max_steps = int(conf.get("max-steps", 0)) or None
    if len(data.forget_y) == 0:  # not a forget holder: plain FedAvg training, bit for bit
        return train_local(model, x, y, epochs=epochs, batch_size=cfg["batch-size"], lr=lr,
                           momentum=cfg["momentum"], seed=seed, max_steps=max_steps, device=device)
    retain_y, forget_y, extra_y = data.retain_y, data.forget_y, data.pretrain_only_y
    if len(y) != len(retain_y) + len(forget_y) + len(extra_y):
        raise ValueError("fedau-aux trains on role 'all' only (pretraining)")
    num_classes = int(model.head.out_features)
    y_aux = aux_labels(cfg["scenario"], retain_y, forget_y, extra_y, num_classes, cfg["forget-class"],
                       aux_seed(cfg, data.client_id))
    path = head_path(str(conf["state-folder"]), str(conf["fedau-original"]), data.client_id)
    kept = load_kept(path) or {}
    server_round = int(conf.get("server-round", 0))
    if int(kept.get("last-round", 0)) >= server_round:  # a new pretraining of this original: start afresh
        kept = {}
    torch.manual_seed(aux_seed(cfg, data.client_id))
    aux = nn.Linear(model.feature_dim, num_classes)
    if "weight" in kept:
        aux.load_state_dict({k: kept[k] for k in HEAD_KEYS})
    if cfg["scenario"] == "client":  # whole-client unlearning: W2 restarts from a mix with the received W1
        w1 = {k: getattr(model.head, k).detach() for k in HEAD_KEYS}
        aux.load_state_dict(mixed_start(w1, aux.state_dict(), cfg["fedau.client-gamma"]))

    started = time.perf_counter()
    aux.to(device).train()

    def both_heads(model, xb, targets):  # targets: column 0 the label, column 1 the auxiliary label
        z = model.penultimate(xb)
        return F.cross_entropy(model.head(z), targets[:, 0]) + F.cross_entropy(aux(z), targets[:, 1])

    loss = train_local(model, x, torch.stack([y, y_aux], 1), epochs=epochs, batch_size=cfg["batch-size"], lr=lr,
                       momentum=cfg["momentum"], seed=seed, max_steps=max_steps, device=device, loss_fn=both_heads,
                       extra_params=list(aux.parameters()))
    seconds = time.perf_counter() - started
    state = {k: v.detach().cpu().clone() for k, v in aux.state_dict().items()}
    store_kept(path, {**state, "rounds": int(kept.get("rounds", 0)) + 1, "last-round": server_round,
                      "seconds": float(kept.get("seconds", 0.0)) + seconds})
    return loss


aux_training.wants_client_data = True  # the vision task passes the client's data view (which samples are forget)


def head_query(task, cfg, data, model, conf: dict, seed: int) -> dict:
    """``query.fedau``: this holder's auxiliary head and what keeping it cost."""
    path = head_path(str(conf["state-folder"]), str(conf["fedau-original"]), data.client_id)
    kept = load_kept(path)
    if kept is None or "weight" not in kept:
        return {"metrics": {"kept": 0, "num-examples": len(data.forget_y)}}
    return {"head": {k: kept[k] for k in HEAD_KEYS},
            "metrics": {"kept": 1, "num-examples": len(data.forget_y), "aux-rounds": int(kept["rounds"]),
                        "aux-train-seconds": float(kept["seconds"]), "stored-bytes": os.path.getsize(path)}}
