"""Shared test setup: one torch thread (CI has 2 cores), and small helpers."""

from __future__ import annotations

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def digits_config():
    """Run-config overrides for a tiny, fast federation on the offline default task."""
    return {"pretrain-rounds": 2, "continue-rounds": 1, "local-epochs": 1, "mia-max-samples": 50}


# Under ``-n 4 --dist loadfile`` (pyproject addopts) a file is one unit of work, handed out in this
# order. The end-to-end files that mostly wait on Flower's polling go first, so that the rest runs
# beside them instead of after; then the longest in-process files, longest first (test seconds from
# ``--durations=0`` on 2 cores: 542, 326, 315, 224, 147, 129), so that no long file starts last.
FIRST = ("test_deployment.py", "test_flwr_run.py", "test_nothing_lost.py", "test_ray_cluster.py",
         "test_experiment.py", "test_contract_vision.py", "test_fedup_tasks.py", "test_contract_text.py",
         "test_contract_llm.py", "test_compare_methods.py")


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(FIRST)))  # stable: file order kept otherwise
