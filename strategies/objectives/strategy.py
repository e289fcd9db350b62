"""One-round LLM unlearning baselines ``ga``, ``npo``, ``simnpo`` (Lethe section V's federated adaptation).

Lethe compares against NPO and SimNPO this way: "each participating client locally applies the
corresponding NPO or SimNPO objective and uploads the resulting LoRA update to the server once for
aggregation", so they cost one round. Here the participating clients are those holding forget data
(hello count ``n-forget``): each receives the original adapter, trains it for ``llm.unlearn-epochs``
epochs at ``llm.unlearn-lr`` on its forget records with the objective (``ascent`` for GA, ``npo``,
``simnpo``; ``strategies.objectives.losses``), and uploads it. The server applies the forget-count-weighted
mean update to the original adapter:

    w = w_orig + sum_k (n_k / sum_j n_j) (w_k - w_orig)

(with one forget client: its adapter). Retained clients take no part; nothing is reversible.
A forget client that fails ends the phase (``RoundFailed``).
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import mean_update
from strategies.common.updates import apply_update


class ObjectiveUnlearning(UnlearningMethod):
    """Forget clients train the adapter once with ``objective``; the server averages their updates."""

    objective = "ascent"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        start = ctx.original.arrays.to_torch_state_dict()
        nodes = fed.nodes_with("n-forget")
        config = ConfigRecord({"role": "forget", "objective": self.objective, "server-round": 1,
                               "llm-epochs": cfg["llm.unlearn-epochs"], "llm.lr": cfg["llm.unlearn-lr"]})
        replies = fed.broadcast(nodes, "train", RecordDict({"arrays": ctx.original.arrays, "config": config}),
                                round_no=1, require_all=True)
        fed.cost(fed.phase).rounds += 1
        arrays = ArrayRecord(apply_update(start, mean_update([r.content for r in replies], start, start)))
        details = {"objective": self.objective, "forget_clients": [fed.client_id(n) for n in nodes],
                   "final_loss": [float(r.content["metrics"]["loss"]) for r in replies],
                   "epochs": cfg["llm.unlearn-epochs"], "lr": cfg["llm.unlearn-lr"]}
        return UnlearnResult(ModelState(arrays), details)


class GradientAscent(ObjectiveUnlearning):
    name, objective = "ga", "ascent"


class NPO(ObjectiveUnlearning):
    name, objective = "npo", "npo"


class SimNPO(ObjectiveUnlearning):
    name, objective = "simnpo", "simnpo"
