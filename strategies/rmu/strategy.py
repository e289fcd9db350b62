"""RMU (Li et al., "The WMDP Benchmark", Representation Misdirection for Unlearning) as a federated method.

One round, like the other one-round LLM objectives: every client holding forget data (hello count
``n-forget``) receives the original adapter, trains it with RMU (``strategies.rmu.client``) for
``llm.unlearn-epochs`` epochs at ``llm.unlearn-lr`` and uploads it; the server applies the
forget-count-weighted mean update to the original adapter. Retained clients take no part; nothing
is reversible. ``method.retain_term`` in results.json names the forget clients that had retained
records for the retain term.
"""

from __future__ import annotations

from strategies.common.base import UnlearnContext, UnlearnResult
from strategies.objectives.strategy import ObjectiveUnlearning
from strategies.rmu.settings import KEYS


class RMU(ObjectiveUnlearning):
    name, objective = "rmu", "rmu"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        result = super().unlearn(ctx)
        fed = ctx.fed
        result.details.update({key: ctx.cfg[key] for key in KEYS})
        result.details["retain_term"] = {fed.client_id(n): fed.nodes[n].counts.get("n-retain", 0) > 0
                                         for n in fed.nodes_with("n-forget")}
        return result
