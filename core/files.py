"""Safe file writes: atomic replacement, an inter-process lock, and a writability probe.

``atomic_path``: write a temporary file in the target folder, then ``os.replace`` it, so a crash
mid-write leaves the previous file (or none), never a truncated one; the file gets the mode a
plain ``open`` would give it (``0o666`` less the umask), not ``mkstemp``'s ``0o600``. ``locked``: an
exclusive ``fcntl.flock`` on ``<path>.lock``, so parallel runs (a sweep on a shared machine) that
read-modify-write one file never lose each other's writes; the lock file is removed on release
(while still held: a waiter that then locks the removed file sees it is gone and locks afresh), so
none is left beside the results. ``folder_problem``: why a folder cannot receive files, checked
before any work so a run never trains and then fails to save. ``sha256_of``: a file's content hash,
or a folder's combined hash (``folder_sha256``).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import tempfile
from contextlib import contextmanager
from functools import lru_cache
from typing import Iterator


def _umask() -> int:
    """This process's umask, read without changing it where Linux tells it (``/proc``); else set and
    restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path next to ``path``; on success it replaces ``path``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0o600; a result file follows the umask
    finally:
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
    """Hold an exclusive lock on ``<path>.lock`` for the duration of the block; the lock file is
    created for it and removed when it is released.

    The holder removes the file before it unlocks, so a process that opened the file earlier and then
    gets the lock holds a lock on a removed file: it checks that the file it locked is still the one
    at ``<path>.lock`` and, if not, opens that path again — only one process ever holds the lock of
    the file at the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    lock_path = path + ".lock"
    while True:
        handle = open(lock_path, "a", encoding="utf-8")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                current = os.stat(lock_path)
            except FileNotFoundError:
                current = None
            mine = os.fstat(handle.fileno())
            if current is not None and (current.st_ino, current.st_dev) == (mine.st_ino, mine.st_dev):
                break
        except BaseException:
            handle.close()
            raise
        handle.close()  # locked a file its holder removed: lock the one at the path now
    try:
        yield
    finally:
        try:
            os.remove(lock_path)
        except FileNotFoundError:
            pass
        handle.close()  # closing unlocks


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


def sha256_of(path: str) -> str:
    """The sha256 of a file's bytes, hex; of a folder, ``folder_sha256``."""
    if os.path.isdir(path):
        return folder_sha256(path)
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(path: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, name), path)
                  for root, _, names in os.walk(path) for name in names)


@lru_cache(maxsize=4)
def _folder_sha256(path: str, stamp: tuple) -> str:
    lines = "".join(f"{name} {sha256_of(os.path.join(path, name))}\n" for name in _files(path))
    return hashlib.sha256(lines.encode("utf-8")).hexdigest()


def folder_sha256(path: str) -> str:
    """A folder's sha256: the sha256 of the lines ``<relative path> <sha256 of the file>`` of every
    file in it, sorted by path; it changes when any file changes, is added or goes. Computed once per
    content of the folder (its files' sizes and modification times)."""
    path = os.path.abspath(os.path.expanduser(path))
    stats = {name: os.stat(os.path.join(path, name)) for name in _files(path)}
    stamp = tuple((name, stat.st_size, stat.st_mtime_ns) for name, stat in stats.items())
    return _folder_sha256(path, stamp)
