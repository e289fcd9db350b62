"""FedUP through every phase on every vision architecture, on small files in the real formats."""

import json
import os

import numpy as np
import pytest

from server_app.inprocess import run_inprocess
from test_vision_datasets import write_cifar10, write_cifar100, write_mnist

WRITERS = {
    "mnist-lenet5": lambda root, rng: write_mnist(root, rng, n_train=60),
    "cifar10-resnet18": lambda root, rng: write_cifar10(root, rng, per_batch=12),
    "cifar100-resnet34": lambda root, rng: write_cifar100(root, rng, n=60),
    "cifar10-vit": lambda root, rng: write_cifar10(root, rng, per_batch=12),
}


@pytest.mark.parametrize("task", sorted(WRITERS))
def test_fedup_runs_and_restores_on_every_vision_task(tmp_path, task):
    WRITERS[task](tmp_path / "data", np.random.default_rng(0))
    config = {"task": task, "method": "fedup", "scenario": "sample", "data-dir": str(tmp_path / "data"),
              "pretrain-rounds": 1, "local-epochs": 1, "continue-rounds": 1, "fedup.epochs": 2,
              "mia-max-samples": 10, "diagnostic-samples": 5,
              "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out")}
    folder = run_inprocess(config, num_clients=2)
    with open(os.path.join(folder, "results.json")) as handle:
        results = json.load(handle)
    assert results["run"]["task"] == task
    assert results["cost"]["unlearn"]["rounds"] == 1
    assert results["models"]["restored"]["equals_original"] is True
    assert 0.0 <= results["models"]["unlearned"]["retain_acc"] <= 1.0
