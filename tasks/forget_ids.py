"""The hash of a forget set that a node reports for the receipt: made of sample ids, never of data.

A sample's id is a stable id of its record in the node's data: its index in the shared pool where
the node holds a partition of it, its position in the node's own training records where it reads
its own files (``data-path``). The hash is the sha256 of the sorted ids written in decimal and
joined by commas (``"3,17,240"``), so anyone who holds the ids can recompute it, and the node never
has to send them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

POOL_INDEX = "index in the shared pool"
OWN_POSITION = "position in the node's own training records"


def ids_text(ids: Iterable[int]) -> str:
    """The ids as the hash reads them: sorted, decimal, comma-separated."""
    return ",".join(str(i) for i in sorted(int(i) for i in ids))


def ids_sha256(ids: Iterable[int]) -> str:
    """sha256 (hex) of :func:`ids_text`."""
    return hashlib.sha256(ids_text(ids).encode("ascii")).hexdigest()
