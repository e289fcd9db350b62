"""Run the experiment in one process: a Flower ``Grid`` that calls the real ClientApp directly.

Each node id is one client (``partition-id`` = its index); ``send_and_receive`` calls the ClientApp
with that node's ``Context``, one client after the other. Everything else — the phases, the
strategies, the handlers — is the production code path; only Ray and the SuperLink are skipped.
Tests and benchmark scripts use it (clients run sequentially, so wall times add up over clients,
for every method alike). ``fail_nodes`` makes chosen clients answer with an error; ``node_configs``
gives chosen clients another node config (e.g. their own ``data-path``); ``errors_as_replies``
turns an exception a client raises into the error reply Flower's ClientApp runtime sends.

    python -m server_app.inprocess --clients 10 --run-config "method='retrain' scenario='class'"
"""

from __future__ import annotations

import sys
from typing import Iterable

from flwr.app import Context, Message, RecordDict
from flwr.app.error import Error
from flwr.common.constant import ErrorCode
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity

from client_app.app import app as client_app

NODE_OFFSET = 1000


class InProcessGrid(Grid):
    """All clients in this process; see the module docstring."""

    in_process = True  # server and clients read the same files (``Federation.on_one_machine``)

    def __init__(self, num_clients: int, run_config: dict, fail_nodes: Iterable[int] = (),
                 fail_types: Iterable[str] = ("train",), node_configs: dict[int, dict] | None = None,
                 errors_as_replies: bool = False):
        TaskIdentity.run_id = 1
        TaskIdentity.node_id = 0
        TaskIdentity.task_id = 1
        self.num_clients = num_clients
        self.run_config = run_config
        self.fail_nodes = set(fail_nodes)
        self.fail_types = set(fail_types)
        self.node_configs = dict(node_configs or {})
        self.errors_as_replies = errors_as_replies
        self.sent_types: list[str] = []

    # Grid's abstract surface -----------------------------------------------------------
    def set_run(self, run_id: int) -> None:  # pragma: no cover - not used in-process
        pass

    @property
    def run(self):  # pragma: no cover - not used in-process
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # pragma: no cover
        return Message(content, dst_node_id=dst_node_id, message_type=message_type)

    def get_node_ids(self) -> list[int]:
        return [NODE_OFFSET + i for i in range(self.num_clients)]

    def get_nodes(self):  # pragma: no cover
        return []

    def push_messages(self, messages):  # pragma: no cover
        raise NotImplementedError

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            node = message.metadata.dst_node_id
            self.sent_types.append(message.metadata.message_type)
            index = node - NODE_OFFSET
            node_config = self.node_configs.get(index, {"partition-id": index, "num-partitions": self.num_clients})
            context = Context(run_id=1, node_id=node, state=RecordDict(), run_config=self.run_config,
                              node_config=node_config)
            if index in self.fail_nodes and message.metadata.message_type in self.fail_types:
                reply = Message(Error(code=0, reason="injected failure"), reply_to=message)
            elif self.errors_as_replies:
                try:
                    reply = client_app(message, context)
                except Exception as ex:  # noqa: BLE001 - what Flower's ClientApp runtime replies
                    reason = str(type(ex)) + ":<'" + str(ex) + "'>"
                    reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                                    reply_to=message)
            else:
                reply = client_app(message, context)
            replies.append(reply)
        return replies


def run_inprocess(run_config: dict, num_clients: int, **grid_options) -> str:
    """Run the whole experiment in this process; returns the results folder."""
    from server_app.experiment import Experiment
    from strategies.common.federation import Federation
    from strategies.run_config import parse_config

    cfg = parse_config(run_config)
    grid = InProcessGrid(num_clients, run_config, **grid_options)
    fed = Federation(grid, round_timeout=cfg["round-timeout"], min_reply_fraction=cfg["min-reply-fraction"])
    return Experiment(fed, run_config).run()


def parse_overrides(text: str) -> dict:
    """``"k1=v1 k2='s' table.k3=1"`` -> dict, with TOML value syntax like ``flwr run --run-config``; a
    dotted key stays one dotted key (``table.key``), as Flower flattens it. Items are separated by
    whitespace outside quotes, so a quoted value may hold spaces (``outputs-dir='/my runs'``)."""
    import re

    import tomllib

    from core.config import flatten

    items = re.findall(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""", text)
    return {k: v for item in items for k, v in flatten(tomllib.loads(item)).items()}


def _not_flowers(record) -> bool:
    """False for a record of Flower's own logger (``flwr``) while that logger prints it itself with its
    own handler: the root handler then leaves it out, so the line appears once."""
    import logging

    if record.name != "flwr" and not record.name.startswith("flwr."):
        return True
    return not any(record.levelno >= handler.level for handler in logging.getLogger("flwr").handlers)


def setup_logging(level: int) -> None:
    """``logging.basicConfig(level, "%(message)s")`` for the project's lines (``fedunlearn``), with each
    line printed once: Flower's logger prints its own lines through its own handler and also passes
    them to the root, so the root handler made here skips them (a handler already on the root, such as
    a test's, is left as it is)."""
    import logging

    root = logging.getLogger()
    before = list(root.handlers)
    logging.basicConfig(level=level, format="%(message)s")
    for handler in root.handlers:
        if handler not in before:
            handler.addFilter(_not_flowers)


def main() -> None:
    import argparse
    import logging

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--run-config", default="", help="overrides, as for flwr run --run-config")
    args = parser.parse_args()
    setup_logging(logging.INFO)
    from core.config import ConfigError
    from strategies.run_config import parse_config

    try:
        overrides = parse_overrides(args.run_config)
    except ValueError as err:
        print(f"error: --run-config {args.run_config!r} is not 'key=value ...' in TOML syntax: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        parse_config(overrides, args.clients)  # every config error before any node works: one line
        folder = run_inprocess(overrides, args.clients)  # setup's checks that need the data or the nodes
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(folder)


if __name__ == "__main__":
    main()
