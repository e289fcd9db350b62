"""NoT ("NoT: Federated Unlearning via Weight Negation", Khalil et al., CVPR 2025) as a method.

1. The server negates the parameters of the layers named by ``not.layers`` (default: the first
   layer) of the original model (``strategies.negation.maths``); no client takes part and no
   forget data is used.
2. ``not.rounds`` FedAvg rounds on the retained data refine it (role ``retain``: in the client
   scenario the leaving client holds no retained data and takes no part, as in the paper; in the
   class and sample scenarios every client trains on what it keeps), with the run's local settings
   except the lr, which ``not.lr`` may set apart (0: the run's ``lr``).

No official code is known; every choice is written in ``docs/not.md``. Not reversible.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import RoleFedAvg, run_rounds
from strategies.negation.maths import negate, parameter_keys


class NoT(UnlearningMethod):
    """``not``: negate the chosen layers, then FedAvg refinement on the retained data."""

    name = "not"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        keys = parameter_keys(ctx.model_factory(ctx.original.plugins), cfg["not.layers"])
        arrays = ArrayRecord(negate(ctx.original.arrays.to_torch_state_dict(), keys))
        lr = cfg["not.lr"] or cfg["lr"]
        strategy = RoleFedAvg(fed, "retain", fraction_train=cfg["fraction-train"], seed=cfg["seed"] + 5)
        arrays = run_rounds(fed, strategy, arrays, rounds=cfg["not.rounds"],
                            config=ConfigRecord({"epochs": cfg["local-epochs"], "lr": lr}),
                            label="not refinement", method=self.name)
        return UnlearnResult(ModelState(arrays, ctx.original.plugins),
                             {"negated": keys, "refinement_rounds": cfg["not.rounds"], "refinement_lr": lr})
