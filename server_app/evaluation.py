"""Federated evaluation of models: every node measures locally, the server pools the counts."""

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
    """The results-contract entry of one model (see :func:`evaluate_models`)."""
    return evaluate_models(fed, cfg, {"model": model}, {"model": features})["model"]


def evaluate_models(fed: Federation, cfg: Config, models: dict[str, ModelState],
                    features: dict[str, dict | None] | None = None) -> dict[str, dict]:
    """The results-contract entry (retain_acc, forget_acc, test_acc, mia, extras) of each of
    ``models``, pooled by the task (``Task.pool_metrics``), from one ``evaluate`` round: every node
    receives all the models in one message and replies with the metrics of each.

    One round, not one per model: on Flower's Deployment Engine every message is a fresh ClientApp
    process on the node (imports, data view), so the run's three or four final evaluations cost one
    process start instead of one each. The metrics are those of separate rounds (each model is
    evaluated with the same seeds; tested).

    Where ``features[name]`` is a dict, vision clients also send a sample of that model's
    penultimate features, pooled into ``features[name]["retain"]`` and ``["forget"]`` (for FD and
    the PCA plot). Bytes and seconds are charged to the ``evaluate`` phase, whichever phase asked.
    """
    features = features or {}
    previous = fed.phase
    cost = fed.start_phase(EVALUATE_PHASE)
    started = time.perf_counter()
    try:
        content = RecordDict({"config": ConfigRecord({"models": ",".join(models)})})
        for name, model in models.items():
            content[f"arrays.{name}"] = model.arrays
            content[f"config.{name}"] = ConfigRecord({"plugins": specs_to_json(model.plugins),
                                                      "features": features.get(name) is not None})
        replies = fed.broadcast(fed.all_nodes(), "evaluate", content, round_no=cost.rounds + 1)
        cost.rounds += 1
        entries = {}
        for name in models:
            per_client = [dict(reply.content[f"metrics.{name}"]) for reply in replies]
            wanted = features.get(name)
            if wanted is not None:
                samples = [r.content[f"features.{name}"].to_torch_state_dict() for r in replies
                           if f"features.{name}" in r.content]
                for part in ("retain", "forget"):
                    wanted[part] = torch.cat([s[part] for s in samples]) if samples else torch.zeros(0)
            entries[name] = cfg.task.pool_metrics(cfg, per_client)
        return entries
    finally:
        cost.seconds += time.perf_counter() - started
        fed.start_phase(previous)
