"""FedUP vs retrain from the same original model: unlearn-phase time and bytes, side by side.

Not a test: it prints what it measured. Both methods run in one process through the real phases
(``server_app.inprocess``), sharing one cache, so they start from the very same original model.
Clients run one after another in-process, for both methods alike, so the time ratio compares the
same amount of client work. Retrain's cost is what building the oracle cost (``cost.built``).

    python benchmarks/bench_fedup.py                       # digits-lenet5, 10 clients, 3 scenarios
    python benchmarks/bench_fedup.py --heavy               # + cifar10-resnet18 on random CIFAR files
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import tempfile

import numpy as np

from server_app.inprocess import run_inprocess


def results_of(folder: str) -> dict:
    with open(os.path.join(folder, "results.json"), encoding="utf-8") as handle:
        return json.load(handle)


def write_random_cifar10(root: str, per_batch: int, seed: int) -> None:
    """Random images in CIFAR-10's real python-pickle layout (only the shapes matter here)."""
    rng = np.random.default_rng(seed)
    folder = os.path.join(root, "cifar-10-batches-py")
    os.makedirs(folder, exist_ok=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8),
                 "labels": rng.integers(0, 10, size=per_batch).tolist()}
        with open(os.path.join(folder, name), "wb") as handle:
            pickle.dump(batch, handle)
    with open(os.path.join(folder, "batches.meta"), "wb") as handle:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, handle)


def compare(label: str, base: dict, clients: int) -> None:
    rows = {}
    for method in ("retrain", "fedup"):
        results = results_of(run_inprocess({**base, "method": method}, clients))
        cost = results["cost"]["unlearn"]
        rows[method] = (cost, results["models"]["unlearned"], results["method"])
    (r_cost, _, _), (f_cost, _, f_details) = rows["retrain"], rows["fedup"]
    r_bytes, f_bytes = r_cost["bytes_up"] + r_cost["bytes_down"], f_cost["bytes_up"] + f_cost["bytes_down"]
    print(f"\n== {label} ({clients} clients)")
    print(f"{'':10}{'seconds':>10}{'rounds':>8}{'bytes up':>12}{'bytes down':>12}{'retain':>8}{'forget':>8}")
    for method, (cost, model, _) in rows.items():
        print(f"{method:10}{cost['seconds']:10.2f}{cost['rounds']:8d}{cost['bytes_up']:12d}{cost['bytes_down']:12d}"
              f"{model['retain_acc']:8.3f}{model['forget_acc']:8.3f}")
    print(f"fedup / retrain: time {f_cost['seconds'] / r_cost['seconds']:.4f}, bytes {f_bytes / r_bytes:.4f}")
    print(f"fedup filter training {f_details['filter_seconds']:.2f}s; centroid compute per client "
          f"(sum {sum(f_details['centroid_seconds'].values()):.2f}s, max {max(f_details['centroid_seconds'].values()):.2f}s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--scenarios", default="client,class,sample", help="digits scenarios; '' = none")
    parser.add_argument("--heavy", action="store_true", help="also cifar10-resnet18 on random CIFAR-format data")
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="bench-fedup-")
    common = {"seed": args.seed, "cache-dir": os.path.join(work, "cache"), "outputs-dir": os.path.join(work, "out"),
              "continue-rounds": 0}
    for scenario in filter(None, args.scenarios.split(",")):
        compare(f"digits-lenet5 / {scenario}", {**common, "scenario": scenario}, args.clients)
    if args.heavy:
        data_dir = os.path.join(work, "data")
        write_random_cifar10(data_dir, per_batch=200, seed=args.seed)
        compare("cifar10-resnet18 / class, random CIFAR-format data",
                {**common, "task": "cifar10-resnet18", "scenario": "class", "data-dir": data_dir,
                 "pretrain-rounds": 3, "local-epochs": 1, "fedup-epochs": 50}, args.clients)
    print(f"\nruns under {work}")


if __name__ == "__main__":
    main()
