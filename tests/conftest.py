"""Shared test setup: one torch thread (CI has 2 cores), and small helpers."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def digits_config():
    """Run-config overrides for a tiny, fast federation on the offline default task."""
    return {"pretrain-rounds": 2, "continue-rounds": 1, "local-epochs": 1, "mia-max-samples": 50}


# The end-to-end files that mostly wait on Flower's polling go first, so that under
# ``-n 4 --dist loadfile`` (pyproject addopts) the rest of the suite runs beside them instead of after.
FIRST = ("test_deployment.py", "test_flwr_run.py", "test_nothing_lost.py", "test_ray_cluster.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: file order kept otherwise
