"""Federated evaluation of a model: every node measures locally, the server pools the counts."""

from __future__ import annotations

import time

import torch
from flwr.app import ConfigRecord, RecordDict

from strategies.common.base import ModelState
from strategies.common.federation import Federation
from tasks.config import Config
from tasks.plugins import specs_to_json

EVALUATE_PHASE = "evaluate"


def evaluate_model(fed: Federation, cfg: Config, model: ModelState, features: dict | None = None) -> dict:
    """The results-contract entry (retain_acc, forget_acc, test_acc, mia, extras) of ``model``, pooled
    by the task (``Task.pool_metrics``).

    With a ``features`` dict, vision clients also send a sample of penultimate features, pooled
    into ``features["retain"]`` and ``features["forget"]`` (for FD and the PCA plot). Bytes and
    seconds are charged to the ``evaluate`` phase, whichever phase asked.
    """
    previous = fed.phase
    cost = fed.start_phase(EVALUATE_PHASE)
    started = time.perf_counter()
    try:
        content = RecordDict({"arrays": model.arrays,
                              "config": ConfigRecord({"plugins": specs_to_json(model.plugins),
                                                      "features": features is not None})})
        replies = fed.broadcast(fed.all_nodes(), "evaluate", content, round_no=cost.rounds + 1)
        cost.rounds += 1
        per_client = [dict(reply.content["metrics"]) for reply in replies]
        if features is not None:
            for name in ("retain", "forget"):
                parts = [r.content["features"].to_torch_state_dict()[name] for r in replies if "features" in r.content]
                features[name] = torch.cat(parts) if parts else torch.zeros(0)
        return cfg.task.pool_metrics(cfg, per_client)
    finally:
        cost.seconds += time.perf_counter() - started
        fed.start_phase(previous)
