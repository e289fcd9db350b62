"""The fedunlearn ServerApp: run config -> experiment phases -> results folder."""

from __future__ import annotations

import logging
import sys
import threading

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from core.config import ConfigError, flatten
from server_app.experiment import Experiment
from strategies.common.federation import Federation, RunStopped
from strategies.run_config import parse_config

log = logging.getLogger("fedunlearn")

app = ServerApp()


class RunFailed(RuntimeError):
    """Raised out of the ServerApp when the run stops: Flower records a ServerApp that raises an
    ``Exception`` as failed (``flwr ls``: ``finished:failed``), while ``SystemExit`` leaves the
    thread it runs in quietly and the run is listed as ``finished:completed``."""


def _setup_logging() -> None:
    if not log.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("fedunlearn %(levelname)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def _import_dynamo() -> None:
    """Import ``torch._dynamo`` (2-3 CPU-seconds). Every ``torch.optim`` optimizer's ``step`` imports
    it on its first call, and a ServerApp is a fresh process per run: without this, FedUP's filter
    training paid it inside the unlearning phase (measured: 2.3 s for a first filter training in a
    fresh process against 0.4 s for the next). Run in a thread at start, it overlaps with the hello
    round's wait for the nodes; an optimizer that starts earlier waits for the same import."""
    import torch._dynamo  # noqa: F401


def user_keys(grid: Grid) -> set[str] | None:
    """The run-config keys the user set (``--run-config``), which Flower keeps on the run beside the
    run config it merged with pyproject's defaults; None where the grid does not say."""
    override = getattr(getattr(grid, "run", None), "override_config", None)
    return None if override is None else set(flatten(dict(override)))


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Validate the whole run config before any work, then run the phases; a run that stops logs
    its one-line reason and fails (see :class:`RunFailed`)."""
    _setup_logging()
    torch.set_num_threads(1)
    threading.Thread(target=_import_dynamo, name="import-torch-dynamo", daemon=True).start()
    try:
        given = user_keys(grid)
        cfg = parse_config(context.run_config, given=given)
        fed = Federation(grid, round_timeout=cfg["round-timeout"], min_reply_fraction=cfg["min-reply-fraction"])
        folder = Experiment(fed, context.run_config, given).run()
    except (ConfigError, RunStopped) as err:
        log.error("run stopped: %s", err)
        raise RunFailed(f"fedunlearn: {err}") from None
    log.info("fedunlearn results folder: %s", folder)
