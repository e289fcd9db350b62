"""Prepare a SuperNode before it joins: check its data and store its data view for a run config.

    python -m client_app.prepare --node-config "partition-id=0 num-partitions=3" [--run-config "seed=7"]

A node operator runs this once, with the same ``--node-config`` the SuperNode will get (and the run
config the federation's admin announced, if it is not the app's default). It builds exactly what
the node's first message of that run would build — the Dirichlet assignment of the shared pool
(``partition-id`` nodes) or the node's own files (``data-path`` nodes) and the request's
forget/retain/test view — and stores it in the node's view cache (``view-cache-dir``,
``client_app.view_cache``). Why:

- **A bad ``data-path`` is found now**, with the same one-line error the node would otherwise send
  to the server in its first reply, before anyone starts a run.
- **The first message is as fast as every later one.** Flower starts a fresh ClientApp process
  for every message; computing a demo node's partition imports flwr-datasets and Hugging Face
  ``datasets`` (3–4 s on a 2-core machine), which otherwise lands on that node's first
  message of its first run.

The run config is Flower's own fusion (``flwr.common.config``) of this checkout's
``pyproject.toml`` defaults with ``--run-config``, the node config Flower's own parse of
``--node-config``, so the stored view's key is the one the run computes. A run with another config
still works: the node builds its view on its first message, and reuses a stored partition when
only request settings differ (the assignment is keyed by labels, clients, alpha and seed only).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import click
from flwr.common.config import get_fused_config_from_dir, parse_config_args

from client_app.state import client_view_of, data_source
from client_app.view_cache import cache_folder

ROOT = Path(__file__).resolve().parents[1]


def _parsed(option: str, text: str) -> dict:
    """``"k=v k='s'"`` parsed as Flower parses ``--node-config`` / ``--run-config``."""
    try:
        return parse_config_args([text]) if text else {}
    except click.ClickException as error:
        raise ValueError(f"{option}: {error.message}") from None


def prepare(node_config: str, run_config: str = "") -> str:
    """Build and store the view of this node for this run config; a one-line summary of it.
    Raises ValueError (one line, naming the setting) on a bad node config, run config or data."""
    node, overrides = _parsed("--node-config", node_config), _parsed("--run-config", run_config)
    try:
        run = get_fused_config_from_dir(ROOT, overrides)
    except ValueError as error:  # flwr: an override key the app does not declare
        raise ValueError(f"--run-config: {error}") from None
    cfg, data = client_view_of(run, node, given=tuple(overrides))
    counts = data.counts()
    kept = (f"view stored in {cache_folder(node)}" if cfg.task.client_view(cfg, data_source(node))[0] is not None
            else f"task '{cfg['task']}' keeps no view on disk: each message builds it")
    return (f"prepared client {data.client_id} (task '{cfg['task']}', scenario '{cfg['scenario']}'): "
            f"{counts['n-retain'] + counts['n-forget']} training samples, {counts['n-forget']} to forget; {kept}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--node-config", required=True, help="the SuperNode's --node-config, e.g. "
                        "\"partition-id=0 num-partitions=3\" or \"data-path='/data/node0' partition-id=0\" (TOML: quote paths)")
    parser.add_argument("--run-config", default="", help="the run's overrides, as for flwr run --run-config")
    args = parser.parse_args(argv)
    try:
        print(prepare(args.node_config, args.run_config))
    except (ValueError, OSError) as error:
        print(f"prepare: {' '.join(str(error).split())}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
