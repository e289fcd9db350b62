"""Non-IID client partitions: flwr-datasets' DirichletPartitioner over an in-memory label column.

Every client (and the server, when it needs partition sizes) recomputes the same assignment from
the labels and the seed, so no index list ever crosses the grid. Each partition is then split into
the client's training data and its local test split.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

import numpy as np

MIN_PARTITION_SIZE = 10


class PartitionError(ValueError):
    """The Dirichlet partitioner cannot split the data for these settings; one line naming them."""


@lru_cache(maxsize=8)
def _dirichlet_indices(labels: tuple[int, ...], num_partitions: int, alpha: float,
                       seed: int) -> tuple[np.ndarray, ...]:
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner

    min_size = min(MIN_PARTITION_SIZE, len(labels) // num_partitions)
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
