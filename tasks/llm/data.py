"""Load TOFU-format QA files and WMDP/MMLU-format multiple-choice files from local paths.

Files are read with Hugging Face ``datasets`` (``Dataset.from_json`` reads JSON arrays and JSON
lines, ``Dataset.from_parquet`` Parquet); nothing is downloaded. Records come back as plain dicts in
the same shape `tasks.llm.synthetic` generates, so metrics and training treat both alike:

    {author, question, answer, paraphrased_answer, perturbed_answer: list[str], key_fact}

TOFU layout (``locuslab/TOFU`` on the hub, saved into a local ``llm.data-dir``): a split ``NAME`` is
``NAME.json``, ``NAME.jsonl``, ``NAME.parquet`` or ``NAME/*.parquet`` (the hub's Parquet export).
Accepted names are `TOFU_SPLITS`. Plain splits need ``question, answer``; ``*_perturbed`` splits
also need ``paraphrased_answer`` and ``perturbed_answer`` (a list), except ``real_authors_perturbed``
and ``world_facts_perturbed``, which need only ``perturbed_answer`` (TOFU scores them against the
original answer). Missing optional fields become ``""`` / ``[]``. A JSON file that does not parse is
a one-line ``ValueError`` naming the file and the line where parsing stops. TOFU files carry no
author column: TOFU lists 200 authors x 20 QA pairs in order and
``forgetNN`` is the last NN% of them, so for ``full``, ``retainNN``, ``forgetNN`` and
``forgetNN_perturbed`` the author is ``tofu-author-<index>`` derived from the row position; other
splits get ``""``. TOFU has no ``key_fact``, so fact accuracy is not measured on it.

Multiple choice (``cais/wmdp``, ``cais/mmlu``): columns ``question``, ``choices`` (list of str),
``answer`` (option index, or a letter A, B, ...). A path may be one file or a folder whose
``*.parquet`` / ``*.json`` / ``*.jsonl`` files (searched recursively, sorted) are concatenated.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from pathlib import Path

import datasets
from datasets.exceptions import DatasetGenerationError

TOFU_SPLITS = (
    "full", "forget01", "forget05", "forget10", "retain90", "retain95", "retain99",
    "forget01_perturbed", "forget05_perturbed", "forget10_perturbed", "retain_perturbed",
    "real_authors", "real_authors_perturbed", "world_facts", "world_facts_perturbed",
    "holdout01", "holdout05", "holdout10",
)
QA_COLUMNS = ("question", "answer")
PERTURBED_COLUMNS = ("question", "answer", "paraphrased_answer", "perturbed_answer")
PUBLIC_PERTURBED_COLUMNS = ("question", "answer", "perturbed_answer")
PUBLIC_PERTURBED_SPLITS = ("real_authors_perturbed", "world_facts_perturbed")
TOFU_AUTHORS = 200
TOFU_QA_PER_AUTHOR = 20
_SUFFIXES = (".json", ".jsonl", ".parquet")


def _json_error(path: Path) -> str:
    """Where ``path`` (a JSON array, or JSON lines) stops parsing, as ``"line N: reason"``; ``""`` if it parses."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        return f"not UTF-8 text ({err.reason} at byte {err.start})"
    if text.lstrip().startswith("["):
        try:
            json.loads(text)
        except json.JSONDecodeError as err:
            return f"line {err.lineno}: {err.msg}"
        return ""
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            if line.strip():
                json.loads(line)
        except json.JSONDecodeError as err:
            return f"line {number}: {err.msg}"
    return ""


def _read_table(paths: Sequence[Path]) -> datasets.Dataset:
    parts = []
    for path in paths:
        if path.suffix not in _SUFFIXES:
            raise ValueError(f"{path}: unsupported file type, expected one of {_SUFFIXES}")
        reader = datasets.Dataset.from_parquet if path.suffix == ".parquet" else datasets.Dataset.from_json
        try:
            parts.append(reader(str(path)))
        except ValueError as err:  # datasets' words for an empty file ("[]" or nothing)
            if "corresponds to no data" not in str(err):
                raise
            raise ValueError(f"{path}: holds no records") from None
        except DatasetGenerationError as err:
            where = _json_error(path) if path.suffix != ".parquet" else ""
            if where:
                raise ValueError(f"{path}: not valid JSON at {where}") from None
            cause = " ".join(str(err.__cause__ or err).split())
            raise ValueError(f"{path}: cannot be read as a table ({cause})") from None
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def _require_columns(table: datasets.Dataset, columns: Sequence[str], source: str) -> None:
    for column in columns:
        if column not in table.column_names:
            raise ValueError(f"{source}: missing column {column!r} (has {table.column_names})")


def _first_author(split: str) -> int | None:
    """Index of the first TOFU author in ``split``, when TOFU's ordering determines it."""
    if split in ("full",) or re.fullmatch(r"retain\d\d", split):
        return 0
    match = re.fullmatch(r"forget(\d\d)(_perturbed)?", split)
    if match:
        return TOFU_AUTHORS - TOFU_AUTHORS * int(match.group(1)) // 100
    return None


def qa_records(table: datasets.Dataset, source: str, *, perturbed: bool,
               first_author: int | None = None, columns: Sequence[str] | None = None) -> list[dict]:
    """Normalise a QA table into record dicts (see module docstring); ``columns`` overrides the
    required columns that ``perturbed`` implies."""
    _require_columns(table, columns or (PERTURBED_COLUMNS if perturbed else QA_COLUMNS), source)
    records = []
    for index, row in enumerate(table.to_list()):
        if "author" in row and row["author"] is not None:
            author = str(row["author"])
        elif first_author is not None:
            author = f"tofu-author-{first_author + index // TOFU_QA_PER_AUTHOR}"
        else:
            author = ""
        records.append({
            "author": author,
            "question": row["question"],
            "answer": row["answer"],
            "paraphrased_answer": row.get("paraphrased_answer") or "",
            "perturbed_answer": list(row.get("perturbed_answer") or []),
            "key_fact": row.get("key_fact") or "",
        })
    return records


def _split_files(data_dir: Path, split: str) -> list[Path]:
    for suffix in _SUFFIXES:
        if (data_dir / f"{split}{suffix}").is_file():
            return [data_dir / f"{split}{suffix}"]
    return sorted((data_dir / split).glob("*.parquet")) if (data_dir / split).is_dir() else []


def load_tofu_split(data_dir: str | Path, split: str) -> list[dict]:
    """The records of one TOFU split stored under ``data_dir`` (see module docstring for layout)."""
    if split not in TOFU_SPLITS:
        raise ValueError(f"TOFU split {split!r} unknown; accepted: {', '.join(TOFU_SPLITS)}")
    data_dir = Path(data_dir)
    files = _split_files(data_dir, split)
    if not files:
        raise ValueError(f"TOFU split {split!r} not found in {data_dir}: expected {split}.json, "
                         f"{split}.jsonl, {split}.parquet or {split}/*.parquet; fetch it with: hf download "
                         f"locuslab/TOFU --repo-type dataset --local-dir {data_dir}")
    return qa_records(_read_table(files), str(files[0]), perturbed=split.endswith("_perturbed"),
                      first_author=_first_author(split),
                      columns=PUBLIC_PERTURBED_COLUMNS if split in PUBLIC_PERTURBED_SPLITS else None)


def has_tofu_split(data_dir: str | Path, split: str) -> bool:
    """Whether ``data_dir`` holds split ``split`` in one of the accepted layouts."""
    return bool(_split_files(Path(data_dir), split))


def load_qa_file(path: str | Path, *, perturbed: bool) -> list[dict]:
    """Records of any single TOFU-format QA file (``perturbed`` requires the paraphrased/perturbed columns)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"QA file {path} does not exist")
    return qa_records(_read_table([path]), str(path), perturbed=perturbed)


def _answer_index(value, num_choices: int, source: str) -> int:
    if isinstance(value, str) and re.fullmatch(r"[A-Za-z]", value.strip()):
        index = ord(value.strip().upper()) - ord("A")
    elif isinstance(value, (int, float)) and int(value) == value:
        index = int(value)
    else:
        raise ValueError(f"{source}: answer {value!r} is neither an option index nor a letter")
    if not 0 <= index < num_choices:
        raise ValueError(f"{source}: answer {value!r} is outside the {num_choices} choices")
    return index


def as_multiple_choice(records: Sequence[dict], seed: int) -> list[dict]:
    """QA records as multiple-choice questions: the answer among its perturbed answers, order shuffled
    with ``seed`` (a WMDP-style probe of the same facts)."""
    rng = random.Random(seed)
    questions = []
    for record in records:
        if not record.get("perturbed_answer"):
            raise ValueError("as_multiple_choice needs perturbed answers in every record")
        choices = [record["answer"], *record["perturbed_answer"]]
        order = list(range(len(choices)))
        rng.shuffle(order)
        questions.append({"question": record["question"], "choices": [choices[i] for i in order],
                          "answer": order.index(0)})
    return questions
