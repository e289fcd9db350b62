"""Named tables of the LLM benchmark tasks, read from the files the Hugging Face hub publishes.

A table is one split of one config of a hub dataset, named ``<config>/<split>`` relative to
``llm.data-dir`` (``wmdp-bio/test``, ``raw/forget``, ``mmlu/all/test``). ``hf download REPO
--repo-type dataset --local-dir DIR`` stores such a split as ``<config>/<split>-NNNNN-of-NNNNN.parquet``,
the layout read here; also read: ``<config>/<split>/*.parquet`` (the hub's automatic Parquet
export) and one file ``<config>/<split>.parquet`` / ``.json`` / ``.jsonl``. Reading is
``tasks.llm.data``'s (Hugging Face ``datasets``; nothing is downloaded). A missing table is one
line naming it, the folder and the command that fetches it; a missing column, one line naming it.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from tasks.llm.data import _answer_index, _read_table, _require_columns

MMLU_TABLE = "mmlu/all/test"
MMLU_FETCH = "hf download cais/mmlu --repo-type dataset --include 'all/test-*' --local-dir {dir}/mmlu"


def table_files(data_dir: str | Path, name: str) -> list[Path]:
    """The files holding table ``name`` under ``data_dir`` (module docstring), or ``[]``."""
    base = Path(data_dir) / name
    for suffix in (".json", ".jsonl", ".parquet"):
        if base.with_name(base.name + suffix).is_file():
            return [base.with_name(base.name + suffix)]
    shards = sorted(base.parent.glob(f"{glob.escape(base.name)}-*.parquet")) if base.parent.is_dir() else []
    if shards:
        return shards
    return sorted(base.glob("*.parquet")) if base.is_dir() else []


def has_table(data_dir: str | Path, name: str) -> bool:
    return bool(table_files(data_dir, name))


def read_table(data_dir: str | Path, name: str, columns: Sequence[str], fetch: str) -> list[dict]:
    """The rows of table ``name`` (plain dicts), which must have ``columns``; ``fetch`` is the command
    that downloads it (``{dir}`` stands for ``data_dir``), named when the table is missing."""
    files = table_files(data_dir, name)
    if not files:
        raise ValueError(f"{data_dir}: table {name!r} not found (expected {name}-*.parquet, {name}/*.parquet or "
                         f"{name}.parquet/.json/.jsonl); fetch it with: {fetch.format(dir=data_dir)}")
    table = _read_table(files)
    _require_columns(table, columns, str(files[0]))
    rows = table.to_list()
    if not rows:
        raise ValueError(f"{files[0]}: holds no records")
    return rows


def multiple_choice(rows: Sequence[dict], source: str) -> list[dict]:
    """``{question, choices, answer}`` rows with ``answer`` as an option index (a letter is accepted)."""
    out = []
    for row in rows:
        choices = [str(c) for c in row["choices"]]
        if len(choices) < 2:
            raise ValueError(f"{source}: question {str(row['question'])[:40]!r} has fewer than 2 choices")
        out.append({"question": str(row["question"]), "choices": choices,
                    "answer": _answer_index(row["answer"], len(choices), source)})
    return out


def as_training_records(questions: Sequence[dict]) -> list[dict]:
    """Multiple-choice questions as the QA records clients train on: the question and its correct
    option as the answer; the options stay with the record for scoring."""
    return [{**q, "answer_index": q["answer"], "answer": q["choices"][q["answer"]]} for q in questions]


def as_scored_questions(records: Sequence[dict]) -> list[dict]:
    """Training records of `as_training_records` back as ``{question, choices, answer (index)}``."""
    return [{"question": r["question"], "choices": r["choices"], "answer": r["answer_index"]} for r in records]
