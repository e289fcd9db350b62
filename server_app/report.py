"""Results: ``results.json`` (the contract in DESIGN.md), one CSV row per run, and plots.

All files are written atomically. The run folder is ``<outputs-dir>/<utc-time>-<task>-<method>-
<scenario>-s<seed>``; the CSV (``<outputs-dir>/results.csv``) gains one row per run, so a sweep of
runs becomes one table.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from importlib import metadata

from server_app.atomic import atomic_path, write_text

CSV_FIELDS = ("time", "task", "method", "scenario", "seed", "num_clients",
              "original_test_acc", "original_forget_acc", "unlearned_retain_acc", "unlearned_forget_acc",
              "unlearned_test_acc", "unlearned_mia", "unlearned_target_rate", "ct_kr", "rr",
              "unlearn_seconds", "unlearn_bytes_up", "unlearn_bytes_down", "folder")
VERSIONED = ("flwr", "torch", "torchvision", "scikit-learn", "flwr-datasets", "transformers", "peft")


def package_versions() -> dict[str, str]:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def run_folder(outputs_dir: str, cfg: dict) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    name = f"{stamp}-{cfg['task']}-{cfg['method']}-{cfg['scenario']}-s{cfg['seed']}"
    return os.path.join(os.path.abspath(os.path.expanduser(outputs_dir)), name)


def _clean(value):
    """JSON has no NaN: write null for a figure that could not be measured."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def write_results(folder: str, results: dict) -> str:
    path = os.path.join(folder, "results.json")
    write_text(path, json.dumps(_clean(results), indent=2, sort_keys=False))
    return path


def append_csv(outputs_dir: str, results: dict, folder: str) -> str:
    """Append one row (header first when the file is new); rewrites the file atomically."""
    path = os.path.join(os.path.abspath(os.path.expanduser(outputs_dir)), "results.csv")
    models, res, cost = results["models"], results["resurfacing"], results["cost"]["unlearn"]
    unlearned = models.get("unlearned", {})
    row = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "task": results["run"]["task"],
        "method": results["run"]["method"], "scenario": results["run"]["scenario"],
        "seed": results["run"]["seed"], "num_clients": results["run"]["num_clients"],
        "original_test_acc": models["original"]["test_acc"], "original_forget_acc": models["original"]["forget_acc"],
        "unlearned_retain_acc": unlearned.get("retain_acc"), "unlearned_forget_acc": unlearned.get("forget_acc"),
        "unlearned_test_acc": unlearned.get("test_acc"), "unlearned_mia": unlearned.get("mia"),
        "unlearned_target_rate": unlearned.get("target_rate", ""), "ct_kr": res.get("ct_kr"), "rr": res.get("rr"),
        "unlearn_seconds": cost["seconds"], "unlearn_bytes_up": cost["bytes_up"],
        "unlearn_bytes_down": cost["bytes_down"], "folder": folder,
    }
    previous = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
    if not previous:
        writer.writeheader()
    writer.writerow(row)
    write_text(path, previous + buffer.getvalue())
    return path


def plot_kr_curve(folder: str, resurfacing: dict, title: str) -> str:
    """PNG of forget accuracy (KR) over the continued-training rounds, with the reference lines."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    curve = [resurfacing["kr_unlearned"]] + list(resurfacing["kr_curve"])
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    ax.plot(range(len(curve)), curve, marker="o", label="unlearned, continued")
    for key, style, label in (("kr_original", "--", "original"), ("kr_retrain", ":", "retrain")):
        if resurfacing.get(key) is not None and not math.isnan(resurfacing[key]):
            ax.axhline(resurfacing[key], linestyle=style, color="gray", label=label)
    ax.set_xlabel("continued round (0 = right after unlearning)")
    ax.set_ylabel("forget accuracy (KR)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    path = os.path.join(folder, "kr_curve.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
