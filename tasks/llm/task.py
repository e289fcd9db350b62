"""The TOFU-style LLM task: fictitious authors' QA pairs, a causal LM with a LoRA adapter, TOFU metrics.

Every node builds the same base model from the run config and the seed, so only the LoRA adapter
travels (``tasks.llm.federation_model``). Authors are dealt to clients from the seed
(``tasks.llm.federation_data``); ``scenario=sample`` forgets ``llm.forget-fraction`` of them,
``scenario=client`` every author of the forget client. There are no classes and no plug-in point.
A SuperNode may read its own TOFU-format files instead of a share of the pool (node config
``data-path``: layout, request and errors in ``tasks.llm.node_data``). Heavy imports (transformers, peft) happen inside the methods, when a run of this task uses them.
"""

from __future__ import annotations

import hashlib
import json
from typing import ClassVar

from core.config import Config, ConfigError
from tasks.base import State, Task, reports_loss_before

MODEL_KEYS = ("llm.model", "llm.data-dir", "llm.num-authors", "llm.qa-per-author", "llm.forget-fraction",
              "llm.lora-rank", "llm.lora-alpha", "llm.target-modules", "llm.load-in-4bit",
              "llm.local-epochs", "llm.lr", "llm.batch-size")
# Why a refused key is refused (``LLMTask.refused_keys``): settings an LLM task does not follow ...
NOT_FOLLOWED = "applies to vision and text tasks; task '{task}' takes {default!r}"
# ... and settings that only some LLM tasks read (``LLMTask.task_keys``), refused by the others.
NOT_READ = "is not read by task '{task}': leave it unset"


class LLMTask(Task):
    """``llm-tofu``: see the module docstring and docs/llm.md."""

    name = "llm-tofu"
    kind = "llm"
    num_classes = 0
    scenarios = ("sample", "client")
    data_key = "llm.data-dir"
    original_model_on_nodes = True  # a merged model folder is the base each node trains its adapter on
    #: run-config keys refused when set away from their default -> why (``{task}``: the task's name,
    #: ``{default}``: the key's default); a subclass extends it. Not followed: the adapter training (AdamW
    #: on llm.lr, no clip) and the start (a pretrained model with a fixed adapter initialisation, not a
    #: seeded fresh model).
    refused_keys: ClassVar[dict[str, str]] = {
        "poison": "is not meaningful for task '{task}' (its client scenario poisons nothing): leave 'poison' unset",
        "lr-schedule": NOT_FOLLOWED, "max-grad-norm": NOT_FOLLOWED, "init-seed": NOT_FOLLOWED,
        "llm.forget-domains": NOT_READ, "llm.retain-size": NOT_READ, "llm.synthetic-size": NOT_READ,
    }
    #: which of the ``NOT_READ`` keys of ``refused_keys`` this task reads (they also key its cached models)
    task_keys: tuple[str, ...] = ()
    smoke = {"llm.num-authors": 8, "llm.qa-per-author": 4, "llm.local-epochs": 1, "llm.unlearn-epochs": 1,
             "llm.max-new-tokens": 4}

    # --- setup and server side ------------------------------------------------------------
    def check_config(self, cfg: Config) -> None:
        super().check_config(cfg)
        for key, reason in self.refused_keys.items():
            default = cfg.defaults[key]
            if key not in self.task_keys and cfg[key] != default:
                raise ConfigError(f"run-config '{key}'={cfg[key]!r} " + reason.format(task=self.name, default=default))

    def check_setup(self, cfg: Config, num_clients: int) -> None:
        from tasks.llm.federation_setup import check_llm_setup

        check_llm_setup(cfg, num_clients)

    def data_fingerprint(self, cfg: Config) -> str:
        from tasks.llm.federation_data import load_author_records

        text = json.dumps(load_author_records(cfg), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def cache_key(self, cfg: Config) -> dict:
        from core.files import folder_sha256
        from tasks.llm.given_model import given_base

        base = given_base(cfg)  # a merged original-model is the base every cached model is built on
        return {k: cfg[k] for k in (*MODEL_KEYS, *self.task_keys)} | ({"base-sha256": folder_sha256(base)} if base else {})

    def check_original_model(self, cfg: Config, path: str) -> None:
        from tasks.llm.given_model import folder_kind

        try:
            kind = folder_kind(path)
        except ValueError as err:
            raise ConfigError(f"run-config 'original-model'={cfg['original-model']!r} {err}") from None
        if kind == "merged" and cfg["retrain-oracle"]:
            raise ConfigError(f"run-config 'original-model'={cfg['original-model']!r} is a merged model: its weights "
                              "hold the knowledge to forget, so no retrain oracle can start from them; set "
                              "retrain-oracle=false, or give the PEFT adapter folder")

    def read_original(self, cfg: Config, path: str) -> tuple[dict | None, str]:
        from tasks.llm.given_model import read_given

        return read_given(cfg, path)

    def server_model(self, cfg: Config, plugins: list[dict], seed: int | None = None):  # init-seed refused above
        from tasks.llm.federation_model import server_adapter_model

        if plugins:
            raise ValueError(f"task '{self.name}' takes no plug-ins, got {plugins}")
        return server_adapter_model(cfg)

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        from tasks.llm.federation_metrics import pool_llm_metrics

        return pool_llm_metrics(per_client)

    def finish_entries(self, entries: list[dict], retrain_entry: dict) -> None:
        from tasks.llm.forget_quality import attach_forget_quality

        attach_forget_quality(entries, retrain_entry)

    # --- client side ----------------------------------------------------------------------
    def client_view(self, cfg: Config, node: dict):
        if "data-path" in node:  # the node's own TOFU-format files; no disk view cache (module docstring there)
            from tasks.llm.node_data import build_node_client_data

            path, pid = node["data-path"], node["partition-id"]
            return None, lambda: build_node_client_data(cfg, path, pid)
        from tasks.llm.federation_data import build_llm_client_data, load_author_records

        return None, lambda: build_llm_client_data(cfg, load_author_records(cfg), node["partition-id"],
                                                   node["num-partitions"])

    def llm(self, cfg: Config):
        """(peft model, tokenizer) of the run, built once per process on this node's device."""
        from tasks.llm.federation_model import task_llm
        from tasks.training import device_for

        model, tokenizer, _ = task_llm(cfg, device_for())
        return model, tokenizer

    def client_model(self, cfg: Config, state: State, plugins: list[dict]):
        from tasks.llm.model import load_adapter_state

        model, _ = self.llm(cfg)
        load_adapter_state(model, state)
        return model

    def train_role(self, cfg: Config, data, model, role: str, conf: dict, seed: int, objective):
        from tasks.llm.federation_model import local_update
        from tasks.llm.model import adapter_state
        from tasks.llm.train import mean_answer_loss, qa_batches

        _, tokenizer = self.llm(cfg)
        records = data.split(role)
        metrics = {"num-examples": len(records)}
        if reports_loss_before(conf, role):
            metrics["loss-before"] = mean_answer_loss(model, qa_batches(records, tokenizer, cfg["llm.batch-size"], seed))
        epochs = int(conf.get("llm-epochs", cfg["llm.local-epochs"]))
        lr = float(conf.get("llm.lr", cfg["llm.lr"]))
        if objective is None:
            loss = local_update(model, tokenizer, records, cfg=cfg, epochs=epochs, lr=lr, seed=seed)
        else:
            loss = objective(model, tokenizer, records, cfg=cfg, conf=conf, seed=seed, epochs=epochs, lr=lr)
        metrics["loss"] = float(loss)
        return adapter_state(model), metrics

    def evaluate(self, cfg: Config, data, model, conf: dict):
        from tasks.llm.federation_metrics import client_llm_metrics

        _, tokenizer = self.llm(cfg)
        return client_llm_metrics(model, tokenizer, data, cfg=cfg), None


LLM_TOFU = LLMTask()
