"""The vision tasks: an image pool, a split model (extractor -> plug-ins -> head), SGD, accuracies.

One :class:`VisionTask` per dataset + architecture (``tasks.registry`` lists them). Clients take
a Dirichlet partition of the shared pool (node config ``partition-id`` / ``num-partitions``) or
read their own files (``data-path``, ``tasks.node_data``) and apply the request to it
(``tasks.requests``). Models carry the plug-ins methods insert between extractor and head
(``tasks.model``, ``tasks.plugins``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

from core.config import Config, ConfigError
from tasks.base import State, Task, reports_loss_before
from tasks.model import PLUGIN_PREFIX, SplitModel
from tasks.plugins import attach_plugins


def data_dir(configured: str) -> str:
    """The run config's ``data-dir``, or the user cache when it is empty."""
    return configured or os.path.join(os.path.expanduser("~"), ".cache", "fedunlearn", "data")


def _uploaded_state(model: torch.nn.Module, scope: str) -> dict[str, torch.Tensor]:
    """Only what was trained goes back up: plug-ins for ``plugins``, the base for ``base``."""
    state = model.state_dict()
    if scope == "plugins":
        return {k: v for k, v in state.items() if k.startswith(PLUGIN_PREFIX)}
    if scope == "base":
        return {k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)}
    return state


@dataclass(frozen=True)
class VisionTask(Task):
    """A dataset name understood by ``tasks.vision.load_images`` and a model architecture."""

    name: str
    dataset: str
    arch: str
    num_classes: int
    in_channels: int
    presets: dict = field(default_factory=dict)
    kind = "vision"

    # --- data and model -------------------------------------------------------------------
    def load_images(self, configured_data_dir: str = "", download: bool = False):
        """The training pool as ``tasks.vision.ImageData`` (``data-dir``, ``download``)."""
        from tasks.vision import load_images

        return load_images(self.dataset, data_dir(configured_data_dir), download)

    def build_model(self, plugins: list[dict] | None = None, seed: int = 0) -> SplitModel:
        """A freshly initialised model (init seeded), with the given plug-ins attached."""
        from tasks.vision import build_vision_model

        torch.manual_seed(seed)
        model = build_vision_model(self.arch, self.num_classes, self.in_channels, dataset=self.dataset)
        attach_plugins(model, plugins or [], seed=seed)
        return model

    # --- setup and server side ------------------------------------------------------------
    def check_config(self, cfg: Config) -> None:
        super().check_config(cfg)
        from tasks.vision.datasets import IMAGE_SIZE

        for key in ("forget-class", "backdoor-target"):
            if cfg[key] >= self.num_classes:
                raise ConfigError(f"run-config '{key}'={cfg[key]} is outside task '{self.name}': "
                                  f"must be in 0..{self.num_classes - 1}")
        if cfg["trigger-size"] > IMAGE_SIZE:
            raise ConfigError(f"run-config 'trigger-size'={cfg['trigger-size']} is larger than the "
                              f"{IMAGE_SIZE}x{IMAGE_SIZE} images of task '{self.name}': must be in 1..{IMAGE_SIZE}")

    def data_fingerprint(self, cfg: Config) -> str:
        return self.load_images(cfg["data-dir"], cfg["download"]).fingerprint

    def check_partition(self, cfg: Config, num_nodes: int) -> None:
        from tasks.partition import PartitionError, dirichlet_partitions

        try:
            labels = self.load_images(cfg["data-dir"], cfg["download"]).y.numpy()
            dirichlet_partitions(labels, num_nodes, cfg["dirichlet-alpha"], cfg["seed"])
        except PartitionError as err:
            raise ConfigError(f"run-config {err}") from None

    def model_outline(self, cfg: Config, plugins: list[dict] | None = None) -> SplitModel:
        """On the meta device: shapes without weights (a ResNet-34 with weights takes seconds on a small CPU)."""
        with torch.random.fork_rng(), torch.device("meta"):
            return self.build_model(plugins or [], seed=0)

    def server_model(self, cfg: Config, plugins: list[dict], seed: int | None = None) -> SplitModel:
        return self.build_model(plugins, seed=cfg["seed"] if seed is None else seed)

    def pool_metrics(self, cfg: Config, per_client: list[dict]) -> dict:
        from tasks.metrics import pool_metrics
        from tasks.requests import uses_trigger

        return pool_metrics(per_client, seed=cfg["seed"], with_trigger=uses_trigger(cfg),
                            with_forget_test=cfg["scenario"] == "class")

    # --- client side ----------------------------------------------------------------------
    def client_view(self, cfg: Config, node: dict):
        from tasks.vision.views import file_fingerprint, pool_fingerprint, view_key

        if "data-path" in node:
            from tasks.node_data import build_own_client_data, split_files

            path, pid = node["data-path"], node["partition-id"]
            key = view_key(cfg, {"data-path": path, "partition-id": pid}, file_fingerprint(split_files(path)))
            return key, lambda: build_own_client_data(cfg, path, pid)
        from tasks.requests import build_client_data

        pid, n = node["partition-id"], node["num-partitions"]
        key = view_key(cfg, {"partition-id": pid, "num-partitions": n},
                       pool_fingerprint(self.dataset, data_dir(cfg["data-dir"])))
        return key, lambda: build_client_data(cfg, self.load_images(cfg["data-dir"], cfg["download"]), pid, n)

    def client_model(self, cfg: Config, state: State, plugins: list[dict]) -> SplitModel:
        model = self.build_model(plugins, seed=cfg["seed"])
        model.load_state_dict(state)
        return model

    def train_role(self, cfg: Config, data, model, role: str, conf: dict, seed: int, objective):
        from tasks.training import device_for, train_local

        device = device_for()
        scope = str(conf.get("scope", "all"))
        x, y = data.split(role, all_data=bool(conf.get("forget-all-data", False)))
        metrics = {"num-examples": len(y)}
        if reports_loss_before(conf, role):
            bypass = set(str(conf.get("loss-before-bypass", "")).split(",")) - {""}
            metrics["loss-before"] = model.loss_bypassing(x, y, bypass)
        if objective is not None:
            loss = objective(model, x, y, cfg=cfg, conf=conf, seed=seed, device=device)
        else:
            epochs = int(conf.get("epochs", cfg["local-epochs"]))
            epochs = data.local_epochs(role, cfg, epochs)  # the leaving client's poisoning (tasks.requests)
            loss = train_local(model, x, y, epochs=epochs, batch_size=cfg["batch-size"],
                               lr=float(conf.get("lr", cfg["lr"])), momentum=cfg["momentum"], seed=seed,
                               scope=scope, max_steps=int(conf.get("max-steps", 0)) or None, device=device,
                               max_grad_norm=cfg["max-grad-norm"] or None)
        metrics["loss"] = float(loss)
        return {k: v.detach().cpu() for k, v in _uploaded_state(model, scope).items()}, metrics

    def evaluate(self, cfg: Config, data, model, conf: dict):
        from tasks.metrics import client_metrics, feature_sample
        from tasks.training import device_for

        seed = cfg["seed"] + data.client_id
        metrics = client_metrics(model, data, target=cfg["backdoor-target"],
                                 mia_max_samples=cfg["mia-max-samples"], seed=seed, device=device_for())
        features = None
        if conf.get("features", False) and cfg["diagnostic-samples"]:
            features = feature_sample(model, data, cfg["diagnostic-samples"], seed)
        return metrics, features
