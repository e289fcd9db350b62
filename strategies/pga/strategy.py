"""PGA (Halimi et al., "Federated Unlearning: How to Efficiently Erase a Client in FL?") as a method.

1. The leaving client (hello count ``n-forget``; client scenario) gets the original model and its
   FedAvg weight ``p`` (its share of the federation's examples) in one ``query.pga`` message and
   replies with the model after projected gradient ascent (``strategies.pga.client``).
2. The server continues FedAvg on the retained clients for ``pga-post-rounds`` rounds from that
   model (the paper: "we continue the FL process for a few rounds without the participation of the
   target client"; the notebook runs 10 rounds of at most 50 local steps, here the run's local
   settings for ``pga-post-rounds`` = 3 by default — the app's continued-training phase measures any
   later rounds separately).

Not reversible. A leaving client that does not reply ends the phase (``RoundFailed``).
"""

from __future__ import annotations

from flwr.app import ConfigRecord, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, run_rounds
from strategies.common.federation import RunStopped


class PGA(UnlearningMethod):
    """``pga``: the leaving client's projected gradient ascent, then FedAvg rounds without it."""

    name = "pga"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        leaving = fed.nodes_with("n-forget")
        if len(leaving) != 1:
            raise RunStopped(f"phase 'unlearn': pga erases one client, but {len(leaving)} clients hold forget data")
        total = sum(fed.nodes[n].counts["n-all"] for n in fed.all_nodes())
        weight = fed.nodes[leaving[0]].counts["n-all"] / total
        config = ConfigRecord({"weight": weight, "server-round": 1})
        reply = fed.broadcast(leaving, "query.pga", RecordDict({"arrays": ctx.original.arrays, "config": config}),
                              round_no=1, require_all=True)[0]
        fed.cost(fed.phase).rounds += 1
        ascent = {k: float(v) for k, v in reply.content["metrics"].items()}
        arrays = reply.content["arrays"]
        strategy = RoleFedAvg(fed, "retain", fraction_train=cfg["fraction-train"], seed=cfg["seed"] + 3)
        arrays = run_rounds(fed, strategy, arrays, rounds=cfg["pga-post-rounds"],
                            config=ConfigRecord({"epochs": cfg["local-epochs"], "lr": cfg["lr"]}),
                            label="pga post-training", method=self.name)
        details = {"leaving_client": fed.client_id(leaving[0]), "weight": weight, "ascent": ascent,
                   "post_rounds": cfg["pga-post-rounds"]}
        return UnlearnResult(ModelState(arrays), details)
