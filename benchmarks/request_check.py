"""Is a request measurable and harmless? Train only its original model over seeds, federation
shapes and initial draws, beside a clean original, and print each one's test accuracy and KR.

An unlearning request poisons the leaving client's data so that there is something to forget; the
poisoning must not break the original model itself (README, Scenarios). This trains, in process
(``server_app.inprocess``: the production phases, one shared cache), the request's original model
and, as its reference, the clean original of the same federation and initial weights: the class
scenario's original, which trains every client's data with its true labels (its test accuracy is
measured without ``forget-class``, the class scenario's own split). Per row: the request's
original test accuracy and KR (``forget_acc``: the share of the forget set answered with the
labels it was trained with), its target rate (backdoor requests), the clean original's test
accuracy, and a verdict: ``destroyed`` (test accuracy below twice chance), ``below clean`` (more
than ``--margin`` under the clean original), ``not learned`` (KR under 0.5), else ``ok``.

    python benchmarks/request_check.py --seeds 89,90 --shapes 10:0.5,7:0.1 --draws 2

``--draws 2`` also runs each cell from the grid's second initial draw (``init-seed`` = seed + 1000,
``robustness_grid.draw_seed``). ``--run-config`` sets the request (default: the client scenario's
default poison). Markdown to stdout, CSV to ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.robustness_grid import draw_seed, parse_shapes  # noqa: E402
from server_app.inprocess import parse_overrides  # noqa: E402
from strategies.run_config import parse_config  # noqa: E402

COLUMNS = ("seed", "clients", "alpha", "init_seed", "test_acc", "kr", "target_rate", "clean_test_acc", "verdict")


def original_metrics(run_config: dict, clients: int) -> dict:
    """The pooled metrics of ``run_config``'s original model (trained, or read from the cache)."""
    from server_app.evaluation import evaluate_models
    from server_app.experiment import Experiment
    from server_app.inprocess import InProcessGrid
    from strategies.common.federation import Federation

    cfg = parse_config(run_config)
    fed = Federation(InProcessGrid(clients, run_config), round_timeout=cfg["round-timeout"],
                     min_reply_fraction=cfg["min-reply-fraction"])
    experiment = Experiment(fed, run_config)
    experiment.setup()
    original = experiment.cached_fedavg("original", "all", experiment.cfg["pretrain-rounds"])
    return evaluate_models(fed, experiment.cfg, {"original": original})["original"]


def verdict(test: float, kr: float, clean: float, chance: float, margin: float) -> str:
    if test < 2 * chance:
        return "destroyed"
    if test < clean - margin:
        return "below clean"
    return "not learned" if kr < 0.5 else "ok"


def check(seed: int, clients: int, alpha: float, init_seed: int, request: dict, work: str, margin: float) -> dict:
    shared = {"seed": seed, "dirichlet-alpha": alpha, "cache-dir": os.path.join(work, "cache"),
              "outputs-dir": os.path.join(work, "out"), **({"init-seed": init_seed} if init_seed != seed else {})}
    poisoned = original_metrics({"scenario": "client", **request, **shared}, clients)
    clean = original_metrics({**request, **shared, "scenario": "class"}, clients)
    clean_test = clean["test_acc"]
    chance = 1.0 / parse_config({**request, **shared}).task.num_classes
    return {"seed": seed, "clients": clients, "alpha": alpha, "init_seed": init_seed,
            "test_acc": poisoned["test_acc"], "kr": poisoned["forget_acc"],
            "target_rate": poisoned.get("target_rate"), "clean_test_acc": clean_test,
            "verdict": verdict(poisoned["test_acc"], poisoned["forget_acc"], clean_test, chance, margin)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="89,90")
    parser.add_argument("--shapes", default="10:0.5,7:0.1", help="CLIENTS:ALPHA pairs")
    parser.add_argument("--draws", type=int, default=1, help="initial draws per cell (the grid's draw seeds)")
    parser.add_argument("--run-config", default="", help="the request's settings, as for flwr run --run-config")
    parser.add_argument("--margin", type=float, default=0.03, help="how far under the clean original is 'below'")
    parser.add_argument("--work", default="", help="folder for the cache (default: a new temp folder)")
    parser.add_argument("--out", default="", help="CSV file of the rows")
    args = parser.parse_args()
    request, work = parse_overrides(args.run_config), args.work or tempfile.mkdtemp(prefix="request_check_")
    print("| " + " | ".join(COLUMNS) + " |\n|" + " --- |" * len(COLUMNS), flush=True)
    rows = []
    for seed in (int(s) for s in args.seeds.split(",")):
        for clients, alpha in parse_shapes(args.shapes):
            for draw in range(args.draws):
                row = check(seed, clients, alpha, draw_seed(seed, draw) if draw else seed, request, work, args.margin)
                rows.append(row)
                print("| " + " | ".join(f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c])
                                        for c in COLUMNS) + " |", flush=True)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("ok", "not learned", "below clean", "destroyed")}
    print("\n" + ", ".join(f"{k}: {n}/{len(rows)}" for k, n in counts.items()))
    if args.out:
        with open(args.out, "w", newline="", encoding="utf-8") as handle:
            writer = csv.DictWriter(handle, fieldnames=COLUMNS)
            writer.writeheader()
            writer.writerows(rows)


if __name__ == "__main__":
    main()
