"""The two reference rows of every table: the original model and the retrain oracle."""

from __future__ import annotations

from strategies.common.base import UnlearnContext, UnlearnResult, UnlearningMethod


class NoUnlearning(UnlearningMethod):
    """``none``: the original model unchanged (the origin row of every table)."""

    name = "none"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        return UnlearnResult(ctx.original)


class Retrain(UnlearningMethod):
    """``retrain``: FedAvg from scratch on retained data only — the exact-unlearning oracle."""

    name = "retrain"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        return UnlearnResult(ctx.retrain(), built="retrain")
