"""What identifies a vision client's data view, for the per-node view cache (``client_app.view_cache``).

The key holds the run-config keys that determine the data (:data:`VIEW_KEYS`), the partition id
and count (or the node's ``data-path``), a fingerprint of the source files (size and mtime of
each; for the embedded digits, scikit-learn's version) and a hash of the code that builds views
(:data:`VIEW_CODE`). Any change gives a new key, so a stale view is never read.
"""

from __future__ import annotations

import hashlib
import os
from importlib import metadata
from pathlib import Path

VIEW_KEYS = ("task", "data-dir", "scenario", "poison", "forget-client", "forget-class", "sample-fraction",
             "backdoor-target", "backdoor-share", "trigger-size", "seed", "dirichlet-alpha", "test-fraction")
FORMAT_VERSION = 1
ROOT = Path(__file__).resolve().parents[2]
VIEW_CODE = ("tasks/requests.py", "tasks/stream.py", "tasks/partition.py", "tasks/node_data.py", "tasks/vision/datasets.py",
             "tasks/vision/triggers.py")


def file_fingerprint(paths: list[str]) -> list:
    """[path, size, mtime] of each existing file of ``paths`` (a missing one simply is not listed)."""
    return [[p, s.st_size, s.st_mtime_ns] for p in paths if os.path.isfile(p) for s in [os.stat(p)]]


def pool_fingerprint(dataset: str, root: str) -> list:
    """What identifies the shared pool's source files under ``root`` (a change of any file changes the key)."""
    from tasks.vision import datasets

    if dataset == "digits":
        return ["scikit-learn", metadata.version("scikit-learn")]
    root = os.path.abspath(os.path.expanduser(root))
    if dataset == "mnist":
        folder, names = os.path.join(root, "MNIST", "raw"), datasets._MNIST_FILES
    else:
        layout = datasets._CIFAR[dataset]
        folder, names = os.path.join(root, layout.folder), layout.train_files
    return file_fingerprint([os.path.join(folder, name) for name in names])


def view_key(cfg, source: dict, files: list) -> dict:
    """The cache key: ``source`` (partition id and count, or data path) + ``files`` fingerprint."""
    from tasks.stream import view_key_part

    code = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in VIEW_CODE)).hexdigest()
    return {"format": FORMAT_VERSION, "code": code, "config": {**{k: cfg[k] for k in VIEW_KEYS}, **view_key_part(cfg)},
            "source": source, "files": files}
