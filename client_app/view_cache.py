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

from server_app.atomic import atomic_path
from tasks.requests import ClientData

log = logging.getLogger("fedunlearn")

TENSOR_FIELDS = tuple(f.name for f in dataclasses.fields(ClientData) if f.name != "client_id")


def cache_folder(node_config: dict) -> str:
    """Where this node keeps its views."""
    configured = str(node_config.get("view-cache-dir", "") or "")
    return os.path.expanduser(configured or os.path.join("~", ".cache", "fedunlearn", "views"))


def _path(folder: str, key_json: str) -> str:
    return os.path.join(folder, f"view-{hashlib.sha256(key_json.encode()).hexdigest()[:24]}.npz")


def _load(path: str, key_json: str) -> ClientData | None:
    try:
        with np.load(path, allow_pickle=False) as archive:
            if str(archive["key"]) != key_json:
                return None
            tensors = {name: torch.from_numpy(archive[name].copy()) for name in TENSOR_FIELDS}
            return ClientData(client_id=int(archive["client_id"]), **tensors)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return None


def _store(path: str, key_json: str, data: ClientData) -> None:
    arrays = {name: getattr(data, name).numpy() for name in TENSOR_FIELDS}
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as handle:
            np.savez(handle, key=np.array(key_json), client_id=np.array(data.client_id), **arrays)


def cached_view(folder: str, key: dict, build: Callable[[], ClientData]) -> ClientData:
    """The view stored under ``key`` in ``folder``, else ``build()`` stored there and returned."""
    key_json = json.dumps(key, sort_keys=True)
    path = _path(folder, key_json)
    data = _load(path, key_json) if os.path.isfile(path) else None
    if data is not None:
        return data
    data = build()
    try:
        _store(path, key_json, data)
    except OSError as error:  # a read-only or full disk costs speed, not correctness
        log.warning("data view not cached in %s: %s", folder, error)
    return data


class PartitionFiles:
    """The Dirichlet assignments of ``tasks.partition`` kept in ``folder`` (``tasks.partition.use_store``):
    ``partition-<sha256 of the key>.npz`` with one index array per partition and the key itself,
    written atomically and read with ``allow_pickle=False``; a file that does not load, or whose
    stored key differs, counts as missing."""

    def __init__(self, folder: str):
        self.folder = folder

    def _path(self, key: str) -> str:
        return os.path.join(self.folder, f"partition-{hashlib.sha256(key.encode()).hexdigest()[:24]}.npz")

    def load(self, key: str, num_partitions: int) -> tuple[np.ndarray, ...] | None:
        path = self._path(key)
        if not os.path.isfile(path):
            return None
        try:
            with np.load(path, allow_pickle=False) as archive:
                if str(archive["key"]) != key:
                    return None
                return tuple(archive[f"p{i}"].astype(np.int64) for i in range(num_partitions))
        except (OSError, KeyError, ValueError, zipfile.BadZipFile):
            return None

    def save(self, key: str, parts: tuple[np.ndarray, ...]) -> None:
        try:
            with atomic_path(self._path(key)) as tmp:
                with open(tmp, "wb") as handle:
                    np.savez(handle, key=np.array(key), **{f"p{i}": p for i, p in enumerate(parts)})
        except OSError as error:  # a read-only or full disk costs speed, not correctness
            log.warning("partition not cached in %s: %s", self.folder, error)
