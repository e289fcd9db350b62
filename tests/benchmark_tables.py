"""Shared by the LLM benchmark tests: the benchmark tasks' tables saved as the files a ``llm.data-dir`` holds.

``write_tables`` writes rows (e.g. ``tasks.llm.benchmark_synthetic``'s) as a hub Parquet shard
``<config>/<split>`` + ``HUB_SHARD`` or a ``.json`` file in JSON lines (TOFU's files), so the tests
read them back through the real loaders (``tasks.llm.benchmark_files``, ``tasks.llm.data``).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import datasets

#: the suffix ``hf download`` gives a split stored as one Parquet shard
HUB_SHARD = "-00000-of-00001.parquet"


def write_tables(folder: str | Path, files: dict[str, list[dict]]) -> None:
    """Save each table of ``files`` (a path relative to ``folder`` -> its rows) in the format its
    suffix names: ``.parquet`` (one Parquet file, as the hub's shards) or ``.json`` (JSON lines);
    each is written to a temporary file and renamed into place."""
    for name, rows in files.items():
        path = Path(folder) / name
        if path.suffix not in (".parquet", ".json"):
            raise ValueError(f"{path}: write_tables writes .parquet or .json files")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=path.suffix)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            if path.suffix == ".json":
                handle.writelines(json.dumps(row) + "\n" for row in rows)
        if path.suffix == ".parquet":
            datasets.Dataset.from_list(list(rows)).to_parquet(tmp)
        os.replace(tmp, path)
