"""Non-IID client partitions: flwr-datasets' DirichletPartitioner over an in-memory label column.

Every client (and the server, when it needs partition sizes) recomputes the same assignment from
the labels and the seed, so no index list ever crosses the grid. Each partition is then split into
the client's training data and its local test split.

A ClientApp process may keep the assignment on disk (:func:`use_store`; the files sit in the
node's view-cache folder, ``client_app.view_cache.PartitionFiles``): the Deployment Engine starts
a fresh process for every message, and computing the assignment imports flwr-datasets and Hugging
Face ``datasets`` (2-3 s on a 2-core machine, more than the rest of a message's start). The file is keyed by what determines the assignment (the
label column's hash, the partition count, alpha, seed, minimum size and the flwr-datasets version),
so every deletion request over the same partition reads it, and a change of any of them is a new
file.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from functools import lru_cache
from importlib import metadata

import numpy as np

MIN_PARTITION_SIZE = 10


class PartitionError(ValueError):
    """The Dirichlet partitioner cannot split the data for these settings; one line naming them."""


_store = {"files": None}


def use_store(files) -> None:
    """From now on in this process, keep computed assignments in ``files`` (an object with
    ``load(key, num_partitions)`` -> tuple of index arrays or None, and ``save(key, parts)``;
    ``client_app.view_cache.PartitionFiles``); None: memory only."""
    _store["files"] = files


def store_key(labels: tuple[int, ...], num_partitions: int, alpha: float, seed: int, min_size: int) -> str:
    """What determines an assignment, as the text a stored one is filed under."""
    return json.dumps({"labels": hashlib.sha256(np.asarray(labels, dtype=np.int64).tobytes()).hexdigest(),
                       "n": len(labels), "num_partitions": num_partitions, "alpha": alpha, "seed": seed,
                       "min_size": min_size, "flwr-datasets": metadata.version("flwr-datasets")}, sort_keys=True)


@lru_cache(maxsize=8)
def _dirichlet_indices(labels: tuple[int, ...], num_partitions: int, alpha: float,
                       seed: int) -> tuple[np.ndarray, ...]:
    min_size = min(MIN_PARTITION_SIZE, len(labels) // num_partitions)
    files = _store["files"]
    if files is None:
        return _compute(labels, num_partitions, alpha, seed, min_size)
    key = store_key(labels, num_partitions, alpha, seed, min_size)
    parts = files.load(key, num_partitions)
    if parts is None:
        parts = _compute(labels, num_partitions, alpha, seed, min_size)
        files.save(key, parts)
    return parts


def _compute(labels: tuple[int, ...], num_partitions: int, alpha: float, seed: int,
             min_size: int) -> tuple[np.ndarray, ...]:
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    partitioner = DirichletPartitioner(
        num_partitions=num_partitions, partition_by="label", alpha=alpha, min_partition_size=min_size,
        self_balancing=False, shuffle=True, seed=seed,
    )
    partitioner.dataset = Dataset.from_dict({"label": list(labels), "idx": list(range(len(labels)))})
    try:
        with warnings.catch_warnings():  # its retry warnings are many lines; the failure is reported below
            warnings.simplefilter("ignore", UserWarning)
            return tuple(np.sort(np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64))
                         for i in range(num_partitions))
    except ValueError as err:
        raise PartitionError(
            f"dirichlet-alpha={alpha:g} with {num_partitions} clients: flwr-datasets' DirichletPartitioner "
            f"found no split of the {len(labels)} samples giving every client at least {min_size} samples "
            f"({' '.join(str(err).split())}); raise dirichlet-alpha or use fewer clients") from None


def dirichlet_partitions(labels: np.ndarray, num_partitions: int, alpha: float,
                         seed: int) -> list[np.ndarray]:
    """Sample indices of each partition (disjoint, covering all samples), deterministic in ``seed``."""
    if num_partitions < 2:
        raise ValueError(f"num-partitions={num_partitions}: at least 2 clients are needed")
    if alpha <= 0:
        raise ValueError(f"dirichlet-alpha={alpha}: must be > 0")
    key = tuple(int(v) for v in np.asarray(labels).ravel())
    return list(_dirichlet_indices(key, num_partitions, float(alpha), int(seed)))


def train_test_split(indices: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Split one partition into (train, local test), at least one sample on each side when possible."""
    rng = np.random.default_rng(seed)
    shuffled = rng.permutation(indices)
    n_test = int(round(len(indices) * test_fraction))
    n_test = min(max(n_test, 1), len(indices) - 1) if len(indices) > 1 else 0
    return np.sort(shuffled[n_test:]), np.sort(shuffled[:n_test])
