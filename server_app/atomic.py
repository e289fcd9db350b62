"""Atomic file writes: write a temporary file in the target folder, then ``os.replace`` it.

A crash mid-write leaves the previous file (or none), never a truncated one.
"""

from __future__ import annotations

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
