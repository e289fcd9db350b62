"""FedAU (Gu et al., "Unlearning during Learning: An Efficient Federated Machine Unlearning Method",
IJCAI 2024) as a method: unlearning is one linear operation on classifier heads.

Pretraining (its own original):

- every pretraining ``train`` config names the local objective ``fedau-aux`` and the original's id
  (``pretraining_config``). Clients without forget data train as plain FedAvg does; each client
  holding forget data also trains a linear auxiliary head ``W2`` beside the classifier ``W1`` on the
  same penultimate features, in every round, with the run's SGD settings, on the sum of both
  cross-entropies (``strategies.fedau.client``). The backbone and ``W1`` go to FedAvg as usual;
  ``W2`` stays on the client's disk across rounds and is never aggregated.
- auxiliary labels (``maths.aux_labels``, fixed per sample for the whole pretraining): class
  unlearning labels every sample of a holder with the forget class; sample and client unlearning
  keep a retained sample's label and give each forget sample a random label other than the one it
  is trained with (the public code's ``ul_samples`` / whole-client modes).
- client scenario: before each round the leaving client's ``W2`` restarts from
  ``(1 - g) W1 + g W2`` (``fedau.client-gamma``, the code's ``ul_client_gamma`` 0.5).

Since the holders' auxiliary loss also trains the shared backbone, this original differs from the
shared one: ``own_original`` adds the auxiliary training (and what its labels depend on beyond the
request, which the cache key already holds) to the original's cache key and to results.json
(``run.own_original``); comparison tables mark the row with ``*``.

Unlearning: one ``query.fedau`` message to each holder (no model sent down; its ``W2`` comes
up), then on the server, for weight and bias alike (``maths.unlearned_head``):
class ``W = W1 - mean(W2)``; sample and client ``W = (1 - a) W1 + a mean(W2)``, ``a`` =
``fedau.alpha`` (0.9); the mean is uniform over the holders, as in the code. Only the head changes.

Choices where paper and code differ or are silent:

- the sample/client formula is the paper's. The public code of 2024 (commits 01fc445 to 5e5f445 of
  main_zgx.py) computes ``(1 - alpha) W1`` and then, in its loop over the unlearning clients,
  assigns ``alpha / n * W2`` to weight and bias, so the W1 term is lost (and only the last
  client's head is kept); its 2025 simplification (4692961) adds instead. We implement the paper.
- who trains ``W2``: the clients holding forget data of the run's request (the code's
  "unlearning users"); in the class scenario that is every client holding the class.
- local optimiser: the run's SGD (lr, momentum, no weight decay) for both heads, as every other
  method trains here; the code uses weight decay 5e-4 and a softmax + log loss equal to CE.
- the auxiliary head is ``Linear(feature_dim, classes)`` on the same features as ``W1`` (the
  code's ``classifier_ul``), initialised from a seed of the run and the client.
- the request must be known during pretraining: that is FedAU's design (it "unlearns during
  learning"); a new request needs a new pretraining.
- no training follows the linear operation (the paper's point: no extra steps). Not reversible.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.federation import RunStopped
from strategies.fedau.maths import mean_head, unlearned_head

#: the version of FedAU's auxiliary training (part of its original's cache key)
AUX_VERSION = 1
HEAD_PREFIX = "head."


def aux_label_rule(scenario: str) -> str:
    return "forget-class" if scenario == "class" else "random-other-label-on-forget"


class FedAU(UnlearningMethod):
    """``fedau``: auxiliary heads trained during pretraining; unlearning is a linear operation on heads."""

    name = "fedau"

    def own_original(self, cfg) -> dict:
        own = {"fedau-aux-head": AUX_VERSION, "fedau-aux-labels": aux_label_rule(cfg["scenario"])}
        if cfg["scenario"] == "client":
            own["fedau.client-gamma"] = cfg["fedau.client-gamma"]
        return own

    def pretraining_config(self, cfg, original_id: str) -> dict:
        return {"objective": "fedau-aux", "fedau-original": original_id}

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        holders = fed.nodes_with("n-forget")
        content = RecordDict({"config": ConfigRecord({"fedau-original": ctx.original_id, "server-round": 1})})
        replies = fed.broadcast(holders, "query.fedau", content, round_no=1, require_all=True)
        fed.cost(fed.phase).rounds += 1
        heads, kept = [], {}
        for reply in sorted(replies, key=lambda r: fed.client_id(r.metadata.src_node_id)):
            client = fed.client_id(reply.metadata.src_node_id)
            metrics = {k: float(v) for k, v in reply.content["metrics"].items()}
            if not metrics.get("kept"):
                raise RunStopped(f"phase 'unlearn': fedau: client {client} kept no auxiliary head of original "
                                 f"{ctx.original_id} (its state folder was wiped?); remove that original from "
                                 "cache-dir to pretrain it again")
            heads.append(reply.content["head"].to_torch_state_dict())
            kept[client] = metrics
        state = ctx.original.arrays.to_torch_state_dict()
        w1 = {k: state[HEAD_PREFIX + k] for k in ("weight", "bias")}
        new = unlearned_head(cfg["scenario"], w1, mean_head(heads), cfg["fedau.alpha"])
        state.update({HEAD_PREFIX + k: v.to(state[HEAD_PREFIX + k].dtype) for k, v in new.items()})
        details = {
            "rule": "W1 - mean(W2)" if cfg["scenario"] == "class" else f"(1 - {cfg['fedau.alpha']}) W1 + "
                                                                       f"{cfg['fedau.alpha']} mean(W2)",
            "holders": sorted(kept),
            "aux_labels": aux_label_rule(cfg["scenario"]),
            # what the auxiliary training cost during pretraining (the original's own cost is cost.built.original)
            "pretraining_aux": {
                "train_seconds": sum(m["aux-train-seconds"] for m in kept.values()),
                "rounds": {c: int(m["aux-rounds"]) for c, m in kept.items()},
                "bytes": 0,  # W2 never travels during pretraining
                "storage_bytes": int(sum(m["stored-bytes"] for m in kept.values())),
            },
        }
        return UnlearnResult(ModelState(ArrayRecord(state), list(ctx.original.plugins)), details)
