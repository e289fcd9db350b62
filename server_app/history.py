"""Pretraining's update history: the global model and every client's returned model of chosen rounds.

FedEraser ("FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning
Models", Liu et al.) replays pretraining without the leaving client from what the server kept:
at every ``federaser.interval``-th round, the global model the clients started from and the model
each client sent back, with its example count. The server records them while pretraining runs
(``strategies.common.fedavg_rounds.run_rounds``' ``on_replies``) — only in a run whose method
needs ``update-history`` — and stores them beside the cached original, keyed like it:
``history-<original id>-every<interval>.pt`` (written atomically; loaded with ``weights_only=True``). Its size on
disk is what the method's history costs in storage; the pretraining that recorded it is what it
costs in time and bytes.
"""

from __future__ import annotations

import logging
import os

import torch
from flwr.app import ArrayRecord, Message

from core.files import atomic_path, locked

log = logging.getLogger("fedunlearn")


class UpdateHistory:
    """``rounds``: round -> {"global": state, "clients": {client id: state}, "counts": {client id: n},
    "lr": the clients' lr in that round} (the run's ``lr``, or round r's under ``lr-schedule``); a history
    without it reads the run's ``lr`` in a replay (``strategies.common.fedavg_rounds.recorded_lr``)."""

    def __init__(self, interval: int, client_of_node):
        self.interval, self.client_of_node = interval, client_of_node
        self.rounds: dict[int, dict] = {}

    def record(self, server_round: int, sent: ArrayRecord, replies: list[Message], lr: float | None = None) -> None:
        """The ``on_replies`` hook: keep round 1 and every ``interval``-th round after it."""
        if (server_round - 1) % self.interval:
            return
        clients, counts = {}, {}
        for reply in replies:
            cid = self.client_of_node(reply.metadata.src_node_id)
            clients[cid] = reply.content["arrays"].to_torch_state_dict()
            counts[cid] = int(reply.content["metrics"]["num-examples"])
        self.rounds[server_round] = {"global": sent.to_torch_state_dict(), "clients": clients, "counts": counts,
                                     **({"lr": lr} if lr is not None else {})}


def history_path(cache_folder: str, original_id: str, interval: int) -> str:
    return os.path.join(cache_folder, f"history-{original_id}-every{interval}.pt")


def store(cache_folder: str, original_id: str, history: UpdateHistory) -> int:
    """Write the history; returns its size on disk in bytes."""
    path = history_path(cache_folder, original_id, history.interval)
    with locked(path), atomic_path(path) as tmp:
        torch.save({"interval": history.interval, "rounds": history.rounds}, tmp)
    return os.path.getsize(path)


def load(cache_folder: str, original_id: str, interval: int) -> tuple[dict, int] | None:
    """(the stored history's rounds, its bytes on disk), or None when there is none (or it does not load)."""
    path = history_path(cache_folder, original_id, interval)
    if not os.path.isfile(path):
        return None
    try:
        with locked(path):
            return torch.load(path, map_location="cpu", weights_only=True)["rounds"], os.path.getsize(path)
    except Exception as err:  # a damaged history is rebuilt by pretraining again, never half-used
        log.warning("ignoring update history %s: %s", path, " ".join(str(err).split()))
        return None
