"""A SuperNode's own TOFU-format files for the LLM task (``llm-tofu``): node config ``data-path``.

The folder ``data-path`` is laid out like TOFU itself (``locuslab/TOFU``; the splits are read by
``tasks.llm.data``, so a split ``NAME`` is ``NAME.json`` — a JSON array or JSON lines —,
``NAME.jsonl``, ``NAME.parquet`` or ``NAME/*.parquet``):

* ``full`` (required): the node's QA pairs, one record each, with ``question`` and ``answer``
  (non-empty strings) and optionally ``author`` (any id; an author's records are forgotten
  together), ``paraphrased_answer`` and ``perturbed_answer`` (a list of strings; a record that has
  them is evaluated, and then it needs the paraphrase too: TOFU scores truth ratios against it) and
  ``key_fact``. Without an ``author`` column the rows are read in TOFU's own layout: consecutive
  blocks of 20 QA pairs, one author each (``tofu-author-<i>``), so TOFU's ``full.json`` or any
  slice of whole authors of it works unchanged; give ``author`` when an author has another number
  of QA pairs.
* ``forget01_perturbed``, ``forget05_perturbed``, ``forget10_perturbed``, ``retain_perturbed``
  (optional): paraphrased and perturbed answers joined into ``full`` by question, as for the shared
  TOFU pool (``tasks.llm.federation_data``).
* ``real_authors_perturbed``, ``world_facts_perturbed``, ``holdout01`` / ``holdout05`` /
  ``holdout10`` (optional): the public evaluation sets, chosen as for the shared pool (the holdout
  matching ``llm.forget-fraction``, else the largest present); a node scores all of its own.
  Without them the node falls back to no such set: ``model_utility`` is ``null`` unless some
  node scores both real authors and world facts, ``mia_min_k`` / ``privleak`` are ``null``
  unless some node holds a holdout.

The node's records replace its share of the shared pool, and the request is applied on the node
(``forget-client`` names the leaving node by its ``partition-id``; ``-1``, the largest client,
needs the shared pool and is refused):

* ``scenario=sample``: the leaving node forgets the last ``max(1, round(llm.forget-fraction * A))``
  of its ``A`` authors in file order — TOFU's ``forgetNN`` rule (``forget10`` is the last 10 % of
  ``full``), so put the authors to forget last; the other nodes forget nothing;
* ``scenario=client``: the leaving node forgets all its records.

Evaluation follows TOFU's protocol on these files (``tasks.llm.federation_metrics``: the
paraphrased answer as truth-ratio reference, 200 new tokens unless ``llm.max-new-tokens`` is set).
No view is cached on disk: every ClientApp process reads the files again (JSON of a few thousand
QA pairs reads in well under a second); the node reports a content id of its records in hello
(``client_app.app``), which the server's model cache key holds, so other files are another model.

Every problem is a one-line ``ValueError`` naming ``data-path`` and what is allowed, raised by the
node's first message (hello), before any training; the node answers the server with it, and the
server names the node and the phase.
"""

from __future__ import annotations

import os
from pathlib import Path

from tasks.llm.data import QA_COLUMNS, _read_table, _require_columns, _split_files, qa_records
from tasks.llm.federation_data import LLMClientData, authors_in_order, join_perturbed, tofu_public_sets
from tasks.node_data import require_named_forget_client

LAYOUT = ("full.json, full.jsonl, full.parquet or full/*.parquet with the node's TOFU-format QA pairs "
          "(question, answer; optional author, paraphrased_answer, perturbed_answer)")


def _fail(data_path: str, problem: str) -> ValueError:
    """The one-line error; files inside the folder are named relative to it."""
    problem = " ".join(problem.replace(os.path.join(data_path, ""), "").split())
    return ValueError(f"node config 'data-path'={data_path!r}: {problem}")


def _check_rows(data_path: str, rows: list[dict]) -> None:
    """Values the loader cannot coerce safely: text fields, perturbed answers as a list of text."""
    if not rows:
        raise _fail(data_path, f"full holds no QA pairs: expected {LAYOUT}")  # a table of rows, none empty
    for index, row in enumerate(rows):
        for column in ("question", "answer"):
            value = row.get(column)
            if not isinstance(value, str) or not value.strip():
                raise _fail(data_path, f"full row {index}: {column!r} must be a non-empty string, got {value!r:.60}")
        if "author" in row and row["author"] is not None and not str(row["author"]).strip():
            raise _fail(data_path, f"full row {index}: 'author' is empty (give an id, or leave the column out "
                                   "for TOFU's 20 QA pairs per author)")
        perturbed = row.get("perturbed_answer")
        if perturbed is not None and not (isinstance(perturbed, list) and all(isinstance(p, str) for p in perturbed)):
            raise _fail(data_path, f"full row {index}: 'perturbed_answer' must be a list of strings, "
                                   f"got {perturbed!r:.60}")
        if perturbed and not (isinstance(row.get("paraphrased_answer"), str) and row["paraphrased_answer"].strip()):
            raise _fail(data_path, f"full row {index}: has 'perturbed_answer' but no 'paraphrased_answer' "
                                   "(TOFU scores truth ratios against the paraphrase)")


def load_node_records(data_path: str) -> list[dict]:
    """The node's training records (``full`` with perturbed answers joined in), checked."""
    if not os.path.isdir(data_path):
        raise _fail(data_path, f"is not a folder: expected a folder holding {LAYOUT}")
    files = _split_files(Path(data_path), "full")
    if not files:
        raise _fail(data_path, f"no full split found: expected {LAYOUT}")
    try:
        table = _read_table(files)
        _require_columns(table, QA_COLUMNS, str(files[0]))
        _check_rows(data_path, table.to_list())
        records = qa_records(table, str(files[0]), perturbed=False, first_author=0)
        return join_perturbed(data_path, records)
    except ValueError as err:
        if str(err).startswith("node config"):
            raise
        raise _fail(data_path, str(err)) from None


def load_node_public_sets(cfg, data_path: str) -> dict[str, list[dict]]:
    """The node's own public evaluation sets (module docstring), whole."""
    try:
        return tofu_public_sets(data_path, cfg["llm.forget-fraction"])
    except ValueError as err:
        raise _fail(data_path, str(err)) from None


def build_node_client_data(cfg, data_path: str, partition_id: int) -> LLMClientData:
    """This node's retain / forget records and public sets from its own files (module docstring)."""
    require_named_forget_client(cfg)  # the LLM task has no class scenario: always a named leaving node
    records = load_node_records(data_path)
    public = load_node_public_sets(cfg, data_path)
    authors = authors_in_order(records)
    if partition_id != cfg["forget-client"]:
        forgotten: list[str] = []
    elif cfg["scenario"] == "client":
        forgotten = list(authors)
    else:
        k = max(1, round(cfg["llm.forget-fraction"] * len(authors)))
        forgotten = authors[len(authors) - k:]
    gone = set(forgotten)
    return LLMClientData(client_id=partition_id, authors=authors,
                         retain=[r for r in records if r["author"] not in gone],
                         forget=[r for r in records if r["author"] in gone],
                         forget_authors=sorted(gone), public=public, protocol="tofu",
                         removed_ids=[i for i, r in enumerate(records) if r["author"] in gone])
