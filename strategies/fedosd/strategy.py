"""FedOSD ("Federated Unlearning with Gradient Descent and Conflict Mitigation", Pan et al., AAAI 2025).

Client scenario. From the original model ``w_start``:

1. **Unlearning**, ``fedosd.unlearn-rounds`` rounds: every client answers ``query.fedosd`` with the
   gradient of one round of local training (the leaving client on the unlearning cross-entropy of
   its data, the others on the cross-entropy of theirs). The server takes the forget clients' mean
   gradient ``g_u``, projects it onto the orthogonal complement of the retained gradients and
   rescales it to ``||g_u||`` (``maths.orthogonal_direction``), and steps ``w -= lr d``.
2. **Post-training**, ``fedosd.recovery-rounds`` rounds on the retained clients: each gradient loses
   its component along ``w - w_start`` and keeps its norm (``maths.without_component``); the server
   steps along their mean.

Round ``k`` (counted over both stages, from 0) uses ``lr * fedosd.lr-decay**k``, with ``lr`` the
stage's rate, as the code's ``adjust_learning_rate``. Means are uniform over clients (the code's
``1 / len`` weights), not example-weighted. Only parameters are stepped; buffers keep the original
model's values, as the code's server model, which never runs a forward pass in training mode.
Not reversible.

Where the original is so sure of the forget data that the softmax gives its label exactly 1 in
float32, the unlearning cross-entropy sits at its maximum ``log 2`` and has no gradient: the leaving
client's local step moves nothing and FedOSD cannot leave the original (on digits this happens on
very skewed partitions, where the label's logit leads by tens of nats on every triggered sample and
the gradient norm is of order 1e-14).
The method is run as published; such rounds are logged as a warning and counted in
``forget_gradient_zero_rounds``, so a row that forgot nothing says why.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod
from strategies.common.fedavg_rounds import require_finite
from strategies.common.federation import RunStopped
from strategies.fedosd.maths import flatten, orthogonal_direction, unflatten, without_component

log = logging.getLogger("fedunlearn")


class FedOSD(UnlearningMethod):
    """``fedosd``: orthogonal steepest descent on the unlearning loss, then post-training."""

    name = "fedosd"

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        forget = fed.nodes_with("n-forget")
        retained = [n for n in fed.nodes_with("n-retain") if n not in forget]
        if not forget or not retained:
            raise RunStopped(f"phase 'unlearn': fedosd needs a leaving client and retained clients, found "
                             f"{len(forget)} and {len(retained)}")
        state = ctx.original.arrays.to_torch_state_dict()
        keys = [name for name, _ in ctx.model_factory(ctx.original.plugins).named_parameters()]
        start = flatten(state, keys)
        weights, arrays = start.clone(), ctx.original.arrays
        unlearn_rounds, recovery_rounds = cfg["fedosd.unlearn-rounds"], cfg["fedosd.recovery-rounds"]
        norms = []
        for k in range(unlearn_rounds + recovery_rounds):
            unlearning = k < unlearn_rounds
            lr = (cfg["fedosd.lr"] if unlearning else cfg["fedosd.recovery-lr"]) * cfg["fedosd.lr-decay"] ** k
            roles = {**{n: "retain" for n in retained}, **({n: "forget" for n in forget} if unlearning else {})}
            grads = self._gradients(fed, arrays, roles, lr, k + 1, keys)
            if unlearning:
                g_u = torch.stack([grads[n] for n in forget]).mean(0)
                step = orthogonal_direction(g_u, torch.stack([grads[n] for n in retained if n in grads]))
                norms.append(float(torch.linalg.vector_norm(g_u)))
                if norms[-1] == 0.0 and norms.count(0.0) == 1:
                    log.warning("[fedosd] round %d: the leaving client's unlearning loss has no gradient (its softmax "
                                "is saturated at the forget labels): this step cannot move the model", k + 1)
            else:
                moved = weights - start
                step = torch.stack([without_component(g, moved) for g in grads.values()]).mean(0)
            weights = weights - lr * step
            previous, arrays = arrays, ArrayRecord({**state, **unflatten(weights, state, keys)})
            require_finite(arrays, phase=fed.phase, round_no=k + 1, method=self.name, last_finite=previous)
            fed.cost(fed.phase).rounds += 1
            log.info("[fedosd %s] round %d/%d  lr %.3g  direction norm %.4g  distance to start %.4g",
                     "unlearning" if unlearning else "post-training", k + 1, unlearn_rounds + recovery_rounds, lr,
                     float(torch.linalg.vector_norm(step)), float(torch.linalg.vector_norm(weights - start)))
        details = {"unlearn_rounds": unlearn_rounds, "recovery_rounds": recovery_rounds,
                   "forget_gradient_norm_first": norms[0] if norms else None,
                   "forget_gradient_norm_last": norms[-1] if norms else None,
                   "forget_gradient_zero_rounds": norms.count(0.0),
                   "distance_to_start": float(torch.linalg.vector_norm(weights - start))}
        return UnlearnResult(ModelState(arrays, ctx.original.plugins), details)

    @staticmethod
    def _gradients(fed, arrays: ArrayRecord, roles: dict[int, str], lr: float, round_no: int,
                   keys: list[str]) -> dict[int, torch.Tensor]:
        """Each node's flat gradient for its role; a forget node must answer (the step needs it)."""
        messages = [Message(RecordDict({"arrays": arrays, "config": ConfigRecord(
            {"role": role, "lr": lr, "server-round": round_no})}), dst_node_id=node, message_type="query.fedosd")
            for node, role in roles.items()]
        replies = fed.exchange(messages, round_no=round_no)
        grads = {r.metadata.src_node_id: flatten(r.content["gradient"].to_torch_state_dict(), keys) for r in replies}
        missing = [n for n, role in roles.items() if role == "forget" and n not in grads]
        if missing:
            raise RunStopped(f"phase '{fed.phase}' round {round_no}: the leaving client sent no gradient")
        if not any(role == "retain" and n in grads for n, role in roles.items()):
            raise RunStopped(f"phase '{fed.phase}' round {round_no}: no retained client sent a gradient")
        return grads
