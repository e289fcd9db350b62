"""Per-node on-disk cache of a client's data view (its partition and forget/retain/test split).

Flower's Deployment Engine starts a fresh ClientApp process for every message, so a view cached
in memory is lost after each message; rebuilding it means loading the whole pool and recomputing
the federation's Dirichlet partition every time. Here the view is stored once per node, keyed like
the partition by the task (``Task.client_view``; vision: ``tasks.vision.views.view_key``). Any
change gives a new key, so a stale view is never read.

Files: ``<folder>/view-<sha256 of the key>.npz``, one array per ``ClientData`` field plus the key
itself; written atomically (a crash leaves no partial file) and read with ``allow_pickle=False``
(no code runs from the file). A file that does not load, or whose stored key differs, is rebuilt.
The folder is the node-config key ``view-cache-dir``, else ``~/.cache/fedunlearn/views``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import zipfile
from typing import Callable

import numpy as np
import torch

from core.files import atomic_path
from tasks.requests import ClientData

log = logging.getLogger("fedunlearn")

FLAG_FIELDS = ("label_flipped",)
TENSOR_FIELDS = tuple(f.name for f in dataclasses.fields(ClientData) if f.name not in ("client_id", *FLAG_FIELDS))


def cache_folder(node_config: dict) -> str:
    """Where this node keeps its views."""
    configured = str(node_config.get("view-cache-dir", "") or "")
    return os.path.expanduser(configured or os.path.join("~", ".cache", "fedunlearn", "views"))


def _path(folder: str, kind: str, key_json: str) -> str:
    return os.path.join(folder, f"{kind}-{hashlib.sha256(key_json.encode()).hexdigest()[:24]}.npz")


def _read(path: str, key_json: str) -> dict[str, np.ndarray] | None:
    """The arrays stored in ``path`` under ``key_json``; None if the file is missing, does not load,
    or holds another key."""
    if not os.path.isfile(path):
        return None
    try:
        with np.load(path, allow_pickle=False) as archive:
            if str(archive["key"]) != key_json:
                return None
            return {name: archive[name] for name in archive.files if name != "key"}
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _write(path: str, key_json: str, arrays: dict[str, np.ndarray]) -> None:
    """``arrays`` and the key into ``path``, atomically; a read-only or full disk costs speed, not
    correctness (a warning, no error)."""
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as handle:
                np.savez(handle, key=np.array(key_json), **arrays)
    except OSError as error:
        log.warning("not cached in %s: %s", os.path.dirname(path), error)


def cached_view(folder: str, key: dict, build: Callable[[], ClientData]) -> ClientData:
    """The view stored under ``key`` in ``folder``, else ``build()`` stored there and returned."""
    key_json = json.dumps(key, sort_keys=True)
    path = _path(folder, "view", key_json)
    stored = _read(path, key_json)
    if stored is not None and all(name in stored for name in ("client_id", *FLAG_FIELDS, *TENSOR_FIELDS)):
        return ClientData(client_id=int(stored["client_id"]),
                          **{name: bool(stored[name]) for name in FLAG_FIELDS},
                          **{name: torch.from_numpy(stored[name].copy()) for name in TENSOR_FIELDS})
    data = build()
    _write(path, key_json, {"client_id": np.array(data.client_id),
                            **{name: np.array(getattr(data, name)) for name in FLAG_FIELDS},
                            **{name: getattr(data, name).numpy() for name in TENSOR_FIELDS}})
    return data


class PartitionFiles:
    """The Dirichlet assignments of ``tasks.partition`` kept in ``folder`` (``tasks.partition.use_store``):
    ``partition-<sha256 of the key>.npz`` with one index array per partition and the key itself,
    stored like the views (atomically, read with ``allow_pickle=False``; a file that does not load,
    or whose stored key differs, counts as missing)."""

    def __init__(self, folder: str):
        self.folder = folder

    def load(self, key: str, num_partitions: int) -> tuple[np.ndarray, ...] | None:
        stored = _read(_path(self.folder, "partition", key), key)
        if stored is None or any(f"p{i}" not in stored for i in range(num_partitions)):
            return None
        return tuple(stored[f"p{i}"].astype(np.int64) for i in range(num_partitions))

    def save(self, key: str, parts: tuple[np.ndarray, ...]) -> None:
        _write(_path(self.folder, "partition", key), key, {f"p{i}": p for i, p in enumerate(parts)})
