"""Federated evaluation of models: every node measures locally, the server pools the counts."""

from __future__ import annotations

import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from core.config import Config
from strategies.common.base import ModelState
from strategies.common.federation import Federation
from tasks.plugins import specs_to_json

EVALUATE_PHASE = "evaluate"


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


class ReceivedModelMeasure:
    """Each round's model measured inside the next round, for ``run_rounds(measure_received=...)``.

    Continued training measures its model after every round (the KR curve). The model of round r
    is what every training node receives in round r + 1, so the ``train`` messages of round r + 1
    ask for its local metrics too (config ``evaluate-received``: the ClientApp evaluates the
    received model after training and replies ``metrics.received``), and the nodes that do not
    train in that round (a leaving client, a node left out by ``fraction-train``) get an
    ``evaluate`` message with it in the same exchange. On Flower's Deployment Engine a round is a
    fresh ClientApp process per node, so this halves the rounds of continued training. Each
    client's metrics are those of an ``evaluate`` round (the same seeds; tested); ``entries``
    holds the pooled entry of every measured round, in order. Bytes and seconds are the round's.
    """

    def __init__(self, fed: Federation, cfg: Config, plugins: list[dict]):
        self.fed, self.cfg, self.plugins = fed, cfg, plugins
        self.entries: list[dict] = []

    def attach(self, train_messages: list[Message], arrays: ArrayRecord) -> list[Message]:
        """Mark the round's ``train`` messages; ``evaluate`` messages for every other node."""
        training = set()
        for message in train_messages:
            message.content["config"]["evaluate-received"] = True
            training.add(message.metadata.dst_node_id)
        content = RecordDict({"arrays": arrays, "config": ConfigRecord({"plugins": specs_to_json(self.plugins),
                                                                        "features": False})})
        return [Message(content, dst_node_id=node, message_type="evaluate")
                for node in self.fed.all_nodes() if node not in training]

    def collect(self, replies: list[Message]) -> list[Message]:
        """Pool the received model's metrics from every reply; the ``train`` replies, for aggregation."""
        per_client, trained = [], []
        for reply in replies:  # sorted by client id (Federation.exchange), as an evaluate round's
            if reply.metadata.message_type == "evaluate":
                per_client.append(dict(reply.content["metrics"]))
            else:
                per_client.append(dict(reply.content.pop("metrics.received")))  # FedAvg wants one MetricRecord
                trained.append(reply)
        self.entries.append(self.cfg.task.pool_metrics(self.cfg, per_client))
        return trained
