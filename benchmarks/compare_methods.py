"""Run several methods x scenarios x seeds in one process and print one Markdown table.

Every run goes through the real phases (``server_app.inprocess``) with a shared cache, so all
methods of a (scenario, seed) start from the same original model and share one retrain oracle.
The ``original`` and ``retrain`` rows are read from the runs themselves.

    python benchmarks/compare_methods.py --methods retrain,fedup --scenarios client,class,sample \\
        --seeds 1,2,3 --run-config "continue-rounds=0"
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from server_app.inprocess import parse_overrides, run_inprocess

COLUMNS = ("retain_acc", "forget_acc", "test_acc", "mia", "target_rate")


def _fmt(value) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="retrain,fedup")
    parser.add_argument("--scenarios", default="client,class,sample")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--run-config", default="", help="shared overrides, as for flwr run --run-config")
    parser.add_argument("--work", default="", help="folder for cache and outputs (default: a new temp folder)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="compare-")
    shared = {"cache-dir": os.path.join(work, "cache"), "outputs-dir": os.path.join(work, "out"),
              **parse_overrides(args.run_config)}
    header = ("scenario", "seed", "model") + COLUMNS + ("ct_kr", "rr", "seconds", "bytes")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for scenario in args.scenarios.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            for i, method in enumerate(args.methods.split(",")):
                config = {**shared, "scenario": scenario, "seed": seed, "method": method}
                with open(os.path.join(run_inprocess(config, args.clients), "results.json")) as handle:
                    results = json.load(handle)
                rows = [("original", results["models"]["original"], None, None)] if i == 0 else []
                rows.append((method, results["models"]["unlearned"], results["resurfacing"], results["cost"]["unlearn"]))
                for name, entry, res, cost in rows:
                    cells = [scenario, str(seed), name] + [_fmt(entry.get(c)) for c in COLUMNS]
                    cells += [_fmt(res["ct_kr"]) if res else "—", _fmt(res["rr"]) if res else "—",
                              _fmt(cost["seconds"]) if cost else "—",
                              str(cost["bytes_up"] + cost["bytes_down"]) if cost else "—"]
                    print("| " + " | ".join(cells) + " |", flush=True)
    print(f"\nruns under {work}")


if __name__ == "__main__":
    main()
