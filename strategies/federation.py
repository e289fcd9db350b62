"""The server's view of the federation: who is there, how to talk to them, and what it costs.

``Federation`` wraps Flower's ``Grid``. It learns every node's client id and data counts with a
``query.hello`` round, sends messages and collects replies with a timeout, tolerates failing
clients (a round goes on when enough replied, otherwise :class:`RoundFailed` names the phase and
round), and counts every byte that crosses the grid, down and up, per phase.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

log = logging.getLogger("fedunlearn")


class RunStopped(RuntimeError):
    """The run cannot go on; the message says why in one line (the ServerApp reports it and exits)."""


class RoundFailed(RunStopped):
    """Too few clients answered a round; the message names the phase and the round."""


@dataclass
class PhaseCost:
    """What one phase spent: wall seconds and rounds (set by whoever runs the phase) and the bytes
    sent to clients (down) and received from them (up), counted here."""

    seconds: float = 0.0
    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "rounds": self.rounds,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down}


@dataclass
class NodeInfo:
    """A node's client id (partition id) and its data counts (``n-retain``, ``n-forget`` ...)."""

    node_id: int
    client_id: int
    counts: dict[str, int] = field(default_factory=dict)


def message_bytes(message: Message) -> int:
    """Bytes of every record in a message's content (arrays, metrics, configs)."""
    if message.has_error():
        return 0
    return sum(record.count_bytes() for record in message.content.values())


class Federation:
    """Grid + node directory + cost meter. One instance per ServerApp run."""

    def __init__(self, grid: Grid, *, round_timeout: float, min_reply_fraction: float):
        self.grid = grid
        self.round_timeout = round_timeout
        self.min_reply_fraction = min_reply_fraction
        self.nodes: dict[int, NodeInfo] = {}
        self.costs: dict[str, PhaseCost] = {}
        self.phase = "setup"

    # --- phases and costs -------------------------------------------------------------------
    def start_phase(self, name: str) -> PhaseCost:
        """Make ``name`` the phase that following messages are charged to."""
        self.phase = name
        return self.costs.setdefault(name, PhaseCost())

    def cost(self, name: str) -> PhaseCost:
        return self.costs.setdefault(name, PhaseCost())

    # --- directory ------------------------------------------------------------------------
    def hello(self, config: ConfigRecord) -> None:
        """Ask every connected node for its client id and counts (``query.hello``)."""
        node_ids = list(self.grid.get_node_ids())
        messages = [Message(RecordDict({"config": config}), dst_node_id=n, message_type="query.hello")
                    for n in node_ids]
        replies = self.exchange(messages, round_no=0, require_all=True)
        self.nodes = {}
        for reply in replies:
            metrics = reply.content["hello"]
            info = NodeInfo(reply.metadata.src_node_id, int(metrics["client-id"]),
                            {k: int(v) for k, v in metrics.items() if k.startswith("n-")})
            self.nodes[info.node_id] = info

    @property
    def num_clients(self) -> int:
        return len(self.nodes)

    def nodes_with(self, count_key: str) -> list[int]:
        """Node ids whose ``count_key`` (e.g. ``n-forget``) is positive, sorted by client id."""
        return [n.node_id for n in sorted(self.nodes.values(), key=lambda n: n.client_id)
                if n.counts.get(count_key, 0) > 0]

    def all_nodes(self) -> list[int]:
        return [n.node_id for n in sorted(self.nodes.values(), key=lambda n: n.client_id)]

    def client_id(self, node_id: int) -> int:
        return self.nodes[node_id].client_id

    # --- messaging ------------------------------------------------------------------------
    def exchange(self, messages: list[Message], *, round_no: int, require_all: bool = False) -> list[Message]:
        """Send, wait for replies, charge bytes and time to the current phase, drop failed replies.

        Raises :class:`RoundFailed` when fewer than ``min-reply-fraction`` of the nodes (all of
        them with ``require_all``) sent a valid reply.
        """
        cost = self.cost(self.phase)
        cost.bytes_down += sum(message_bytes(m) for m in messages)
        replies = list(self.grid.send_and_receive(messages, timeout=self.round_timeout)) if messages else []
        valid = []
        for reply in replies:
            if reply.has_error():
                log.warning("phase %s round %d: node %d failed: %s", self.phase, round_no,
                            reply.metadata.src_node_id, reply.error.reason)
            else:
                cost.bytes_up += message_bytes(reply)
                valid.append(reply)
        valid.sort(key=self._reply_order)
        needed = len(messages) if require_all else math.ceil(self.min_reply_fraction * len(messages))
        if len(valid) < needed:
            raise RoundFailed(f"phase '{self.phase}' round {round_no}: only {len(valid)} of "
                              f"{len(messages)} nodes replied, {needed} needed")
        return valid

    def _reply_order(self, reply: Message) -> tuple[int, int]:
        """Replies arrive in any order under Ray; sorting by client id makes every aggregation
        (float sums, centroid concatenation) independent of arrival order: same seed, same result."""
        node = reply.metadata.src_node_id
        return (self.nodes[node].client_id if node in self.nodes else -1, node)

    def broadcast(self, node_ids: list[int], message_type: str, content: RecordDict, *,
                  round_no: int, require_all: bool = False) -> list[Message]:
        """One message of ``message_type`` with the same content to each node; the valid replies."""
        messages = [Message(content, dst_node_id=n, message_type=message_type) for n in node_ids]
        return self.exchange(messages, round_no=round_no, require_all=require_all)
