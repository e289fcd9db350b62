"""``llm-wmdp``: the FIRM paper's WMDP federation (sec. 5.1) — forget domains on forget clients, one retain client on MMLU.

Data (``tasks.llm.benchmark_files``): the test split of ``cais/wmdp``'s config ``wmdp-<domain>``
for each name in ``llm.forget-domains`` (``bio``, ``cyber``, ``chem``: table ``wmdp-<domain>/test``,
the repo downloaded into ``llm.data-dir``) and the test split of ``cais/mmlu``'s config ``all``
(table ``mmlu/all/test``, that repo downloaded into ``mmlu/``), columns ``question``, ``choices``,
``answer`` (index or letter); without ``llm.data-dir``, synthetic tables in the same columns
(``tasks.llm.benchmark_synthetic``).

Dealing over ``n`` clients (the paper: 3 + 3 forget clients, one retain client): forget client ``j``
(``j < n - 1``) takes domain ``j mod D`` of the ``D`` domains, and a domain's questions, shuffled
with the seed, are cut into contiguous near-equal shards (a question's id: its position in the
domains' tables laid end to end), one per client of that domain; so every
domain needs a client (``n >= D + 1``) and at least as many questions as clients. Client ``n - 1``,
the retain client, trains on ``llm.retain-size`` questions of ``mmlu`` drawn with the seed (the paper:
a random 600). A question trains as the QA pair (question, correct option).

Metrics, lm-evaluation-harness's log-likelihood accuracy (``tasks.llm.metrics.multiple_choice_accuracy``):
``forget_mc_acc_<domain>`` (each forget client scores its own shard; the paper's Bio / Cyber, chance
1/4), ``forget_mc_acc`` over all forget questions (also ``forget_acc``, what the continued-training
curve follows), ``retain_mc_acc`` on the retain client's questions (also ``retain_acc``) and
``utility``, the accuracy on the whole ``mmlu`` table (question ``i`` scored by client ``i mod n``):
the paper's MMLU utility. ``test_acc``, ``mia`` and ``mia_efficacy`` do not apply (null).
"""

from __future__ import annotations

import random
from typing import ClassVar

from core.config import Config, ConfigError
from tasks.llm.benchmark_files import (
    MMLU_FETCH,
    MMLU_TABLE,
    as_scored_questions,
    as_training_records,
    multiple_choice,
    read_table,
)
from tasks.llm.benchmark_synthetic import wmdp_tables
from tasks.llm.benchmark_task import NOT_SCORED, BenchmarkTask, total
from tasks.llm.federation_data import LLMClientData, shards
from tasks.llm.task import LLMTask

MC_COLUMNS = ("question", "choices", "answer")
UTILITY_TABLE = "mmlu"
WMDP_FETCH = "hf download cais/wmdp --repo-type dataset --local-dir {dir}"


def table_file(name: str) -> str:
    """Where table ``name`` (``wmdp-<domain>`` or ``mmlu``) lies under ``llm.data-dir``."""
    return MMLU_TABLE if name == UTILITY_TABLE else f"{name}/test"


def domains_of(cfg: Config) -> list[str]:
    """``llm.forget-domains`` as a list of names."""
    return [name.strip() for name in cfg["llm.forget-domains"].split(",") if name.strip()]


def retain_draw(rows: list[dict], size: int, seed: int) -> list[dict]:
    """``size`` rows drawn with ``seed`` (all of them when there are fewer), in table order."""
    chosen = sorted(random.Random(seed).sample(range(len(rows)), min(size, len(rows))))
    return [rows[i] for i in chosen]


class WMDPTask(BenchmarkTask):
    """``llm-wmdp``: see the module docstring and docs/llm.md."""

    name = "llm-wmdp"
    smoke: ClassVar[dict] = {**LLMTask.smoke, "llm.synthetic-size": 12}
    task_keys = ("llm.forget-domains", "llm.retain-size", "llm.synthetic-size")

    def check_config(self, cfg: Config) -> None:
        super().check_config(cfg)
        domains = domains_of(cfg)
        if not domains or len(set(domains)) != len(domains):
            raise ConfigError(f"run-config 'llm.forget-domains'={cfg['llm.forget-domains']!r}: must name one or more "
                              "distinct domains, comma-separated (e.g. 'bio,cyber')")

    def tables(self, cfg: Config) -> dict[str, list[dict]]:
        domains = domains_of(cfg)
        folder = cfg["llm.data-dir"]
        if not folder:
            rows = wmdp_tables(domains, cfg["llm.synthetic-size"], cfg["seed"])
        else:
            rows = {name: read_table(folder, table_file(name), MC_COLUMNS,
                                     MMLU_FETCH if name == UTILITY_TABLE else WMDP_FETCH)
                    for name in (*(f"wmdp-{d}" for d in domains), UTILITY_TABLE)}
        return {name: multiple_choice(table, name) for name, table in rows.items()}

    def views(self, cfg: Config, tables: dict[str, list[dict]], num_clients: int) -> list[LLMClientData]:
        domains = domains_of(cfg)
        if num_clients < len(domains) + 1:
            raise ValueError(f"needs at least {len(domains) + 1} clients: one forget client per domain "
                             f"({', '.join(domains)}) and the retain client")
        forget_shards: dict[int, list[int]] = {}  # client -> positions in the domains' tables, end to end
        offset = 0
        for index, domain in enumerate(domains):
            clients = [j for j in range(num_clients - 1) if j % len(domains) == index]
            positions = list(range(offset, offset + len(tables[f"wmdp-{domain}"])))
            random.Random(f"{cfg['seed']}-{domain}").shuffle(positions)
            if len(positions) < len(clients):
                raise ValueError(f"domain {domain!r} has {len(positions)} questions for {len(clients)} forget clients")
            forget_shards.update(zip(clients, shards(positions, len(clients))))
            offset += len(positions)
        questions = [q for domain in domains for q in tables[f"wmdp-{domain}"]]
        utility = tables[UTILITY_TABLE]
        retain = retain_draw(utility, cfg["llm.retain-size"], cfg["seed"])
        views = []
        for j in range(num_clients):
            public = {"utility": utility[j::num_clients]}
            if j < num_clients - 1:
                mine = forget_shards[j]
                views.append(LLMClientData(j, [], [], as_training_records([questions[i] for i in mine]), public=public,
                                           removed_ids=mine, domain=domains[j % len(domains)]))
            else:
                views.append(LLMClientData(j, [], as_training_records(retain), [], public=public))
        return views

    def client_sums(self, cfg: Config, data, model, tokenizer) -> dict:
        from tasks.llm.metrics import multiple_choice_hits

        size = cfg["llm.eval-batch-size"]
        out = {**self.utility_sums(cfg, data, model, tokenizer),
               "retain-mc-n": len(data.retain),
               "retain-mc-hits": multiple_choice_hits(model, tokenizer, as_scored_questions(data.retain),
                                                      batch_size=size)}
        if data.forget:
            out[f"forget-mc-n.{data.domain}"] = len(data.forget)
            out[f"forget-mc-hits.{data.domain}"] = multiple_choice_hits(model, tokenizer,
                                                                        as_scored_questions(data.forget),
                                                                        batch_size=size)
        return out

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        from tasks.llm.metrics import ratio

        hits = {d: total(per_client, f"forget-mc-hits.{d}") for d in domains_of(cfg)}
        counts = {d: total(per_client, f"forget-mc-n.{d}") for d in domains_of(cfg)}
        entry = {f"forget_mc_acc_{d}": ratio(hits[d], counts[d]) for d in domains_of(cfg)}
        forget = ratio(sum(hits.values()), sum(counts.values()))
        retain = ratio(total(per_client, "retain-mc-hits"), total(per_client, "retain-mc-n"))
        entry.update({"forget_mc_acc": forget, "retain_mc_acc": retain, "utility": self.pooled_utility(per_client),
                      "forget_acc": forget, "retain_acc": retain, **NOT_SCORED})
        return entry


LLM_WMDP = WMDPTask()
