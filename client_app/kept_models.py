"""What a client keeps from pretraining on its own disk: its local model of the last round.

A real client holds the model it trained in the last round it took part in; PGA (the leaving client
reverses its own learning) starts from exactly that model. Flower's ClientApp keeps no state
between messages (the Deployment Engine starts a fresh process for each), so when the pretraining's
last ``train`` message carries ``keep-model-as`` (the original model's id, ``server_app.cache.entry_id``),
the client writes the model it trained, atomically, to

    <folder>/last-local-<original id>-client<client id>.pt

The folder is the node-config key ``state-dir`` (a SuperNode's own disk), else ``kept/`` under the
run's ``cache-dir`` (simulation: every client on this machine), else ``~/.cache/fedunlearn/kept``.
The weights never leave the client; they load with ``weights_only=True`` (a planted file cannot run
code). A missing or unreadable file reads as ``None``: the method then says what it did instead.
"""

from __future__ import annotations

import logging
import os
import re

import torch

from core.config import Config
from core.files import atomic_path

log = logging.getLogger("fedunlearn")


def folder(node_config: dict, cfg: Config) -> str:
    configured = str(node_config.get("state-dir", "") or "")
    if configured:
        return os.path.expanduser(configured)
    if cfg["cache-dir"]:
        return os.path.join(cfg["cache-dir"], "kept")
    return os.path.join(os.path.expanduser("~"), ".cache", "fedunlearn", "kept")


def _path(node_config: dict, cfg: Config, client_id: int, model_id: str) -> str:
    if not re.fullmatch(r"[0-9a-f]{16}", model_id):
        raise ValueError(f"kept-model id {model_id!r} must be 16 hex digits (an original model's id)")
    return os.path.join(folder(node_config, cfg), f"last-local-{model_id}-client{client_id}.pt")


def keep(node_config: dict, cfg: Config, client_id: int, model_id: str, state: dict) -> None:
    """Store this client's last local model of the original ``model_id``."""
    path = _path(node_config, cfg, client_id, model_id)
    with atomic_path(path) as tmp:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, tmp)


def kept(node_config: dict, cfg: Config, client_id: int, model_id: str) -> dict | None:
    """This client's kept last local model of ``model_id``, or None when it has none (or it is unreadable)."""
    path = _path(node_config, cfg, client_id, model_id)
    if not os.path.isfile(path):
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file costs the exactness of the client's model, not the run
        log.warning("kept local model %s not readable (%s); not used", path, " ".join(str(err).split()))
        return None
