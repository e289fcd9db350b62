"""``llm-muse``: the FIRM paper's MUSE-Books federation (sec. 5.1, 5.4) — book passages on forget clients.

Data (``tasks.llm.benchmark_files``): ``muse-bench/MUSE-Books`` downloaded into ``llm.data-dir``,
its tables ``<config>/<split>``: ``raw/forget``, ``raw/retain1``, ``raw/holdout`` (column ``text``:
whole books), ``knowmem/forget_qa`` and ``knowmem/retain_qa`` (``question``, ``answer``),
``verbmem/forget`` (``prompt``, ``gt``); and ``cais/mmlu``'s ``mmlu/all/test`` for utility
(``question``, ``choices``, ``answer``). Without ``llm.data-dir``, synthetic tables in the same
columns (``tasks.llm.benchmark_synthetic``).

Passages: each ``raw`` text is cut at word boundaries into passages of at most 4096 characters (the
paper: passages of about 4,096 characters from the raw splits; a shorter text is one passage).
Dealing over ``n`` clients: the forget passages, shuffled with the seed, are cut into ``n - 1``
contiguous near-equal shards, one per forget client (the paper: three), all of domain ``books``;
client ``n - 1``, the retain client, holds the passages of ``raw/retain1``. A passage trains as one
QA pair: its first sentence (at most 32 words) as the prompt, the rest as the answer (cut at 64
tokens, the task's sequence length). On synthetic data the retain client also trains on the
``mmlu`` questions: the offline tiny model has no general knowledge for utility to measure otherwise.

Metrics (MUSE's, ROUGE-L as recall like the TOFU metrics, greedy generation):

* ``knowmem_forget_rouge`` — KnowMem on ``knowmem/forget_qa`` (the paper's HP, lower = forgotten;
  also ``forget_acc``); ``knowmem_retain_rouge`` on ``knowmem/retain_qa`` (also ``retain_acc``);
* ``verbmem_rouge`` — VerbMem: the model continues each ``verbmem/forget`` prompt, scored against ``gt``;
* ``mia_min_k`` — min-k% AUC of forget passages (each forget client scores its own shard) against
  the passages of ``raw/holdout``, and ``privleak`` — MUSE's PrivLeak, that AUC relative to the retrain
  model's (``tasks.llm.metrics.privleak``: 0 for retrain, negative when the forget passages still
  look like training data);
* ``utility`` — log-likelihood multiple-choice accuracy on ``mmlu``.

The evaluation sets are scored as public sets: record ``i`` by client ``i mod n``. Generation length:
``llm.max-new-tokens``, else 24 tokens on synthetic data, 32 (KnowMem) and 128 (VerbMem) on files
(MUSE's settings).
"""

from __future__ import annotations

import math
import random
from typing import ClassVar

from core.config import Config
from tasks.llm.benchmark_files import (
    MMLU_FETCH,
    MMLU_TABLE,
    as_training_records,
    multiple_choice,
    read_table,
)
from tasks.llm.benchmark_synthetic import first_sentence_split, muse_tables
from tasks.llm.benchmark_task import NOT_SCORED, BenchmarkTask, total
from tasks.llm.federation_data import LLMClientData, shards
from tasks.llm.task import LLMTask
from tasks.llm.wmdp import MC_COLUMNS

COLUMNS = {"raw/forget": ("text",), "raw/retain1": ("text",), "raw/holdout": ("text",),
           "knowmem/forget_qa": ("question", "answer"), "knowmem/retain_qa": ("question", "answer"),
           "verbmem/forget": ("prompt", "gt"), "mmlu": MC_COLUMNS}
FILES = {**{name: name for name in COLUMNS if name != "mmlu"}, "mmlu": MMLU_TABLE}
MUSE_FETCH = "hf download muse-bench/MUSE-Books --repo-type dataset --local-dir {dir}"
PASSAGE_CHARS = 4096
DOMAIN = "books"
SYNTHETIC_NEW_TOKENS = 24
FILE_NEW_TOKENS = {"knowmem": 32, "verbmem": 128}
PUBLIC = {"knowmem-forget": "knowmem/forget_qa", "knowmem-retain": "knowmem/retain_qa", "verbmem": "verbmem/forget",
          "holdout": "raw/holdout", "utility": "mmlu"}


def passages(text: str, size: int = PASSAGE_CHARS) -> list[str]:
    """``text`` cut at word boundaries into pieces of at most ``size`` characters (a longer word stays whole)."""
    pieces: list[list[str]] = []
    length = 0
    for word in text.split():
        if not pieces or length + 1 + len(word) > size:
            pieces.append([])
            length = -1
        pieces[-1].append(word)
        length += 1 + len(word)
    return [" ".join(words) for words in pieces]


def passage_records(rows: list[dict]) -> list[dict]:
    """Raw texts (``{text}``) as QA records, one per passage: first sentence -> the rest (module docstring)."""
    return [dict(zip(("question", "answer"), first_sentence_split(piece)))
            for row in rows for piece in passages(row["text"])]


def _new_tokens(cfg: Config, kind: str) -> int:
    if cfg["llm.max-new-tokens"]:
        return cfg["llm.max-new-tokens"]
    return FILE_NEW_TOKENS[kind] if cfg["llm.data-dir"] else SYNTHETIC_NEW_TOKENS


def _rouge_sum(model, tokenizer, prompts: list[str], references: list[str], new_tokens: int, size: int) -> float:
    from tasks.llm.metrics import generate_answers, rouge_l_recall

    if not prompts:
        return 0.0
    predictions = generate_answers(model, tokenizer, prompts, max_new_tokens=new_tokens, batch_size=size)
    return float(sum(rouge_l_recall(predictions, references)))


class MUSETask(BenchmarkTask):
    """``llm-muse``: see the module docstring and docs/llm.md."""

    name = "llm-muse"
    smoke: ClassVar[dict] = {**LLMTask.smoke, "llm.synthetic-size": 12}
    task_keys = ("llm.synthetic-size",)

    def tables(self, cfg: Config) -> dict[str, list[dict]]:
        folder = cfg["llm.data-dir"]
        if not folder:
            rows = muse_tables(cfg["llm.num-authors"], cfg["llm.qa-per-author"], cfg["llm.synthetic-size"], cfg["seed"])
        else:
            rows = {name: read_table(folder, FILES[name], columns, MMLU_FETCH if name == "mmlu" else MUSE_FETCH)
                    for name, columns in COLUMNS.items()}
        rows["mmlu"] = multiple_choice(rows["mmlu"], "mmlu")
        return rows

    def views(self, cfg: Config, tables: dict[str, list[dict]], num_clients: int) -> list[LLMClientData]:
        if num_clients < 2:
            raise ValueError("needs at least 2 clients: a forget client and the retain client")
        passages = passage_records(tables["raw/forget"])
        positions = list(range(len(passages)))
        random.Random(f"{cfg['seed']}-{DOMAIN}").shuffle(positions)
        if len(passages) < num_clients - 1:
            raise ValueError(f"raw/forget has {len(passages)} passages for {num_clients - 1} forget clients")
        retain = passage_records(tables["raw/retain1"])
        if not cfg["llm.data-dir"]:
            retain += as_training_records(tables["mmlu"])
        public = {key: [dict(r) for r in tables[name]] for key, name in PUBLIC.items()}
        public["holdout"] = passage_records(public["holdout"])
        views = []
        for j, part in enumerate([*shards(positions, num_clients - 1), None]):
            mine = {key: rows[j::num_clients] for key, rows in public.items()}
            if part is None:
                views.append(LLMClientData(j, [], retain, [], public=mine))
            else:
                views.append(LLMClientData(j, [], [], [passages[i] for i in part], public=mine, removed_ids=part,
                                           domain=DOMAIN))
        return views

    def client_sums(self, cfg: Config, data, model, tokenizer) -> dict:
        from tasks.llm.federation_metrics import min_k_scores

        size, public = cfg["llm.eval-batch-size"], data.public
        out = {}
        for name in ("knowmem-forget", "knowmem-retain"):
            rows = public[name]
            out[f"{name}-n"] = len(rows)
            out[f"{name}-rouge"] = _rouge_sum(model, tokenizer, [r["question"] for r in rows],
                                             [r["answer"] for r in rows], _new_tokens(cfg, "knowmem"), size)
        out["verbmem-n"] = len(public["verbmem"])
        out["verbmem-rouge"] = _rouge_sum(model, tokenizer, [r["prompt"] for r in public["verbmem"]],
                                          [r["gt"] for r in public["verbmem"]], _new_tokens(cfg, "verbmem"), size)
        out.update(self.utility_sums(cfg, data, model, tokenizer))
        out["forget-mink"] = min_k_scores(model, tokenizer, data.forget, size)
        out["holdout-mink"] = min_k_scores(model, tokenizer, public["holdout"], size)
        return out

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        from tasks.llm.metrics import mia_auc, ratio

        entry = {f"{name.replace('-', '_')}_rouge": ratio(total(per_client, f"{name}-rouge"),
                                                          total(per_client, f"{name}-n"))
                 for name in ("knowmem-forget", "knowmem-retain", "verbmem")}
        entry["mia_min_k"] = mia_auc([float(v) for c in per_client for v in c.get("forget-mink", [])],
                                     [float(v) for c in per_client for v in c.get("holdout-mink", [])])
        entry.update({"utility": self.pooled_utility(per_client),
                      "forget_acc": entry["knowmem_forget_rouge"], "retain_acc": entry["knowmem_retain_rouge"],
                      **NOT_SCORED})
        return entry

    def finish_entries(self, entries: list[dict], retrain_entry: dict) -> None:
        """``privleak`` of every entry against the retrain model's min-k% AUC (module docstring)."""
        from tasks.llm.metrics import privleak

        reference = retrain_entry.get("mia_min_k", math.nan)
        for entry in [*entries, retrain_entry]:
            auc = entry.get("mia_min_k", math.nan)
            entry["privleak"] = math.nan if math.isnan(auc) or math.isnan(reference) else privleak(auc, reference)


LLM_MUSE = MUSETask()
