"""``llm-tofu-forget01``: the FIRM paper's TOFU federation (sec. 5.1, 5.3) — forget01 over several forget clients.

Data: TOFU's ``forget01`` and ``retain90`` splits (``tasks.llm.data``; perturbed answers joined in
from the ``*_perturbed`` splits), its public sets (real authors, world facts, ``holdout01``, as
``llm-tofu`` reads them: ``locuslab/TOFU``'s files, ``forget01.json`` ..., downloaded into
``llm.data-dir``) and, optional, ``cais/mmlu``'s ``mmlu/all/test`` (``question``, ``choices``,
``answer``; ``tasks.llm.benchmark_files``) for utility. Without ``llm.data-dir``:
``llm.num-authors`` synthetic authors (``tasks.llm.synthetic``), forget01 = the last
``max(1, round(0.01 A))`` authors, retain90 = the first ``A - max(1, round(0.1 A))`` (TOFU's rule:
retain90 leaves out forget10, which holds forget01), a synthetic holdout of as many authors as
forget01, and a synthetic ``mmlu`` of ``llm.synthetic-size`` questions.

Dealing over ``n`` clients: forget01's QA pairs, shuffled with the seed, are cut into ``n - 1``
contiguous near-equal shards (the paper: five clients, 40 pairs), all of domain ``forget01``;
client ``n - 1`` trains on ``llm.retain-size`` pairs of retain90 drawn with the seed (the paper:
200; this task's preset). On synthetic data the retain client also trains on the ``mmlu``
questions (the offline tiny model has no general knowledge for utility to measure otherwise).
The original model is the federation's FedAvg over these clients (the paper first fine-tunes on
all of TOFU).

Metrics: those of ``llm-tofu`` (``tasks.llm.federation_metrics``; the paper's Fgt = ``forget_rouge``,
Ret = ``retain_rouge``, RA = ``real_authors_rouge``, RW = ``world_facts_rouge`` on TOFU files), and
``utility`` = log-likelihood multiple-choice accuracy on ``mmlu`` (null without it; TOFU's harmonic
model utility stays in ``model_utility`` / ``retain_utility``).
"""

from __future__ import annotations

import random
from typing import ClassVar

from core.config import Config
from tasks.llm import synthetic
from tasks.llm.benchmark_files import (
    MMLU_FETCH,
    MMLU_TABLE,
    as_training_records,
    has_table,
    multiple_choice,
    read_table,
)
from tasks.llm.benchmark_synthetic import multiple_choice_rows
from tasks.llm.benchmark_task import BenchmarkTask
from tasks.llm.data import load_tofu_split
from tasks.llm.federation_data import (
    LLMClientData,
    authors_in_order,
    join_perturbed,
    shards,
    tofu_public_sets,
)
from tasks.llm.task import LLMTask
from tasks.llm.wmdp import MC_COLUMNS, retain_draw

DOMAIN = "forget01"


def _share(fraction: float, count: int) -> int:
    return max(1, round(fraction * count))


class TOFUForget01Task(BenchmarkTask):
    """``llm-tofu-forget01``: see the module docstring and docs/llm.md."""

    name = "llm-tofu-forget01"
    presets: ClassVar[dict] = {"llm.retain-size": 200}
    smoke: ClassVar[dict] = {**LLMTask.smoke, "llm.synthetic-size": 12}
    task_keys = ("llm.retain-size", "llm.synthetic-size")

    def tables(self, cfg: Config) -> dict[str, list[dict]]:
        folder = cfg["llm.data-dir"]
        if folder:
            tables = {"forget01": load_tofu_split(folder, "forget01"), "retain90": load_tofu_split(folder, "retain90"),
                      **tofu_public_sets(folder, 0.01)}
            join_perturbed(folder, tables["forget01"] + tables["retain90"])  # in place: the perturbed splits read once
            tables["mmlu"] = (multiple_choice(read_table(folder, MMLU_TABLE, MC_COLUMNS, MMLU_FETCH), "mmlu")
                              if has_table(folder, MMLU_TABLE) else [])
            return tables
        records = synthetic.fictitious_authors(cfg["llm.num-authors"], cfg["llm.qa-per-author"], seed=cfg["seed"])
        authors = authors_in_order(records)
        forget = set(authors[len(authors) - _share(0.01, len(authors)):])
        retain = set(authors[:len(authors) - _share(0.1, len(authors))])
        return {"forget01": [r for r in records if r["author"] in forget],
                "retain90": [r for r in records if r["author"] in retain],
                "holdout": synthetic.holdout_authors(len(forget), cfg["llm.qa-per-author"], exclude=authors,
                                                     seed=cfg["seed"]),
                "mmlu": multiple_choice_rows(cfg["llm.synthetic-size"], None, cfg["seed"])}

    def views(self, cfg: Config, tables: dict[str, list[dict]], num_clients: int) -> list[LLMClientData]:
        if num_clients < 2:
            raise ValueError("needs at least 2 clients: a forget client and the retain client")
        forget = tables["forget01"]
        positions = list(range(len(forget)))
        random.Random(f"{cfg['seed']}-{DOMAIN}").shuffle(positions)
        if len(forget) < num_clients - 1:
            raise ValueError(f"forget01 has {len(forget)} QA pairs for {num_clients - 1} forget clients")
        retain = retain_draw(tables["retain90"], cfg["llm.retain-size"], cfg["seed"])
        if not cfg["llm.data-dir"]:
            retain += as_training_records(tables["mmlu"])
        public = {name: rows for name, rows in tables.items() if name not in ("forget01", "retain90", "mmlu")}
        views = []
        for j, shard in enumerate([*shards(positions, num_clients - 1), None]):
            part = None if shard is None else [forget[i] for i in shard]
            mine = {name: rows[j::num_clients] for name, rows in public.items()}
            mine["utility"] = tables["mmlu"][j::num_clients]
            if part is None:
                views.append(LLMClientData(j, [], retain, [], public=mine))
            else:
                authors = authors_in_order(part)
                views.append(LLMClientData(j, authors, [], part, forget_authors=authors, public=mine,
                                           removed_ids=shard, domain=DOMAIN))
        return views

    def client_sums(self, cfg: Config, data, model, tokenizer) -> dict:
        from tasks.llm.federation_metrics import client_llm_metrics

        return {**client_llm_metrics(model, tokenizer, data, cfg=cfg), **self.utility_sums(cfg, data, model, tokenizer)}

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        from tasks.llm.federation_metrics import pool_llm_metrics

        return {**pool_llm_metrics(per_client), "utility": self.pooled_utility(per_client)}


LLM_TOFU_FORGET01 = TOFUForget01Task()
