"""The server's view of the federation: who is there, how to talk to them, and what it costs.

``Federation`` wraps Flower's ``Grid``. It learns every node's client id and data counts with a
``query.hello`` round, sends messages and collects replies with a timeout, tolerates failing
clients (a round goes on when enough replied, otherwise :class:`RoundFailed` names the phase and
round), and counts every byte that crosses the grid, down and up, per phase.

Every loss is named once per phase: a node whose reply did not arrive within ``round-timeout``
(Flower drops late replies), that answered with an error, or that Flower's SuperLink reports gone
(its heartbeat stopped: the SuperLink answers in the node's place) is logged when it first fails in
a phase, with its node and client id, and listed once in that phase's ``failures`` (results.json
``cost.<phase>.failures``): the first round, every round it missed (``rounds``), why and what noticed
it (``noticed_by``: ``round-timeout``, ``error-reply`` or ``heartbeat``). Nodes failing alike share
one log line. A reply is attributed to the node it was sent to (the SuperLink's own error replies
carry no node id), so a loss is never listed twice. A node the SuperLink reports gone, or that sent
no reply in ``LOST_AFTER`` exchanges running, is dropped from later rounds (``not_asked``), as long
as the nodes left are enough for the round to go on; a round fails only below
``min-reply-fraction``.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field

from flwr.app import ConfigRecord, Message, RecordDict
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid

from tasks.stream import REQUEST_RECORD

log = logging.getLogger("fedunlearn")

LOST_AFTER = 2
POLL_SECONDS = 0.2


class RunStopped(RuntimeError):
    """The run cannot go on; the message says why in one line (the ServerApp reports it and exits)."""


class RoundFailed(RunStopped):
    """Too few clients answered a round; the message names the phase and the round."""


@dataclass
class PhaseCost:
    """What one phase spent: wall seconds and rounds (set by whoever runs the phase), the bytes
    sent to clients (down) and received from them (up), and the replies it lost, counted here.
    ``degraded``: some node's work is missing from the phase's result."""

    seconds: float = 0.0
    rounds: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    failures: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"seconds": round(self.seconds, 3), "rounds": self.rounds,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "failures": [dict(f) for f in self.failures], "degraded": bool(self.failures)}


@dataclass
class NodeInfo:
    """A node's client id (partition id), its data counts (``n-retain``, ``n-forget`` ...) and, for a
    node that reads its own files, the content id of its data (0 for a partition of the shared pool)."""

    node_id: int
    client_id: int
    counts: dict[str, int] = field(default_factory=dict)
    data_id: int = 0
    #: training samples per class it keeps (``retain``) and the request removes (``removed``, by their
    #: true labels); empty on a task without classes
    class_counts: dict[str, list[int]] = field(default_factory=dict)
    #: the hash of its forget set's sample ids, made on the node (``ids-sha256``), and what the ids are (``ids``)
    forget_set: dict[str, str] = field(default_factory=dict)
    #: the forget domain the node's data declares (a task whose forget data spans several domains,
    #: e.g. one knowledge area per group of forget clients); "" where the task names none
    domain: str = ""


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
        self.silent_rounds: dict[int, int] = {}  # node id -> exchanges in a row without a reply
        self.dropped: set[int] = set()
        #: in a stream of requests, the request every message is about (0: before any request); every
        #: message then carries it (``REQUEST_RECORD``) and each client answers with its view of that
        #: request. None outside a stream: messages carry nothing more.
        self.request_index: int | None = None

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
            declared = reply.content.config_records.get("hello-config")
            info = NodeInfo(reply.metadata.src_node_id, int(metrics["client-id"]),
                            {k: int(v) for k, v in metrics.items() if k.startswith("n-")},
                            int(metrics.get("data-id", 0)),
                            {k[len("class-n-"):]: [int(c) for c in v] for k, v in metrics.items()
                             if k.startswith("class-n-")},
                            {k: str(v) for k, v in reply.content["forget-set"].items()}
                            if "forget-set" in reply.content else {},
                            str(declared.get("domain", "")) if declared is not None else "")
            self.nodes[info.node_id] = info

    @property
    def on_one_machine(self) -> bool:
        """Whether every node runs on this machine — Flower's simulation grid, or a grid that says
        ``in_process`` — so the server reads the very files the clients read."""
        from flwr.superlink.grid import InMemoryGrid

        return isinstance(self.grid, InMemoryGrid) or bool(getattr(self.grid, "in_process", False))

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

    def domain(self, node_id: int) -> str:
        """The forget domain node ``node_id`` declared in hello (``""``: none declared)."""
        return self.nodes[node_id].domain

    # --- messaging ------------------------------------------------------------------------
    def exchange(self, messages: list[Message], *, round_no: int, require_all: bool = False) -> list[Message]:
        """Send, wait for replies, charge bytes and time to the current phase, drop failed replies.

        Raises :class:`RoundFailed` when fewer than ``min-reply-fraction`` of the nodes (all of
        them with ``require_all``) sent a valid reply.
        """
        cost = self.cost(self.phase)
        asked = len(messages)
        needed = asked if require_all else math.ceil(self.min_reply_fraction * asked)
        live = [m for m in messages if m.metadata.dst_node_id not in self.dropped]
        if len(live) >= needed:  # a dropped node is asked again only when the round needs it
            for node in sorted({m.metadata.dst_node_id for m in messages} & self.dropped):
                self._record(cost, node, round_no, f"not asked: lost earlier ({LOST_AFTER} exchanges without a "
                             "reply, or gone for the SuperLink)", "not-asked")
            messages = live
        if self.request_index is not None:
            for message in messages:
                message.content[REQUEST_RECORD] = ConfigRecord({"request": self.request_index})
        cost.bytes_down += sum(message_bytes(m) for m in messages)
        replies = self._send_and_receive(messages) if messages else []
        valid, errors, gone = [], defaultdict(list), []
        for node, reply in replies:
            if reply.has_error():
                if int(reply.error.code) == ErrorCode.NODE_UNAVAILABLE:
                    gone.append(node)
                errors[(" ".join(str(reply.error.reason).split()),
                        "heartbeat" if node in gone else "error-reply")].append(node)
            else:
                cost.bytes_up += message_bytes(reply)
                valid.append(reply)
        answered = {node for node, _ in replies} - set(gone)
        silent = [m.metadata.dst_node_id for m in messages if m.metadata.dst_node_id not in answered]
        timed_out = [node for node in silent if node not in gone]
        if timed_out:
            errors[(f"no reply within round-timeout={self.round_timeout:g}s (a late reply is dropped)",
                    "round-timeout")] = timed_out
        for (reason, noticed_by), nodes in errors.items():
            new = [n for n in nodes if self._record(cost, n, round_no, reason, noticed_by)]
            if new:
                log.warning("phase %s round %d: %s: %s", self.phase, round_no, self._name(new, "failed"), reason)
        self._track_silence(answered, silent, gone)
        valid.sort(key=self._reply_order)
        if len(valid) < needed:
            lost = "; ".join(f"{self._name(nodes, 'failed')}: {reason}" for (reason, _), nodes in errors.items())
            raise RoundFailed(f"phase '{self.phase}' round {round_no}: only {len(valid)} of "
                              f"{asked} nodes replied, {needed} needed ({lost})")
        return valid

    def _record(self, cost: PhaseCost, node: int, round_no: int, reason: str, noticed_by: str) -> bool:
        """List ``node``'s failure in ``round_no`` in the phase's failures: a new entry the first time it
        fails in the phase (True: name it in the log), else this round added to its entry."""
        for failure in cost.failures:
            if failure["node_id"] == node:
                if round_no not in failure["rounds"]:
                    failure["rounds"].append(round_no)
                if noticed_by == "not-asked" and round_no not in failure["not_asked"]:
                    failure["not_asked"].append(round_no)
                return False
        cost.failures.append({"phase": self.phase, "round": round_no, "client_id": self._client_or_none(node),
                              "node_id": node, "reason": reason, "noticed_by": noticed_by, "rounds": [round_no],
                              "not_asked": [round_no] if noticed_by == "not-asked" else []})
        return True

    def _track_silence(self, answered: set[int], silent: list[int], gone: list[int]) -> None:
        """Count exchanges in a row without a reply; a node reaching ``LOST_AFTER``, or that the SuperLink
        reports gone, is dropped (not asked while the round can do without it); a dropped node that
        answers again is back."""
        for node in answered:
            self.silent_rounds.pop(node, None)
            self.dropped.discard(node)
        for node in silent:
            self.silent_rounds[node] = self.silent_rounds.get(node, 0) + 1
            if node not in self.dropped and (node in gone or self.silent_rounds[node] >= LOST_AFTER):
                self.dropped.add(node)
                why = "gone for the SuperLink" if node in gone else f"sent no reply in {LOST_AFTER} exchanges running"
                log.warning("phase %s: %s: dropped from later rounds while enough nodes remain", self.phase,
                            self._name([node], why))

    def missed(self, phase: str) -> list[dict]:
        """The nodes whose work is missing from ``phase``'s result: client and node id and the rounds missed."""
        return [{"client_id": f["client_id"], "node_id": f["node_id"], "rounds": list(f["rounds"])}
                for f in self.cost(phase).failures]

    def describe(self, failures: list[dict]) -> str:
        """The clients of ``failures``, for a log line: ``1, 3`` (a node unknown to hello by its node id)."""
        names = sorted({(f["client_id"] is None, f["client_id"] if f["client_id"] is not None else f["node_id"])
                        for f in failures})
        return ", ".join(f"node {n}" if unknown else str(n) for unknown, n in names)

    def _client_or_none(self, node: int) -> int | None:
        return self.nodes[node].client_id if node in self.nodes else None

    def _name(self, nodes: list[int], verb: str) -> str:
        """``node 1002 failed (client 2)`` / ``nodes 1000, 1001 failed (clients 0, 1)``: client ids
        once the hello round has told them."""
        nodes = sorted(nodes, key=lambda n: (self._client_or_none(n) is None, self._client_or_none(n) or 0, n))
        clients = [self._client_or_none(n) for n in nodes]
        plural = "s" if len(nodes) > 1 else ""
        text = f"node{plural} {', '.join(str(n) for n in nodes)} {verb}"
        if all(c is not None for c in clients):
            text += f" (client{plural} {', '.join(str(c) for c in clients)})"
        return text

    def _send_and_receive(self, messages: list[Message]) -> list[tuple[int, Message]]:
        """Push, then pull the replies every ``POLL_SECONDS`` until all are in or ``round-timeout`` ends;
        each reply with the node it answers for (the SuperLink answers in place of a node it lost, from
        its own node id: the reply's ``reply_to_message_id`` names the message, hence the node).

        Flower's ``Grid.send_and_receive`` sleeps 3 s between pulls, which on real SuperNodes adds up
        to 3 s to every round (and to a one-shot method's only round); a grid without push/pull (the
        in-process one) keeps its own ``send_and_receive``."""
        if getattr(self.grid, "in_process", False):
            return [(r.metadata.src_node_id, r) for r in self.grid.send_and_receive(messages, timeout=self.round_timeout)]
        ids = list(self.grid.push_messages(messages))
        sent_to = {mid: m.metadata.dst_node_id for mid, m in zip(ids, messages)}
        pending = set(ids)
        deadline = time.monotonic() + self.round_timeout
        replies: list[tuple[int, Message]] = []
        while pending:
            arrived = list(self.grid.pull_messages(pending))
            for reply in arrived:
                replies.append((sent_to.get(reply.metadata.reply_to_message_id, reply.metadata.src_node_id), reply))
            pending -= {m.metadata.reply_to_message_id for m in arrived}
            if not pending or time.monotonic() >= deadline:
                break
            time.sleep(POLL_SECONDS)
        return replies

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
