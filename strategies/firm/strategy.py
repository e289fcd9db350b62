"""FIRM as a method of the app (LLM task); the merge baselines (``strategies.merges``) share its round.

One round, no further client contact:

1. The server sends the original model (the federated LoRA adapter) in a ``query.fisher`` message to
   every forget client (hello count ``n-forget`` > 0; its forget domain is the one its data declared
   in hello — the WMDP-style task's clients name theirs, so clients of one domain are pooled before
   normalisation as in the paper —, else its own, named by its client id) and, for the merges that use retain vectors (FIRM, AVG, FULM), to every other client
   holding retained data (``n-retain`` > 0). Config: role, objective (forget: ``firm.forget-objective``,
   retain: ``ce``), ``llm-epochs`` / ``llm.lr`` = ``llm.unlearn-epochs`` / ``llm.unlearn-lr`` (the budget
   of ga/npo/simnpo, so SUM on one forget client with scale 1 is exactly ``ga``), ``fisher-batches``.
2. Each client replies with its task vector (adapter after - adapter before) and the diagonal empirical
   Fisher of the LoRA tensors at the original adapter (``strategies.firm.client.adapter_release``).
3. The server merges the uploads with ``strategies.firm.aggregate.FIRM`` (or a baseline's merge) and the unlearned
   model is ``original adapter + merged update``: an ordinary adapter model state, so evaluation,
   continued training and the cache treat it like any other.

Why the LoRA space and not the paper's weight space (``vec(s B A)``): in this federation the original
model is the base weights plus the trained federated adapter, and the app's model state *is* that
adapter. A merged dense weight update is not a rank-r adapter; it could only travel as a dense delta
of every adapted weight (a model state of another kind, 4.7x the adapter's bytes on the tiny
model at rank 16, 256x for a 4096 x 4096 projection at rank 8). Merging in the adapter's own
coordinates keeps the unlearned model an adapter. The Fisher is taken at the original adapter,
whose B is not zero, so A and B both carry curvature (at a fresh adapter A's Fisher would vanish).
The weight-space path stays in ``firm_release`` (the paper's coordinates).

A forget client that has retained records too (the sample scenario) uploads once, as a forget client:
in the paper every client has one role. A forget client that does not reply ends the phase
(``RoundFailed``); a missing retain client is tolerated down to ``min-reply-fraction``. Malformed
uploads are dropped with a warning (``strategies.firm.aggregate.validate_uploads``); with no forget upload left
the run stops with one line. The baselines receive the very uploads FIRM would (their Fishers are
validated, then unused), so a comparison differs only in the merge.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.federation import Federation, RunStopped
from strategies.firm.aggregate import FIRM, MergeReport

log = logging.getLogger("fedunlearn")

State = dict[str, torch.Tensor]


def _release_config(cfg, role: str) -> ConfigRecord:
    objective = cfg["firm.forget-objective"] if role == "forget" else "ce"
    return ConfigRecord({"role": role, "objective": objective, "server-round": 1,
                         "llm-epochs": cfg["llm.unlearn-epochs"], "llm.lr": cfg["llm.unlearn-lr"],
                         "fisher-batches": cfg["firm.fisher-batches"]})


def _upload(fed: Federation, reply: Message, role: str) -> dict:
    """``strategies.firm.aggregate``'s upload mapping from one reply; absent parts stay absent (dropped later)."""
    node = reply.metadata.src_node_id
    client = fed.client_id(node)
    upload = {"client_id": client, "role": role, "domain": fed.domain(node) or str(client)}
    arrays, metrics = reply.content.array_records, reply.content.metric_records
    for part, key in (("task_vector", "task-vector"), ("fisher", "fisher")):
        if key in arrays:
            upload[part] = arrays[key].to_torch_state_dict()
    if "metrics" in metrics and "num-examples" in metrics["metrics"]:
        upload["num_examples"] = int(metrics["metrics"]["num-examples"])
    return upload


class FisherMerge(UnlearningMethod):
    """One ``query.fisher`` round to the clients of ``roles``, then ``merge`` (see the module docstring)."""

    roles: tuple[str, ...] = ("forget", "retain")

    def merge(self, cfg, uploads: list[dict], shapes: dict) -> tuple[State, MergeReport]:
        raise NotImplementedError

    def collect(self, ctx: UnlearnContext) -> tuple[list[dict], dict[str, list[int]]]:
        """Every reply as an upload mapping, and the client ids asked per role."""
        fed = ctx.fed
        forget = fed.nodes_with("n-forget")
        asked = {"forget": forget}
        if "retain" in self.roles:
            asked["retain"] = [n for n in fed.nodes_with("n-retain") if n not in forget]
        uploads = []
        for role, nodes in asked.items():
            content = RecordDict({"arrays": ctx.original.arrays, "config": _release_config(ctx.cfg, role)})
            replies = fed.broadcast(nodes, "query.fisher", content, round_no=1, require_all=role == "forget")
            uploads += [_upload(fed, reply, role) for reply in replies]
        fed.cost(fed.phase).rounds += 1
        return uploads, {role: [fed.client_id(n) for n in nodes] for role, nodes in asked.items()}

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg = ctx.cfg
        original = ctx.original.arrays.to_torch_state_dict()
        uploads, asked = self.collect(ctx)
        try:
            merged, report = self.merge(cfg, uploads, {k: tuple(v.shape) for k, v in original.items()})
        except ValueError as err:
            raise RunStopped(f"phase 'unlearn': {self.name}: {err}") from None
        unlearned = {k: original[k] + merged[k].to(original[k].dtype) for k in original}
        log.info("[%s] merged the uploads of clients %s (dropped: %s); |update| %.4g", self.name, report.used,
                 report.dropped or "none", report.merged_norm)
        domains = {str(u["client_id"]): u["domain"] for u in uploads if u["role"] == "forget"}
        details = {"space": "lora", "asked": asked, "domains": domains, "forget_objective": cfg["firm.forget-objective"],
                   "epochs": cfg["llm.unlearn-epochs"], "lr": cfg["llm.unlearn-lr"],
                   "fisher_batches": cfg["firm.fisher-batches"], **report.to_dict()}
        return UnlearnResult(ModelState(ArrayRecord(unlearned)), details)


class FIRMMethod(FisherMerge):
    """``firm``: pool forget domains, Fisher-normalised Top-alpha merge, per-tensor retention projection."""

    name = "firm"

    def merge(self, cfg, uploads, shapes):
        return FIRM.from_config(cfg.as_dict()).aggregate(uploads, expected_shapes=shapes)

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        result = super().unlearn(ctx)
        tensors = result.details["tensors"].values()
        result.details["max_kkt_residual"] = max((max(t["residuals"].values()) for t in tensors), default=0.0)
        result.details["active_constraints"] = sum(sum(lam > 0 for lam in t["lambdas"]) for t in tensors)
        return result
