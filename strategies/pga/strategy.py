"""PGA (Halimi et al., "Federated Unlearning: How to Efficiently Erase a Client in FL?") as a method.

1. Each client holding forget data (client scenario: the leaving client; class and sample, as
   FedUP's Table 3 applies PGA there: every holder) gets the original model, its FedAvg weight
   ``p`` (its share of the federation's examples) and the original's id (its kept last-round model,
   ``client_app.kept_models``) in one ``query.pga`` message and replies with the model after
   projected gradient ascent on its forget data (``strategies.pga.client``). Several replies are
   averaged weighted by their forget-set sizes (a choice: the paper erases one client; weighting
   by forget data lets a holder of more forgotten samples move the model more).
2. The server continues FedAvg on the retained clients for ``pga.post-rounds`` rounds from that
   model (the paper: "we continue the FL process for a few rounds without the participation of the
   target client"; the notebook runs 10 rounds of at most 50 local steps, here the run's local
   settings for ``pga.post-rounds`` = 3 by default — the app's continued-training phase measures any
   later rounds separately).

Not reversible. A holder that does not reply ends the phase (``RoundFailed``).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, run_rounds
from strategies.common.updates import weighted_average


class PGA(UnlearningMethod):
    """``pga``: the leaving client's projected gradient ascent, then FedAvg rounds without it."""

    name = "pga"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        holders = fed.nodes_with("n-forget")
        total = sum(fed.nodes[n].counts["n-all"] for n in fed.all_nodes())
        weights = {n: fed.nodes[n].counts["n-all"] / total for n in holders}
        messages = [Message(RecordDict({"arrays": ctx.original.arrays, "config": ConfigRecord(
            {"weight": weights[n], "server-round": 1, "kept-model": ctx.original_id})}),
            dst_node_id=n, message_type="query.pga") for n in holders]
        replies = fed.exchange(messages, round_no=1, require_all=True)
        fed.cost(fed.phase).rounds += 1
        ascents = {fed.client_id(r.metadata.src_node_id): {k: float(v) for k, v in r.content["metrics"].items()}
                   for r in replies}
        arrays = ArrayRecord(weighted_average([r.content["arrays"].to_torch_state_dict() for r in replies],
                                              [a["num-examples"] for a in ascents.values()]))
        strategy = RoleFedAvg(fed, "retain", fraction_train=cfg["fraction-train"], seed=cfg["seed"] + 3)
        arrays = run_rounds(fed, strategy, arrays, rounds=cfg["pga.post-rounds"],
                            config=ConfigRecord({"epochs": cfg["local-epochs"], "lr": cfg["lr"]}),
                            label="pga post-training", method=self.name)
        details = {"ascending_clients": sorted(ascents), "weights": {fed.client_id(n): w for n, w in weights.items()},
                   "ascent": ascents, "post_rounds": cfg["pga.post-rounds"]}
        return UnlearnResult(ModelState(arrays), details)
