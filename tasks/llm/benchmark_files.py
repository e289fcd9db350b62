"""Named tables of the LLM benchmark tasks: from files under ``llm.data-dir``, or generated offline.

A table ``NAME`` (which may hold a subfolder, ``raw/forget``) is read from ``NAME.json`` /
``NAME.jsonl`` / ``NAME.parquet``, else from the Parquet files of folder ``NAME/`` (searched
recursively, as the hub's exports of ``cais/wmdp`` and ``cais/mmlu`` are laid out) or
``NAME-*.parquet`` beside it (the hub's ``<split>-00000-of-00001.parquet``). Reading is
``tasks.llm.data``'s (Hugging Face ``datasets``; nothing is downloaded); a missing table or column
is a one-line ``ValueError`` naming the folder, the table and the accepted layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tasks.llm.data import _answer_index, _read_table, _require_columns


def table_files(data_dir: str | Path, name: str) -> list[Path]:
    """The files holding table ``name`` under ``data_dir`` (module docstring), or ``[]``."""
    base = Path(data_dir) / name
    for suffix in (".json", ".jsonl", ".parquet"):
        if base.with_name(base.name + suffix).is_file():
            return [base.with_name(base.name + suffix)]
    if base.is_dir():
        return sorted(p for p in base.rglob("*.parquet") if p.is_file())
    return sorted(base.parent.glob(f"{base.name}-*.parquet")) if base.parent.is_dir() else []


def has_table(data_dir: str | Path, name: str) -> bool:
    return bool(table_files(data_dir, name))


def read_table(data_dir: str | Path, name: str, columns: Sequence[str]) -> list[dict]:
    """The rows of table ``name`` (plain dicts), which must have ``columns``."""
    files = table_files(data_dir, name)
    if not files:
        raise ValueError(f"{data_dir}: table {name!r} not found: expected {name}.json, {name}.jsonl, "
                         f"{name}.parquet, {name}/**/*.parquet or {name}-*.parquet")
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
