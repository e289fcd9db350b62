"""On-disk cache of the original and retrain-oracle models.

The key is a hash of everything that determines the model: the data's identity (the fingerprint of
the arrays or records actually read, so other files under the same ``data-dir`` never reuse a model),
the federation (every client's id and data counts from the hello round), the partition settings,
the request, every training setting and the rounds. So every method in a comparison starts from the
very same original model, and RR always uses the same retrain reference. Only a model built while
no client failed is stored (a degraded one is the caller's to report, never reused).

Each entry is two files written atomically under a lock: ``<kind>-<digest>.pt`` (weights) and a
JSON sidecar naming its kind, its full key, the sha256 of the ``.pt`` file and what building it
cost. On load the sidecar must name the same kind and key and the file must match its hash, so a
corrupt, truncated or swapped entry (``retrain-*.pt`` copied over ``original-*.pt``) is rejected
with a one-line warning and rebuilt. Weights load with ``weights_only=True``: a planted entry
cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import torch
from flwr.app import ArrayRecord

from core.config import Config
from core.files import atomic_path, locked, sha256_of, write_text

log = logging.getLogger("fedunlearn")

CACHE_VERSION = 8  # 2: data fingerprint and federation in the key; 3: the backdoor client's clean copies;
# 4: the backdoor client's forget set leaves out its samples of the target class; 8: the original and
# the retrain oracle are plain FedAvg (every round played once, no rounds added), so a model cached by
# an earlier version is not reused
TRAINING_KEYS = ("task", "seed", "dirichlet-alpha", "test-fraction", "local-epochs", "batch-size", "lr",
                 "momentum", "max-grad-norm", "fraction-train")
REQUEST_KEYS = {
    "client": ("scenario", "poison", "poison-epochs", "forget-client", "backdoor-target", "trigger-size",
               "backdoor-share"),
    "class": ("scenario", "forget-class"),
    "sample": ("scenario", "forget-client", "sample-fraction", "backdoor-target", "trigger-size"),
}


def data_fingerprint(cfg: Config) -> str:
    """sha256 identity of the training data this run reads (the same files the clients read): the
    task's ``data_fingerprint``. Raises the loaders' own one-line errors (missing or bad files)."""
    return cfg.task.data_fingerprint(cfg)


def model_key(kind: str, cfg: Config, federation: list[dict], data: str) -> dict:
    """What determines the ``kind`` ('original' or 'retrain') model of this run; ``federation`` is
    every client's ``{"client-id", counts...}`` (hello), ``data`` the data's fingerprint."""
    rounds = cfg["pretrain-rounds"] if kind == "original" else cfg.rounds_of_retrain
    keys = TRAINING_KEYS + REQUEST_KEYS[cfg["scenario"]]
    if cfg["scenario"] == "client" and cfg["poison"] == "label-flip":
        keys = tuple(k for k in keys if k not in ("backdoor-target", "trigger-size", "backdoor-share"))
    # settings added after the cache: in the key only away from their default, so old keys stay valid
    scheduled = {"lr-schedule": cfg["lr-schedule"]} if cfg["lr-schedule"] != "constant" else {}
    drawn = {"init-seed": cfg.init_seed} if cfg.init_seed != cfg["seed"] else {}
    from tasks.stream import view_key_part

    stream = view_key_part(cfg)  # a stream's poisoning and, for a retrain oracle, the requests answered so far
    return {"kind": kind, "version": CACHE_VERSION, "num-clients": len(federation), "rounds": rounds,
            "data": data, "federation": federation, **{k: cfg[k] for k in keys}, **scheduled, **drawn, **stream}


def cache_dir(cfg: Config) -> str:
    return cfg["cache-dir"] or os.path.join(os.path.expanduser("~"), ".cache", "fedunlearn", "models")


def entry_id(key: dict) -> str:
    """The 16-hex-digit identity of the model ``key`` describes (its cache file's name)."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _path(cfg: Config, key: dict) -> str:
    return os.path.join(cache_dir(cfg), f"{key['kind']}-{entry_id(key)}.pt")


def _same(a, b) -> bool:
    """Keys compare through JSON (what the sidecar holds): lists for tuples, sorted dict keys."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def load(cfg: Config, key: dict) -> tuple[ArrayRecord, dict] | None:
    """(model, cost of building it) for ``key``, or None when missing or not the entry it claims."""
    path = _path(cfg, key)
    if not os.path.exists(path):
        return None
    try:
        with locked(path):
            with open(path[:-3] + ".json", encoding="utf-8") as handle:
                sidecar = json.load(handle)
            if sidecar.get("kind") != key["kind"] or not _same(sidecar.get("key"), key):
                raise ValueError(f"its sidecar describes another model (kind {sidecar.get('kind')!r})")
            if sha256_of(path) != sidecar.get("sha256"):
                raise ValueError("its content does not match the sha256 its sidecar records")
            arrays = ArrayRecord(torch.load(path, map_location="cpu", weights_only=True))
        return arrays, sidecar["cost"]
    except Exception as err:  # a corrupt or forged entry must not stop the run: rebuild it
        log.warning("ignoring cache entry %s and rebuilding it: %s", path, " ".join(str(err).split()))
        return None


def store(cfg: Config, key: dict, arrays: ArrayRecord, cost: dict) -> str:
    """Write the model and its sidecar (kind, key, content sha256, what building it cost, so a run
    that finds it cached can still report the cost of the model it compares against)."""
    path = _path(cfg, key)
    with locked(path), atomic_path(path) as tmp:
        torch.save(arrays.to_torch_state_dict(), tmp)
        sidecar = {"kind": key["kind"], "key": key, "sha256": sha256_of(tmp), "cost": cost}
        write_text(path[:-3] + ".json", json.dumps(sidecar, indent=1, sort_keys=True))
    return path
