"""Per-process client state: the parsed config, this client's data view, and model loading.

Ray keeps a simulated client's process alive across rounds, so the data view is built once per
(run config, partition) and reused.
"""

from __future__ import annotations

from functools import lru_cache

import torch
from flwr.app import ArrayRecord, Context

from tasks.config import Config, parse_config
from tasks.plugins import specs_from_json
from tasks.registry import build_model, load_task_images
from tasks.requests import ClientData, build_client_data
from tasks.training import device_for


def _node_partition(context: Context) -> tuple[int, int]:
    node = context.node_config
    if "partition-id" not in node or "num-partitions" not in node:
        raise ValueError("node config needs 'partition-id' and 'num-partitions' "
                         "(e.g. --node-config \"partition-id=0 num-partitions=3\")")
    pid, n = int(node["partition-id"]), int(node["num-partitions"])
    if not 0 <= pid < n:
        raise ValueError(f"node config 'partition-id'={pid} must be in 0..{n - 1}")
    return pid, n


@lru_cache(maxsize=4)
def _view(frozen_config: tuple, partition_id: int, num_partitions: int) -> tuple[Config, ClientData]:
    cfg = parse_config(dict(frozen_config), num_clients=num_partitions)
    images = load_task_images(cfg["task"], cfg["data-dir"], cfg["download"])
    return cfg, build_client_data(cfg, images, partition_id, num_partitions)


def client_view(context: Context) -> tuple[Config, ClientData, torch.device]:
    """(config, this client's data, compute device) for the current run."""
    pid, n = _node_partition(context)
    cfg, data = _view(tuple(sorted(context.run_config.items())), pid, n)
    return cfg, data, device_for()


def round_seed(cfg: Config, conf, client_id: int) -> int:
    """The seed of one client's local work in one round (message config ``conf``): distinct per run
    seed, round and client, and the same for every role a client trains in that round."""
    return cfg["seed"] * 1_000_003 + int(conf.get("server-round", 0)) * 1009 + client_id


def load_model(cfg: Config, arrays: ArrayRecord, plugins_json: str) -> torch.nn.Module:
    """The task's model with the given plug-ins, loaded with the received weights."""
    model = build_model(cfg["task"], specs_from_json(plugins_json), seed=cfg["seed"])
    model.load_state_dict(arrays.to_torch_state_dict())
    return model
