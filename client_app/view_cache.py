"""Per-node on-disk cache of a client's data view (its partition and forget/retain/test split).

Flower's Deployment Engine starts a fresh ClientApp process for every message, so a view cached
in memory is lost after each message; rebuilding it means loading the whole pool and recomputing
the federation's Dirichlet partition every time. Here the view is stored once per node, keyed like
the partition: the run-config keys that determine the data (:data:`VIEW_KEYS`), the partition id
and count (or the node's ``data-path``), a fingerprint of the source files (size and mtime of
each; for the embedded digits, scikit-learn's version) and a hash of the code that builds views
(:data:`VIEW_CODE`). Any change gives a new key, so a stale view is never read.

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
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from server_app.atomic import atomic_path
from tasks.requests import ClientData

log = logging.getLogger("fedunlearn")

VIEW_KEYS = ("task", "data-dir", "scenario", "poison", "forget-client", "forget-class", "sample-fraction",
             "backdoor-target", "trigger-size", "seed", "dirichlet-alpha", "test-fraction")
FORMAT_VERSION = 1
ROOT = Path(__file__).resolve().parents[1]
VIEW_CODE = ("tasks/requests.py", "tasks/partition.py", "tasks/node_data.py", "tasks/vision/datasets.py",
             "tasks/vision/triggers.py")
TENSOR_FIELDS = tuple(f.name for f in dataclasses.fields(ClientData) if f.name != "client_id")


def cache_folder(node_config: dict) -> str:
    """Where this node keeps its views."""
    configured = str(node_config.get("view-cache-dir", "") or "")
    return os.path.expanduser(configured or os.path.join("~", ".cache", "fedunlearn", "views"))


def file_fingerprint(paths: list[str]) -> list:
    """[path, size, mtime] of each existing file of ``paths`` (a missing one simply is not listed)."""
    return [[p, s.st_size, s.st_mtime_ns] for p in paths if os.path.isfile(p) for s in [os.stat(p)]]


def pool_fingerprint(cfg) -> list:
    """What identifies the shared pool's source files (a change of any file changes the key)."""
    from tasks.registry import VISION_TASKS, data_dir
    from tasks.vision import datasets

    dataset = VISION_TASKS[cfg["task"]].dataset
    if dataset == "digits":
        return ["scikit-learn", metadata.version("scikit-learn")]
    root = os.path.abspath(os.path.expanduser(data_dir(cfg["data-dir"])))
    if dataset == "mnist":
        folder, names = os.path.join(root, "MNIST", "raw"), datasets._MNIST_FILES
    else:
        layout = datasets._CIFAR[dataset]
        folder, names = os.path.join(root, layout.folder), layout.train_files
    return file_fingerprint([os.path.join(folder, name) for name in names])


def view_key(cfg, source: dict, files: list) -> dict:
    """The cache key: ``source`` (partition id and count, or data path) + ``files`` fingerprint."""
    code = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in VIEW_CODE)).hexdigest()
    return {"format": FORMAT_VERSION, "code": code, "config": {k: cfg[k] for k in VIEW_KEYS}, "source": source,
            "files": files}


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
