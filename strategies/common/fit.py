"""How well a model fits the retained clients' training data: the share whose label it predicts.

One ``evaluate`` message with the model to every node that keeps data; each replies with its
``retain-correct`` / ``retain-n`` counts (a task with classes; the LLM task reports none). Lethe
holds its restored model to the original's fit.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict

from strategies.common.federation import Federation
from tasks.plugins import specs_to_json


def evaluate_plain(fed: Federation, count_key: str, arrays: ArrayRecord, round_no: int,
                   require_all: bool = False) -> list[Message]:
    """One ``evaluate`` message with the model ``arrays`` (no plug-ins) to each node holding data
    counted by ``count_key``; their valid replies."""
    content = RecordDict({"arrays": arrays, "config": ConfigRecord({"plugins": specs_to_json([])})})
    return fed.broadcast(fed.nodes_with(count_key), "evaluate", content, round_no=round_no, require_all=require_all)


def retained_counts(fed: Federation, arrays: ArrayRecord, round_no: int) -> dict[int, tuple[int, int]] | None:
    """Per replying node that keeps data, ``(retain-correct, retain-n)``: its training data whose
    label the model ``arrays`` (no plug-ins) predicts; ``None`` on a task whose clients report no
    such counts."""
    metrics = {r.metadata.src_node_id: r.content["metrics"] for r in evaluate_plain(fed, "n-retain", arrays, round_no)}
    if not metrics or not all("retain-correct" in m and "retain-n" in m for m in metrics.values()):
        return None
    return {node: (int(m["retain-correct"]), int(m["retain-n"])) for node, m in metrics.items()}


def fit_share(counts: dict[int, tuple[int, int]], nodes: list[int]) -> float | None:
    """The share of the training data of ``nodes`` predicted right, from :func:`retained_counts`;
    ``None`` where they hold none."""
    total = sum(counts[n][1] for n in nodes)
    return sum(counts[n][0] for n in nodes) / total if total else None
