"""On-disk cache of the original and retrain-oracle models.

The key is a hash of everything that determines the model (task, federation size, partition
settings, request, training settings, rounds), so every method in a comparison starts from the
very same original model, and RR always uses the same retrain reference. Entries are written
atomically with a JSON sidecar naming what they were built from; a corrupt entry is ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import torch
from flwr.app import ArrayRecord

from server_app.atomic import atomic_path, write_text
from tasks.config import Config

log = logging.getLogger("fedunlearn")

CACHE_VERSION = 1
TRAINING_KEYS = ("task", "seed", "dirichlet-alpha", "test-fraction", "local-epochs", "batch-size", "lr",
                 "momentum", "fraction-train")
REQUEST_KEYS = {
    "client": ("scenario", "poison", "poison-epochs", "forget-client", "backdoor-target", "trigger-size"),
    "class": ("scenario", "forget-class"),
    "sample": ("scenario", "forget-client", "sample-fraction", "backdoor-target", "trigger-size"),
}


def model_key(kind: str, cfg: Config, num_clients: int) -> dict:
    """What determines the ``kind`` ('original' or 'retrain') model of this run."""
    rounds = cfg["pretrain-rounds"] if kind == "original" else cfg.rounds_of_retrain
    keys = TRAINING_KEYS + REQUEST_KEYS[cfg["scenario"]]
    if cfg["scenario"] == "client" and cfg["poison"] == "label-flip":
        keys = tuple(k for k in keys if k not in ("backdoor-target", "trigger-size"))
    return {"kind": kind, "version": CACHE_VERSION, "num-clients": num_clients, "rounds": rounds,
            **{k: cfg[k] for k in keys}}


def cache_dir(cfg: Config) -> str:
    return cfg["cache-dir"] or os.path.join(os.path.expanduser("~"), ".cache", "fedunlearn", "models")


def _path(cfg: Config, key: dict) -> str:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(cache_dir(cfg), f"{key['kind']}-{digest}.pt")


def load(cfg: Config, key: dict) -> tuple[ArrayRecord, dict] | None:
    """(model, cost of building it) for ``key``, or None when missing or unreadable."""
    path = _path(cfg, key)
    if not os.path.exists(path):
        return None
    try:
        arrays = ArrayRecord(torch.load(path, map_location="cpu", weights_only=True))
        with open(path[:-3] + ".json", encoding="utf-8") as handle:
            cost = json.load(handle)["cost"]
        return arrays, cost
    except Exception as err:  # a corrupt entry must not stop the run: recompute it
        log.warning("ignoring unreadable cache entry %s: %s", path, err)
        return None


def store(cfg: Config, key: dict, arrays: ArrayRecord, cost: dict) -> str:
    """Write the model atomically; the sidecar JSON records its key and what building it cost,
    so a run that finds it cached can still report the cost of the model it compares against."""
    path = _path(cfg, key)
    write_text(path[:-3] + ".json", json.dumps({"key": key, "cost": cost}, indent=1, sort_keys=True))
    with atomic_path(path) as tmp:
        torch.save(arrays.to_torch_state_dict(), tmp)
    return path
