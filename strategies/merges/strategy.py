"""The merge baselines AVG / SUM / TIES / FULM as methods of the app: FIRM's round, another merge.

Each receives the very ``query.fisher`` uploads FIRM would (``strategies.firm.strategy.FisherMerge``:
same clients, same release settings ``firm.forget-objective`` / ``firm.fisher-batches``), and merges
them with its own rule (``strategies.merges.merge``) at its ``<name>-scale``; TIES also takes
``ties.density``, FULM ``fulm.threshold`` and ``fulm.density``.
"""

from __future__ import annotations

from strategies.firm.strategy import FisherMerge
from strategies.merges.merge import BASELINE_ROLES, merge_baseline


class MergeBaseline(FisherMerge):
    """One merge baseline; subclasses name it and say which of its settings the merge takes."""

    def __init__(self):
        self.roles = BASELINE_ROLES[self.name]

    def params(self, cfg) -> dict:
        return {}

    scale_key = ""

    def merge(self, cfg, uploads, shapes):
        return merge_baseline(self.name, uploads, cfg[self.scale_key], expected_shapes=shapes, **self.params(cfg))


class AvgMerge(MergeBaseline):
    name, scale_key = "avg", "avg.scale"


class SumMerge(MergeBaseline):
    name, scale_key = "sum", "sum.scale"


class TiesMerge(MergeBaseline):
    name, scale_key = "ties", "ties.scale"

    def params(self, cfg) -> dict:
        return {"density": cfg["ties.density"]}


class FulmMerge(MergeBaseline):
    name, scale_key = "fulm", "fulm.scale"

    def params(self, cfg) -> dict:
        return {"threshold": cfg["fulm.threshold"], "density": cfg["fulm.density"]}
