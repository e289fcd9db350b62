"""What Lethe's server reads from its clients' replies, and the step it applies from them.

A *view* is one role's part of a reply, ``{"arrays", "metrics", "node"}``. Rectification
(``strategies.lethe.rectify``) and restore (``strategies.lethe.restore``) judge their steps by the
losses the views report and build their steps from the views' arrays; these helpers serve both.
"""

from __future__ import annotations

import math

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.fedavg_rounds import mean_update
from strategies.common.updates import apply_update
from tasks.model import PLUGIN_PREFIX
from tasks.plugins import specs_to_json

State = dict[str, torch.Tensor]


def train_content(arrays: ArrayRecord, plugins: list[dict], *, role: str, round_no: int, **config) -> RecordDict:
    """A ``train`` message's content: the model (built once per round and shared) and its config."""
    return RecordDict({"arrays": arrays, "config": ConfigRecord(
        {"role": role, "plugins": specs_to_json(plugins), "server-round": round_no, **config})})


def role_view(reply: Message, role: str) -> dict:
    """``{"arrays", "metrics", "node"}`` of one role in a reply (a ``forget+retain`` reply holds both)."""
    content, node = reply.content, reply.metadata.src_node_id
    if "arrays" in content:
        return {"arrays": content["arrays"], "metrics": content["metrics"], "node": node}
    return {"arrays": content[f"arrays.{role}"], "metrics": content[f"metrics.{role}"], "node": node}


def mean_forget_loss(views) -> float:
    """Forget-count-weighted mean of the forget clients' ``loss-before`` (the received backbone's
    forget loss, adapter bypassed)."""
    counts = [int(v["metrics"]["num-examples"]) for v in views]
    losses = [float(v["metrics"]["loss-before"]) for v in views]
    return sum(n * v for n, v in zip(counts, losses)) / max(1, sum(counts))


def mean_loss(views, key: str = "loss") -> float:
    """Count-weighted mean of the reported ``key`` (``loss``, or ``loss-before``: the received model's
    loss before training) of ``views`` (nan without any)."""
    counts = [int(v["metrics"]["num-examples"]) for v in views]
    total = sum(counts)
    return sum(n * float(v["metrics"][key]) for n, v in zip(counts, views)) / total if total else math.nan


def retain_losses(views, baseline: dict[int, float]) -> tuple[float | None, float | None]:
    """Count-weighted mean reported retained loss of ``views`` and of the same nodes in ``baseline``
    (their loss on the model rectification started from); ``(None, None)`` if no node is in both."""
    pairs = [(int(v["metrics"]["num-examples"]), float(v["metrics"]["loss"]), baseline[v["node"]])
             for v in views if v["node"] in baseline]
    total = sum(n for n, _, _ in pairs)
    if not total:
        return None, None
    return sum(n * now for n, now, _ in pairs) / total, sum(n * then for n, _, then in pairs) / total


def losses_before(views) -> dict[int, tuple[int, float]]:
    """``node -> (count, loss-before)``: each retained client's loss of the model it received."""
    return {v["node"]: (int(v["metrics"]["num-examples"]), float(v["metrics"]["loss-before"])) for v in views}


def apply_step(state: State, update: State, retain_views, buffer_names: list[str]) -> State:
    """Eq. 11 on the parameters; buffers (BatchNorm statistics) take the retain stream's average."""
    new = {**state, **apply_update({k: state[k] for k in update}, update)}
    if buffer_names:
        buffers = mean_update(retain_views, state, buffer_names)
        new.update({k: (state[k] + buffers[k]).to(state[k].dtype) for k in buffer_names})
    return new


def without_adapter(state: State) -> State:
    """``state`` without the temporary adapter's tensors."""
    return {k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)}

