"""Exact-Fun (Xiong et al.) as a method: recompute only from the first round the leaving client changes.

Its original is its own: pretraining aggregates with the quantised FedAvg mean
(``pretraining_aggregate``; ``own_original`` puts ``exactfun.step`` in the cache key and in
results.json) and the server keeps every round's client models (``needs=("update-history",)``).

Unlearning (client scenario):

1. From the history, find the first round whose quantised aggregate changes when the leaving
   client's model is dropped (``maths.first_changed_round``). Before it, training without the
   client would have produced the very same models: nothing is recomputed.
2. From that round's new aggregate, the remaining clients train the later rounds again (the same
   round numbers, seeds and local settings as pretraining), each aggregated by the quantised mean.

The result is quantised retraining without the client, bit for bit: a remaining client's local
training depends only on the model it receives, its data and the round's seed, and every mean is
the same float64 sum in client-id order. ``exactfun.verify`` retrains from scratch (phase
``verify``, charged there) and reports ``equals_quantised_retrain``. ``fraction-train`` must be 1.

Choices (no public code is known): the grid is uniform, ``exactfun.step`` (1e-3) for every layer;
rounding is to the nearest grid point; the recomputation starts at the first changed round (the
paper's point: rounds before it need none). Not reversible.
"""

from __future__ import annotations

import time

from flwr.app import ArrayRecord, ConfigRecord

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, recorded_lr, run_rounds
from strategies.exactfun.maths import first_changed_round, quantised_mean, same_state
from tasks.plugins import specs_to_json


class ExactFun(UnlearningMethod):
    """``exact-fun``: quantised federated training; unlearning recomputes from the first changed round."""

    name = "exact-fun"

    def own_original(self, cfg) -> dict:
        return {"exact-fun-quantised-step": cfg["exactfun.step"]}

    def pretraining_aggregate(self, cfg):
        step = cfg["exactfun.step"]

        def aggregate(replies) -> ArrayRecord:
            return ArrayRecord(quantised_mean([r.content["arrays"].to_torch_state_dict() for r in replies],
                                              [int(r.content["metrics"]["num-examples"]) for r in replies], step))

        return aggregate

    def history_interval(self, cfg) -> int:
        return 1

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        rounds = ctx.update_history(self.name)
        leaving = {fed.client_id(n) for n in fed.nodes_with("n-forget")}
        final = ctx.original.arrays.to_torch_state_dict()
        changed = first_changed_round(rounds, final, leaving, cfg["exactfun.step"])
        order = sorted(rounds)
        if changed is None:
            state, recomputed = final, []
        else:
            first, candidate = changed
            recomputed = [t for t in order if t > first]
            state = self.train_rounds(ctx, candidate, first + 1, order[-1])
        details = {"leaving_clients": sorted(leaving), "first_changed_round": changed[0] if changed else None,
                   "recomputed_rounds": len(recomputed), "rounds_reused": len(order) - len(recomputed) - bool(changed),
                   "history_bytes": ctx.pretraining.get("history_bytes")}
        if cfg["exactfun.verify"]:
            previous, started = fed.phase, time.perf_counter()
            verify = fed.start_phase("verify")
            retrained = self.train_rounds(ctx, rounds[order[0]]["global"], order[0], order[-1])
            verify.seconds += time.perf_counter() - started
            fed.start_phase(previous)
            details["equals_quantised_retrain"] = same_state(state, retrained)
        return UnlearnResult(ModelState(ArrayRecord(state)), details)

    def train_rounds(self, ctx: UnlearnContext, state: dict, first: int, last: int) -> dict:
        """Quantised FedAvg rounds ``first``..``last`` on the retained clients from ``state``, each with
        pretraining's round number, seed, local settings and lr (none when ``first > last``)."""
        cfg = ctx.cfg
        strategy = RoleFedAvg(ctx.fed, "retain", fraction_train=cfg["fraction-train"], seed=cfg["seed"])
        config = ConfigRecord({"epochs": cfg["local-epochs"], "lr": cfg["lr"], "plugins": specs_to_json([])})
        arrays = run_rounds(ctx.fed, strategy, ArrayRecord(state), rounds=max(0, last - first + 1), config=config,
                            label=f"{self.name} rounds {first}-{last}", method=self.name,
                            aggregate=self.pretraining_aggregate(cfg), first_round=first,
                            round_lr=recorded_lr(ctx.update_history(self.name), cfg["lr"]))
        return arrays.to_torch_state_dict()
