"""FedUP vs retrain from the same original model: unlearn-phase time and bytes, side by side.

Not a test: it prints what it measured. Both methods run in one process through the real phases
(``server_app.inprocess``), sharing one cache, so they start from the very same original model.
Clients run one after another in-process, for both methods alike, so the time ratio compares the
same amount of client work. Retrain's cost is what building the oracle cost (``cost.built``).

    python benchmarks/bench_fedup.py                       # digits-lenet5, 10 clients, 3 scenarios
    python benchmarks/bench_fedup.py --heavy               # + cifar10-resnet18 on random CIFAR files

``--filter-only`` times just the server-side filter training (``strategies.fedup.filter.train_filter``) on
synthetic centroids of a task's size, with the task's real head, on each device of ``--device``
(side by side; no federation, no Flower). ``--filter-epochs`` shortens it; the table also
extrapolates to the run's ``fedup.epochs``:

    python benchmarks/bench_fedup.py --filter-only --device cpu,cuda --filter-epochs 20
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one's

# (arch, classes, input channels, centroids): M ~ rho * training samples with the paper's client-scenario
# rho = 0.8: digits (1797 x 0.8 train) and CIFAR-10 (50,000).
FILTER_PRESETS = {
    "digits-lenet5": ("lenet5", 10, 1, 1150),
    "cifar10-resnet18": ("resnet18", 10, 3, 40000),
    "cifar100-resnet34": ("resnet34", 100, 3, 40000),
}


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
    from server_app.inprocess import run_inprocess

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


def synthetic_centroids(num: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``num`` nonnegative (post-ReLU-like) centroids around one mean per class, their labels, and the
    forget mask (class 0)."""
    generator = torch.Generator().manual_seed(seed)
    means = torch.rand(classes, dim, generator=generator) * 2
    labels = torch.arange(num) % classes
    centroids = (means[labels] + 0.5 * torch.randn(num, dim, generator=generator)).clamp_(min=0)
    return centroids, labels, labels == 0


def bench_filter(presets: list[str], devices: list[str], epochs: int, seed: int) -> None:
    """Filter training time per device on each preset (run config defaults for the filter settings)."""
    from strategies.fedup.centroids import divert_targets
    from strategies.fedup.filter import FedUPFilter, train_filter
    from strategies.run_config import parse_config
    from tasks.vision.models import build_vision_model

    cfg = parse_config({})
    print(f"FedUP filter training: bottleneck {cfg['fedup.bottleneck']}, batch {cfg['fedup.batch-size']}, "
          f"{cfg['fedup.optimizer']}, lr {cfg['fedup.lr'] or cfg['lr']}, alpha {cfg['fedup.alpha']}; timed {epochs} epochs "
          f"(extrapolated to fedup.epochs={cfg['fedup.epochs']}); torch threads {torch.get_num_threads()}")
    print(f"{'preset':20}{'device':8}{'M':>7}{'d':>5}{'s/epoch':>10}{'est. s':>9}{'loss':>9}{'acc':>7}")
    for preset in presets:
        arch, classes, channels, num = FILTER_PRESETS[preset]
        head = build_vision_model(arch, classes, channels).head
        centroids, labels, forget = synthetic_centroids(num, head.in_features, classes, seed)
        targets = divert_targets(labels, forget, classes)
        for name in devices:
            device = torch.device(name)
            filt = FedUPFilter(head.in_features, cfg["fedup.bottleneck"], seed=seed).to(device)
            head_on = head.to(device)
            train = lambda e: train_filter(filt, head_on, centroids, targets, alpha=cfg["fedup.alpha"], epochs=e,
                                           lr=cfg["fedup.lr"] or cfg["lr"], batch_size=cfg["fedup.batch-size"],
                                           optimizer=cfg["fedup.optimizer"], seed=seed)
            train(1)  # warm-up (CUDA context, kernels, allocator)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            history = train(epochs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            per_epoch = (time.perf_counter() - start) / epochs
            print(f"{preset:20}{name:8}{num:7d}{head.in_features:5d}{per_epoch:10.4f}"
                  f"{per_epoch * cfg['fedup.epochs']:9.1f}{history['total'][-1]:9.4f}{history['accuracy'][-1]:7.3f}")
            head = head_on.cpu()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--scenarios", default="client,class,sample", help="digits scenarios; '' = none")
    parser.add_argument("--heavy", action="store_true", help="also cifar10-resnet18 on random CIFAR-format data")
    parser.add_argument("--filter-only", action="store_true",
                        help="time only the server-side filter training on synthetic centroids (no federation)")
    parser.add_argument("--device", default="cpu,cuda" if torch.cuda.is_available() else "cpu",
                        help="--filter-only: comma-separated torch devices, timed side by side")
    parser.add_argument("--presets", default="digits-lenet5,cifar10-resnet18",
                        help=f"--filter-only: comma-separated, of {', '.join(FILTER_PRESETS)}")
    parser.add_argument("--filter-epochs", type=int, default=20, help="--filter-only: epochs timed per run")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.filter_only:
        presets = [p for p in args.presets.split(",") if p]
        unknown = [p for p in presets if p not in FILTER_PRESETS]
        if unknown or args.filter_epochs < 1:
            parser.error(f"unknown presets {unknown} (known: {', '.join(FILTER_PRESETS)}) or --filter-epochs < 1")
        bench_filter(presets, [d for d in args.device.split(",") if d], args.filter_epochs, args.seed)
        return
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
                 "pretrain-rounds": 3, "local-epochs": 1, "fedup.epochs": 50}, args.clients)
    print(f"\nruns under {work}")


if __name__ == "__main__":
    main()
