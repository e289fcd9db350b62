"""What the LLM benchmark tasks (``llm-wmdp``, ``llm-muse``, ``llm-tofu-forget01``) share.

Each sets up one of the FIRM paper's federations (sec. 5.1): the first ``n - 1`` clients are forget
clients, each holding a disjoint shard of the forget data and nothing else, and the last client is
the one retain client. A forget client declares its forget domain in hello (``LLMClientData.domain``),
so a method can pool the clients of one domain. The model, its LoRA adapter and local training are
the TOFU task's (``tasks.llm.task.LLMTask``); a subclass says where the data comes from
(``tables``), how it is dealt (``views``), what a client scores (``client_sums``) and how the
server pools it (``pool_metrics``).

The request is fixed by the task: the forget clients' data is forgotten (``scenario=sample``, the
only one offered; ``forget-client`` and ``llm.forget-fraction`` do not apply and are refused).
Nodes reading their own files (node config ``data-path``) are not offered on these tasks.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import ClassVar

from core.config import Config, ConfigError
from tasks.llm.task import LLMTask

FIXED_REQUEST = ("does not apply to task '{task}': its forget clients are the first n - 1 clients and forget all "
                 "their data; leave it unset")
#: results keys a benchmark task does not score (null in its entries)
NOT_SCORED = {"test_acc": math.nan, "mia": math.nan, "mia_efficacy": math.nan}


def total(per_client: list[dict], key: str) -> float:
    """The sum of ``key`` over every client's sums (a client without it adds 0)."""
    return sum(float(c.get(key, 0)) for c in per_client)


class BenchmarkTask(LLMTask):
    """Base of the benchmark tasks (module docstring); subclasses fill the four hooks below."""

    scenarios = ("sample",)
    refused_keys: ClassVar[dict[str, str]] = {**LLMTask.refused_keys, "forget-client": FIXED_REQUEST,
                                              "llm.forget-fraction": FIXED_REQUEST}

    # --- hooks -----------------------------------------------------------------------------
    def tables(self, cfg: Config) -> dict[str, list[dict]]:
        """Every table the federation reads, whole (files or synthetic); ``ValueError`` on bad files."""
        raise NotImplementedError

    def views(self, cfg: Config, tables: dict[str, list[dict]], num_clients: int) -> list:
        """Each client's ``LLMClientData``; ``ValueError`` when the data cannot be dealt to ``num_clients``."""
        raise NotImplementedError

    def client_sums(self, cfg: Config, data, model, tokenizer) -> dict:
        """One client's sums and counts of ``model`` (a Flower MetricRecord's content)."""
        raise NotImplementedError

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        """The results entry from every client's sums."""
        raise NotImplementedError

    # --- what every benchmark task scores ---------------------------------------------------
    def utility_sums(self, cfg: Config, data, model, tokenizer) -> dict:
        """One client's count and hits on its share of the utility questions (``data.public["utility"]``)."""
        from tasks.llm.metrics import multiple_choice_hits

        rows = data.public["utility"]
        return {"utility-mc-n": len(rows),
                "utility-mc-hits": multiple_choice_hits(model, tokenizer, rows, batch_size=cfg["llm.eval-batch-size"])}

    @staticmethod
    def pooled_utility(per_client: list[dict]) -> float:
        """``utility``: the accuracy on all utility questions, from every client's ``utility_sums``."""
        from tasks.llm.metrics import ratio

        return ratio(total(per_client, "utility-mc-hits"), total(per_client, "utility-mc-n"))

    # --- the Task interface ------------------------------------------------------------------
    def check_setup(self, cfg: Config, num_clients: int) -> None:
        from tasks.llm.federation_model import task_llm

        try:
            task_llm(cfg)
        except ValueError as err:
            raise ConfigError(f"run-config: {err}") from None
        try:
            tables = self.tables(cfg)
        except ValueError as err:
            raise ConfigError(f"run-config 'llm.data-dir': {err}") from None
        try:
            self.views(cfg, tables, num_clients)
        except ValueError as err:
            raise ConfigError(f"task '{self.name}' with {num_clients} clients: {err}") from None

    def data_fingerprint(self, cfg: Config) -> str:
        text = json.dumps(self.tables(cfg), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def client_view(self, cfg: Config, node: dict):
        if "data-path" in node:
            raise ValueError(f"node config 'data-path' is not offered on task '{self.name}': its clients deal "
                             "the files of run-config 'llm.data-dir' (or synthetic data) among themselves")
        pid, count = node["partition-id"], node["num-partitions"]
        return None, lambda: self.views(cfg, self.tables(cfg), count)[pid]

    def evaluate(self, cfg: Config, data, model, conf: dict):
        _, tokenizer = self.llm(cfg)
        return self.client_sums(cfg, data, model, tokenizer), None
