"""A model's plain evaluation on the nodes: one ``evaluate`` message with the model (no plug-ins) to
every node holding a kind of data; each replies with its counts and losses on it."""

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
