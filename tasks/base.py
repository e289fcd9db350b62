"""The Task interface: everything the phases and the client handlers need from a task.

A task is a dataset with its model and its metrics: the five vision tasks
(``tasks.vision.task.VisionTask``), the TOFU-style LLM task (``tasks.llm.task.LLMTask``) and the
two text tasks (``tasks.text.task.TextTask``) implement it, and ``tasks.registry`` lists them. No
handler, phase or registry asks which kind of task it runs: they call these methods. ``kind`` exists only so that a method can declare the kinds
it supports (``strategies.registry.MethodSpec.task_kinds``) and settings are shared by kind
(``tasks.registry.KIND_SETTINGS``).

Nothing here imports Flower: models travel as ``{name: tensor}`` state dicts, replies as plain
dicts of numbers and tensors; ``client_app`` and ``server_app`` wrap them into Flower records.

Objectives (the ``objective`` of a ``train`` message) other than the task's own ``ce`` are
functions registered by methods; their signature is the task kind's:

- vision and text: ``objective(model, x, y, *, cfg, conf, seed, device) -> float`` (it trains ``model``);
- llm: ``objective(model, tokenizer, records, *, cfg, conf, seed, epochs, lr) -> float``.

Client queries registered by methods are called as ``query(task, cfg, data, model, conf, seed)`` and
return ``{record name: {key: tensor}}`` for arrays plus ``"metrics": {key: number}``.
"""

from __future__ import annotations

import os
from typing import Any, Callable

from core.config import SCENARIOS, Config, ConfigError

State = dict[str, Any]


class Task:
    """Interface; the defaults are what a task without the feature does."""

    name: str
    kind: str
    #: classes of a classification task (0: class settings do not apply)
    num_classes: int
    scenarios: tuple[str, ...] = SCENARIOS
    #: what ``smoke=true`` sets for this task
    smoke: dict[str, Any] = {}
    #: general settings this task runs with where the user left them at their default (a method's
    #: presets for the task win over these)
    presets: dict[str, Any] = {}
    #: the run-config key that points at this task's files (named in data errors)
    data_key: str = "data-dir"
    #: whether the nodes read ``original-model`` too (then it must exist at that path on every node's
    #: host); by default only the server reads it, and the nodes do not check it
    original_model_on_nodes: bool = False

    # --- setup and server side -------------------------------------------------------------
    def check_config(self, cfg: Config) -> None:
        """Combinations of settings this task cannot run (one-line ``ConfigError``)."""
        if cfg["scenario"] not in self.scenarios:
            raise ConfigError(f"run-config 'scenario'={cfg['scenario']!r} is not meaningful for task "
                              f"'{self.name}': must be {' or '.join(self.scenarios)}")

    def check_setup(self, cfg: Config, num_clients: int) -> None:
        """Checks that need the task's files or model, run by the server before any node works."""

    def data_fingerprint(self, cfg: Config) -> str:
        """sha256 identity of the training data the clients read (part of the model cache key);
        raises ``FileNotFoundError`` for missing files and ``ValueError`` for bad ones."""
        raise NotImplementedError

    def check_partition(self, cfg: Config, num_nodes: int) -> None:
        """Where every node partitions one shared pool: that the split over ``num_nodes`` works."""

    def cache_key(self, cfg: Config) -> dict:
        """Task settings that determine the cached original/retrain models, beyond the shared ones."""
        return {}

    def check_original_model(self, cfg: Config, path: str) -> None:
        """What ``original-model`` must be for this task, checked before any work (one-line ``ConfigError``):
        by default a file (safetensors or a weights-only state dict, read by the server)."""
        if not os.path.isfile(path):
            raise ConfigError(f"run-config 'original-model'={cfg['original-model']!r}: no such file")

    def read_original(self, cfg: Config, path: str) -> tuple[dict | None, str] | None:
        """A task whose ``original-model`` is not a plain state-dict file reads it here: its tensors (None:
        the task's fresh model is the original) and its sha256; None (default): the server reads the file."""
        return None

    def server_model(self, cfg: Config, plugins: list[dict], seed: int | None = None):
        """A fresh model of the run as the server handles it (``state_dict`` / ``named_parameters``);
        ``seed`` seeds its fresh weights (None: the run's ``seed``)."""
        raise NotImplementedError

    def model_outline(self, cfg: Config, plugins: list[dict] | None = None):
        """The run's model for reading its structure (module names, shapes) in a config check, built
        without moving the global seed; its weights are not meant to be used."""
        raise NotImplementedError

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        """The results-contract entry of one model from every client's evaluation reply."""
        raise NotImplementedError

    def finish_entries(self, entries: list[dict], retrain_entry: dict) -> None:
        """Metrics that compare each model with the retrain oracle, added in place (default: none);
        ``retrain_entry`` is ``{}`` where no oracle ran (``retrain-oracle=false``): those figures are then NaN."""

    # --- client side -----------------------------------------------------------------------
    def client_view(self, cfg: Config, node: dict) -> tuple[dict | None, Callable[[], Any]]:
        """``(disk-cache key or None, build)`` of this node's data view; ``build()`` returns an object
        with ``client_id`` and ``counts()`` (n-retain, n-forget, ...) and whatever the task's other
        client methods read."""
        raise NotImplementedError

    def client_model(self, cfg: Config, state: State, plugins: list[dict]):
        """The task's model with ``plugins``, loaded with the received ``state``."""
        raise NotImplementedError

    def train_role(self, cfg: Config, data, model, role: str, conf: dict, seed: int,
                   objective: Callable | None) -> tuple[State, dict]:
        """Local training of ``model`` on the data of ``role``; ``objective`` None is the task's own
        (cross-entropy). Returns what travels back (tensors) and the metrics (num-examples, loss,
        and ``loss-before``, the received model's loss on that data, when ``reports_loss_before``)."""
        raise NotImplementedError

    def evaluate(self, cfg: Config, data, model, conf: dict) -> tuple[dict, State | None]:
        """This client's metrics of ``model`` (sums and counts the server pools) and, if asked,
        tensors for the diagnostics."""
        raise NotImplementedError


def reports_loss_before(conf, role: str) -> bool:
    """Does a ``train`` message ask for the received model's loss on ``role``'s data before training?
    ``conf['report-loss-before']`` names the roles, comma-separated (e.g. ``"forget,retain"``)."""
    return role in str(conf.get("report-loss-before", "")).split(",")
