"""Safe file writes: atomic replacement, an inter-process lock, and a writability probe.

``atomic_path``: write a temporary file in the target folder, then ``os.replace`` it, so a crash
mid-write leaves the previous file (or none), never a truncated one. ``locked``: an exclusive
``fcntl.flock`` on ``<path>.lock``, so parallel runs (a sweep on a shared machine) that
read-modify-write one file never lose each other's writes. ``folder_problem``: why a folder
cannot receive files, checked before any work so a run never trains and then fails to save.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    os.close(fd)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path: str, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)


@contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``<path>.lock`` (created if needed) for the duration of the block."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".lock", "a", encoding="utf-8") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def folder_problem(path: str) -> str | None:
    """Why files cannot be written into folder ``path`` (created if missing), or None when they can."""
    path = os.path.abspath(os.path.expanduser(path))
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} is a file, not a folder"
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        return f"{path} is not writable ({err.strerror or err})"
    return None
