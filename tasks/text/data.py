"""Text pools: AG News from ``data-dir`` (Hugging Face ``datasets``) or the synthetic corpus, tokenised.

AG News is read in the layout of the Hugging Face dataset ``fancyzhx/ag_news`` (``ag_news``):
``<data-dir>/data/train-*.parquet`` (and ``test-*.parquet``) with columns ``text`` and ``label``
(0 World, 1 Sports, 2 Business, 3 Sci/Tech); or its CSV form ``<data-dir>/train.csv`` with the header
``Class Index,Title,Description`` (classes 1..4; text = title + " " + description). The pool is the
training split (its first ``text.max-samples`` rows when set); clients keep their local test split
from their own partition, as on the vision tasks.
"""

from __future__ import annotations

import glob
import hashlib
import os
from dataclasses import dataclass

import torch

CSV_COLUMNS = ("Class Index", "Title", "Description")


@dataclass(frozen=True)
class TextPool:
    texts: tuple[str, ...]
    labels: tuple[int, ...]

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for text, label in zip(self.texts, self.labels):
            digest.update(f"{label}\t{text}\n".encode())
        return digest.hexdigest()


def agnews_files(root: str) -> tuple[str, list[str]]:
    """(``parquet`` or ``csv``, the training files) found under ``root``."""
    parquet = sorted(glob.glob(os.path.join(root, "data", "train-*.parquet")))
    if parquet:
        return "parquet", parquet
    csv = os.path.join(root, "train.csv")
    if os.path.isfile(csv):
        return "csv", [csv]
    raise FileNotFoundError(f"run-config 'data-dir'={root!r}: no AG News files (expected data/train-*.parquet "
                            "as in the Hugging Face dataset fancyzhx/ag_news, or train.csv with "
                            "'Class Index,Title,Description'); copy them there, no download is attempted")


def load_agnews(root: str, max_samples: int = 0) -> TextPool:
    """The AG News training pool under ``root``; one-line errors for missing files or columns."""
    from datasets import load_dataset

    form, files = agnews_files(root)
    split = load_dataset(form, data_files={"train": files}, split="train")
    columns = set(split.column_names)
    if form == "parquet":
        missing = {"text", "label"} - columns
        if missing:
            raise ValueError(f"run-config 'data-dir'={root!r}: {os.path.basename(files[0])} has columns "
                             f"{sorted(columns)}, no {' or '.join(sorted(missing))} column (need 'text' and 'label')")
    elif set(CSV_COLUMNS) - columns:
        raise ValueError(f"run-config 'data-dir'={root!r}: train.csv has columns {sorted(columns)}: need the header "
                         f"{','.join(CSV_COLUMNS)} (the label and text columns)")
    if max_samples:
        split = split.select(range(min(max_samples, len(split))))
    if form == "parquet":
        texts, labels = list(split["text"]), [int(v) for v in split["label"]]
    else:
        texts = [f"{t} {d}" for t, d in zip(split["Title"], split["Description"])]
        labels = [int(v) - 1 for v in split["Class Index"]]
    if not texts or min(labels) < 0 or max(labels) > 3:
        raise ValueError(f"run-config 'data-dir'={root!r}: AG News needs at least one row and labels of 4 classes "
                         f"(0..3, or 1..4 in train.csv), got {len(texts)} rows")
    return TextPool(tuple(str(t) for t in texts), tuple(labels))


def tokenize(tokenizer, texts: list[str] | tuple[str, ...], max_length: int) -> torch.Tensor:
    """Token ids and attention mask of ``texts``, padded to ``max_length``: int64 (N, 2, L)."""
    batch = tokenizer(list(texts), padding="max_length", truncation=True, max_length=max_length,
                      return_tensors="pt")
    return torch.stack([batch["input_ids"], batch["attention_mask"]], dim=1).to(torch.int64)
