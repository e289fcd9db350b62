"""FedEraser (Liu et al.) as a method: replay the kept pretraining rounds without the leaving client.

Pretraining keeps, on the server, the global model and every client's returned model of every
``federaser.interval``-th round (``needs=("update-history",)``, ``server_app.history``). Unlearning:

1. The first kept round is aggregated from the remaining clients' old models with no calibration
   (the paper: the first reconstruction step needs none).
2. At each later kept round the remaining clients that took part in it train
   ``ceil(federaser.epoch-ratio x local-epochs)`` epochs from the new global model (one ``train``
   message each, the round's seed), and the server calibrates layer by layer
   (``strategies.federaser.maths.calibrate``): the old round's step length, the new direction.

Choices: the calibration step uses the global model the old clients *started* round t from as
``oldGM`` (so ``oldCM - oldGM`` is the round's update, as the paper's formula reads); variants of
the public code index the global model after the round there, which makes the old step the
difference between two means of the same models (close to zero). Means are weighted by example
counts. Client scenario only (it removes a whole client). Not reversible.
"""

from __future__ import annotations

import math

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import recorded_lr, require_finite
from strategies.federaser.maths import calibrate, mean_model


class FedEraser(UnlearningMethod):
    """``federaser``: calibrated replay of the kept rounds without the leaving client."""

    name = "federaser"

    def history_interval(self, cfg) -> int:
        return cfg["federaser.interval"]

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        rounds = ctx.update_history(self.name)
        leaving = {fed.client_id(n) for n in fed.nodes_with("n-forget")}
        node_of = {fed.client_id(n): n for n in fed.all_nodes()}
        epochs = math.ceil(cfg["federaser.epoch-ratio"] * cfg["local-epochs"])
        order = sorted(rounds)

        def remaining(t: int) -> list[int]:
            return sorted(c for c in rounds[t]["clients"] if c not in leaving and c in node_of)

        def old_mean(t: int) -> dict:
            kept = remaining(t)
            return mean_model([rounds[t]["clients"][c] for c in kept], [rounds[t]["counts"][c] for c in kept])

        new_global, lr_of = old_mean(order[0]), recorded_lr(rounds, cfg["lr"])  # each round at the lr it trained at
        cost = fed.cost(fed.phase)
        for t in order[1:]:
            config = ConfigRecord({"epochs": epochs, "lr": lr_of(t), "role": "retain", "server-round": t})
            messages = [Message(RecordDict({"arrays": ArrayRecord(new_global), "config": config}),
                                dst_node_id=node_of[c], message_type="train") for c in remaining(t)]
            replies = fed.exchange(messages, round_no=t)
            new_mean = mean_model([r.content["arrays"].to_torch_state_dict() for r in replies],
                                  [int(r.content["metrics"]["num-examples"]) for r in replies])
            candidate = ArrayRecord(calibrate(new_global, rounds[t]["global"], old_mean(t), new_mean))
            require_finite(candidate, phase=fed.phase, round_no=t, method=self.name)
            new_global = candidate.to_torch_state_dict()
            cost.rounds += 1
        details = {"leaving_clients": sorted(leaving), "kept_rounds": order, "calibration_rounds": len(order) - 1,
                   "calibration_epochs": epochs, "history_bytes": ctx.pretraining.get("history_bytes")}
        return UnlearnResult(ModelState(ArrayRecord(new_global)), details)
