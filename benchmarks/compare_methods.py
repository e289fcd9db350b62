"""Compare methods side by side: the FedUP paper's Tables 3-4 and the Lethe paper's Tables III-V, rebuilt.

One command runs a matrix of methods x scenarios x tasks x seeds and writes into one folder:

- ``tables.md``: FedUP's Table 3 layout (R-A, F-A, MIA per scenario) and Table 4 layout
  (unlearning time and communication per scenario), then Lethe's Tables III-V layout (one table
  per scenario: MU, U-KR, CT-KR, RR, communication), then what each original cost to pretrain (the
  shared one, and a method's own: FedAU's auxiliary training); means ± standard deviations over the seeds;
  the failed runs with their one-line errors, the flagged entries with their validity reasons, and
  the combinations skipped because a method does not support them;
- ``kr_curves.png``: every method's forget accuracy over continued training (Lethe's Fig. 4), one
  panel per task and scenario, retrain included (mean over the seeds);
- ``runs.json`` / ``runs.csv``: one row per run (rewritten after every run: a partial matrix is usable;
  ``--resume`` keeps the finished rows of an earlier call with the same clients and overrides and
  runs only the rest, e.g. after adding a method).

How the numbers are made: every run goes through the real phases in process
(``server_app.inprocess``: the production ServerApp and ClientApp code, no Ray and no SuperLink, so
no start-up cost per run; clients run one after the other, so a method's seconds add up over its
clients — the same for every method). ``--jobs 2`` runs two (task, scenario, seed) groups in two
processes side by side, one core each; the tables say how many jobs ran. All runs share one model cache, so every method of a
(task, scenario, seed) starts from the same original model and is compared with the same retrain
oracle. The client scenario uses ``poison='backdoor'`` unless ``--run-config`` says otherwise.

Validity (``tasks.validity``): when a run's original or retrain model fails its checks, every
metric of that run is printed as ``flagged``; when its unlearned model lost utility
(``unlearned_utility``), its accuracy and KR entries are; when continued training diverged, CT-KR
and RR read ``diverged@<round>``. A run that raises is listed as failed and the matrix goes on.

    python benchmarks/compare_methods.py --methods none,retrain,fedup,lethe,pga \\
        --scenarios client,class,sample --tasks digits-lenet5 --seeds 42 --clients 10 \\
        --run-config "continue-rounds=20" --out /tmp/compare
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one's

from server_app.atomic import atomic_path, write_text  # noqa: E402
from server_app.inprocess import parse_overrides, run_inprocess  # noqa: E402
from tasks.validity import ORIGINAL_CHECKS  # noqa: E402

SCENARIO_NAMES = {"client": "Client", "class": "Class", "sample": "Sample"}
ACCURACY_METRICS = ("retain_acc", "forget_acc", "mia", "test_acc")
ROW_FIELDS = ("task", "scenario", "seed", "method", "status", "retain_acc", "forget_acc", "test_acc", "mia",
              "target_rate", "ct_kr", "rr", "diverged_at_round", "seconds", "bytes", "rounds", "flags", "error",
              "folder")


@dataclass(frozen=True)
class Cell:
    """One run of the matrix."""

    task: str
    scenario: str
    seed: int
    method: str


def plan(methods: list[str], scenarios: list[str], tasks: list[str], seeds: list[int]) -> tuple[list[Cell], list[str]]:
    """The runs to make and the combinations skipped (one line each: a method that does not support
    a task kind or scenario). Unknown names are a one-line ``SystemExit`` before any run."""
    from strategies.registry import method_names, method_spec
    from tasks.registry import task_for, task_names

    for flag, names, known in (("--methods", methods, method_names()), ("--tasks", tasks, task_names()),
                               ("--scenarios", scenarios, tuple(SCENARIO_NAMES))):
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise SystemExit(f"{flag}: {', '.join(unknown) or 'nothing given'} is not allowed; "
                             f"must be among {', '.join(known)}")
    cells, skipped = [], []
    for task_name in tasks:
        task = task_for(task_name)
        for scenario in scenarios:
            for method in methods:
                spec = method_spec(method)
                if task.kind not in spec.task_kinds:
                    reason = f"runs on {', '.join(spec.task_kinds)} tasks, not {task.kind}"
                elif scenario not in spec.scenarios or scenario not in task.scenarios:
                    reason = f"does not support the {scenario} scenario"
                else:
                    cells += [Cell(task_name, scenario, seed, method) for seed in seeds]
                    continue
                skipped.append(f"{method} on {task_name} / {scenario}: {reason}")
    return cells, skipped


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def summarise(cell: Cell, results: dict, folder: str) -> dict:
    """One row from a run's results.json."""
    unlearned, res, cost = results["models"]["unlearned"], results["resurfacing"], results["cost"]["unlearn"]
    failed = list(results.get("validity", {}).get("failed", []))
    return {"task": cell.task, "scenario": cell.scenario, "seed": cell.seed, "method": cell.method, "status": "ok",
            **{k: _num(unlearned.get(k)) for k in ACCURACY_METRICS + ("target_rate",)},
            "ct_kr": _num(res.get("ct_kr")), "rr": _num(res.get("rr")),
            "diverged_at_round": res.get("diverged_at_round"),
            "kr_unlearned": _num(res.get("kr_unlearned")), "kr_curve": [_num(v) for v in res.get("kr_curve", [])],
            "seconds": _num(cost.get("seconds")), "bytes": int(cost["bytes_up"] + cost["bytes_down"]),
            "rounds": int(cost.get("rounds", 0)), "flags": failed,
            "reasons": list(results.get("validity", {}).get("reasons", [])), "error": "", "folder": folder,
            "own_original": results["run"].get("own_original"),
            "exact_fallback": (results.get("method") or {}).get("exact_fallback", {}).get("classes"),
            **_pretraining(results)}


def _pretraining(results: dict) -> dict:
    """What building the run's original cost (``cost.built.original``) and what the method kept
    from its pretraining beside it: on the clients (FedAU's ``method.pretraining_aux``) or on the
    server (the update history of FedEraser and Exact-Fun, ``method.history_bytes``)."""
    built = results["cost"].get("built", {}).get("original") or {}
    details = results.get("method", {})
    aux = details.get("pretraining_aux") or {}
    return {"pretrain_seconds": _num(built.get("seconds")),
            "pretrain_bytes": int(built["bytes_up"] + built["bytes_down"]) if built else None,
            "aux_seconds": _num(aux.get("train_seconds")), "aux_storage_bytes": aux.get("storage_bytes"),
            "history_bytes": details.get("history_bytes")}


def run_cell(cell: Cell, shared: dict, clients: int) -> dict:
    """Run one cell in process; a run that raises becomes a failed row with its one-line error."""
    config = {**shared, "task": cell.task, "scenario": cell.scenario, "seed": cell.seed, "method": cell.method}
    try:
        folder = run_inprocess(config, clients)
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as handle:
            return summarise(cell, json.load(handle), folder)
    except Exception as err:  # listed as failed; the rest of the matrix still completes
        return {"task": cell.task, "scenario": cell.scenario, "seed": cell.seed, "method": cell.method,
                "status": "failed", "error": " ".join(f"{type(err).__name__}: {err}".split())[:300],
                "flags": [], "reasons": []}


def quiet_logs() -> None:
    """Warnings only (Flower logs every round at INFO), so the progress lines stay readable."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("flwr").setLevel(logging.WARNING)


def _worker(groups: list[list[Cell]], shared: dict, clients: int, queue) -> None:
    quiet_logs()
    for group in groups:
        for cell in group:
            started = time.perf_counter()
            queue.put((cell, run_cell(cell, shared, clients), time.perf_counter() - started))


def run_matrix(cells: list[Cell], shared: dict, clients: int, jobs: int, on_row) -> None:
    """Run ``cells``, calling ``on_row(cell, row, seconds)`` as each finishes.

    The runs of one (task, scenario, seed) go in order through one process — the first builds the
    original and retrain models, the others find them in the shared cache — and with ``jobs`` > 1
    such groups run in that many processes side by side (each single-threaded: one core each)."""
    groups: dict[tuple, list[Cell]] = {}
    for cell in cells:
        groups.setdefault((cell.task, cell.scenario, cell.seed), []).append(cell)
    if jobs == 1 or len(groups) == 1:
        for group in groups.values():
            for cell in group:
                started = time.perf_counter()
                on_row(cell, run_cell(cell, shared, clients), time.perf_counter() - started)
        return
    import multiprocessing
    import queue as queues

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    shares: list[list[list[Cell]]] = [[] for _ in range(jobs)]
    for group in sorted(groups.values(), key=len, reverse=True):  # the longest groups first, to the least loaded
        min(shares, key=lambda share: sum(map(len, share))).append(group)
    workers = [context.Process(target=_worker, args=(share, shared, clients, results)) for share in shares if share]
    for worker in workers:
        worker.start()
    pending = set(cells)
    try:
        while pending:
            try:
                cell, row, seconds = results.get(timeout=5)
            except queues.Empty:
                if any(w.is_alive() for w in workers):
                    continue
                for cell in sorted(pending, key=cells.index):  # a worker died: what it had left failed
                    on_row(cell, {"task": cell.task, "scenario": cell.scenario, "seed": cell.seed,
                                  "method": cell.method, "status": "failed", "flags": [], "reasons": [],
                                  "error": "its worker process ended before running it"}, 0.0)
                return
            pending.discard(cell)
            on_row(cell, row, seconds)
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()


def blocked_metrics(row: dict) -> dict[str, str]:
    """Metric -> what to print instead of its number, for a run whose validity checks failed."""
    flags = set(row.get("flags", []))
    blocked = {}
    if flags & set(ORIGINAL_CHECKS):
        blocked.update({k: "flagged" for k in ACCURACY_METRICS + ("target_rate", "ct_kr", "rr")})
    if "unlearned_utility" in flags:
        blocked.update({k: "flagged" for k in ACCURACY_METRICS + ("target_rate",)})
    if row.get("diverged_at_round") is not None:
        blocked.update({k: f"diverged@{row['diverged_at_round']}" for k in ("ct_kr", "rr")})
    return blocked


def entry(rows: list[dict], metric: str, scale: float = 1.0, digits: int = 3) -> str:
    """One table entry over the seeds of one (task, scenario, method): ``mean ± std`` of the usable
    runs, ``(k/n)`` when only k of n seeds gave a number, else why none did."""
    if not rows:
        return "—"
    values, blocked = [], []
    for row in rows:
        if row["status"] != "ok":
            blocked.append("failed")
        elif metric in blocked_metrics(row):
            blocked.append(blocked_metrics(row)[metric])
        elif row.get(metric) is None:
            blocked.append("—")
        else:
            values.append(row[metric] * scale)
    if not values:
        return blocked[0] if len(set(blocked)) == 1 else "/".join(sorted(set(blocked)))
    text = f"{statistics.mean(values):.{digits}f}"
    if len(values) > 1:
        text += f" ± {statistics.stdev(values):.{digits}f}"
    return text + (f" ({len(values)}/{len(rows)})" if len(values) < len(rows) else "")


def _group(rows: list[dict]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["scenario"], row["method"]), []).append(row)
    return groups


def _order(rows: list[dict], key: str) -> list[str]:
    return list(dict.fromkeys(row[key] for row in rows))


def _label(rows: list[dict], method: str) -> str:
    """The method's row name; ``*`` when it started from its own original, not the shared one."""
    return method + (" *" if any(r["method"] == method and r.get("own_original") for r in rows) else "")


def fedup_tables(rows: list[dict]) -> str:
    """FedUP's Table 3 (R-A, F-A, MIA per scenario) and Table 4 (time, communication per scenario)."""
    groups, scenarios, methods = _group(rows), _order(rows, "scenario"), _order(rows, "method")
    parts = []
    for title, columns in (("Table 3 layout (FedUP): retain accuracy R-A, forget accuracy F-A, MIA",
                            (("R-A", "retain_acc", 1.0, 3), ("F-A", "forget_acc", 1.0, 3), ("MIA", "mia", 1.0, 3))),
                           ("Table 4 layout (FedUP): unlearning time and communication",
                            (("time (s)", "seconds", 1.0, 1), ("comm. (MB)", "bytes", 1e-6, 2)))):
        for task in _order(rows, "task"):
            header = ["method"] + [f"{SCENARIO_NAMES[s]} {c[0]}" for s in scenarios for c in columns]
            lines = [f"### {title} — {task}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            for method in methods:
                cells = [entry(groups.get((task, s, method), []), m, scale, d)
                         for s in scenarios for _, m, scale, d in columns]
                lines.append("| " + " | ".join([_label(rows, method)] + cells) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def lethe_tables(rows: list[dict]) -> str:
    """Lethe's Tables III-V: one table per scenario, MU, U-KR, CT-KR, RR (%), communication."""
    groups, methods = _group(rows), _order(rows, "method")
    columns = (("MU", "test_acc", 1.0, 3), ("U-KR", "forget_acc", 1.0, 3), ("CT-KR", "ct_kr", 1.0, 3),
               ("RR (%)", "rr", 1.0, 1), ("comm. (MB)", "bytes", 1e-6, 2))
    parts = []
    for number, scenario in zip(("III", "IV", "V"), ("client", "class", "sample")):
        if scenario not in _order(rows, "scenario"):
            continue
        for task in _order(rows, "task"):
            header = ["method"] + [c[0] for c in columns]
            lines = [f"### Table {number} layout (Lethe): {scenario} unlearning — {task}", "",
                     "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            for method in methods:
                group = groups.get((task, scenario, method), [])
                if group:
                    lines.append("| " + " | ".join([_label(rows, method)] + [entry(group, m, s, d)
                                                                             for _, m, s, d in columns]) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def pretraining_table(rows: list[dict]) -> str:
    """The original each method starts from and what building it cost (the shared one, or a method's
    own, ``*``), with what a method kept from pretraining on its clients (FedAU's auxiliary heads) or
    on the server (an update history). A method that starts from the shared original but keeps a
    history gets its own line: its run pretrained the shared original again, recording the history
    (same model), and that pretraining's time is what recording cost beside it."""
    columns = (("pretraining time (s)", "pretrain_seconds", 1.0, 1), ("pretraining comm. (MB)", "pretrain_bytes", 1e-6, 2),
               ("aux. training on holders (s)", "aux_seconds", 1.0, 1), ("kept on clients (kB)", "aux_storage_bytes", 1e-3, 1),
               ("history on the server (MB)", "history_bytes", 1e-6, 1))
    groups, parts = _group(rows), []
    for task in _order(rows, "task"):
        header = ["original", "scenario"] + [c[0] for c in columns]
        lines = [f"### Pretraining: what each original cost — {task}", "",
                 "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for scenario in _order(rows, "scenario"):
            shared = [m for m in _order(rows, "method") if groups.get((task, scenario, m))
                      and not any(r.get("own_original") for r in groups[(task, scenario, m)])]
            own = [m for m in _order(rows, "method") if groups.get((task, scenario, m))
                   and any(r.get("own_original") for r in groups[(task, scenario, m)])]
            plain = [m for m in shared if not any(r.get("history_bytes") for r in groups[(task, scenario, m)])]
            history = [m for m in shared if m not in plain]
            named = ([(f"shared ({', '.join(shared)})", plain[0])] if plain else []) + \
                [(f"{m} (shared, with its history)", m) for m in history] + [(f"{m} *", m) for m in own]
            for label, method in named:
                group = groups[(task, scenario, method)]
                lines.append("| " + " | ".join([label, scenario] + [entry(group, m, sc, d) for _, m, sc, d in columns])
                             + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def problems(rows: list[dict], skipped: list[str]) -> str:
    """The failed runs, the flagged entries, the runs whose result is retrain's own model (Lethe's exact
    fallback: their row reads as retrain's) and the skipped combinations, one line each."""
    lines = []
    for row in rows:
        where = f"{row['method']} on {row['task']} / {row['scenario']} / seed {row['seed']}"
        if row["status"] != "ok":
            lines.append(f"- failed: {where}: {row['error']}")
        elif row.get("reasons"):
            lines.append(f"- flagged: {where}: {'; '.join(row['reasons'])}")
        if row.get("exact_fallback"):
            shares = ", ".join(f"{share:.2f} of class {c}" for c, share in row["exact_fallback"].items())
            lines.append(f"- exact fallback: {where}: retrain's own model (the request removes {shares})")
    lines += [f"- skipped: {line}" for line in skipped]
    return "\n".join(lines) if lines else "none"


def plot_curves(rows: list[dict], path: str) -> None:
    """Lethe's Fig. 4: forget accuracy over continued rounds, one line per method, one panel per
    task and scenario (mean over the seeds; a diverged curve ends where it diverged)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    groups = _group([r for r in rows if r["status"] == "ok"])
    panels = list(dict.fromkeys((t, s) for t, s, _ in groups))
    colours = {m: plt.get_cmap("tab20")(i % 20) for i, m in enumerate(_order(rows, "method"))}  # one per method
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.2 * max(1, len(panels)), 3.4), squeeze=False)
    for ax, (task, scenario) in zip(axes[0], panels):
        for (t, s, method), group in groups.items():
            if (t, s) != (task, scenario):
                continue
            curves = [[r["kr_unlearned"]] + r["kr_curve"] for r in group if r.get("kr_unlearned") is not None]
            length = min((len(c) for c in curves), default=0)
            if length:
                mean = [statistics.mean(c[i] for c in curves) for i in range(length)]
                ax.plot(range(length), mean, marker=".", label=method, color=colours[method])
        ax.set_title(f"{task} / {scenario}", fontsize=9)
        ax.set_xlabel("continued round (0 = after unlearning)")
        ax.set_ylabel("forget accuracy (KR)")
        ax.set_ylim(-0.02, 1.02)
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def finished_rows(out: str, clients: int, overrides: str) -> dict[Cell, dict]:
    """The successful rows of an earlier call into ``out`` made with the same clients and overrides."""
    path = os.path.join(out, "runs.json")
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        rows = json.load(handle)
    return {Cell(r["task"], r["scenario"], r["seed"], r["method"]): r for r in rows
            if r["status"] == "ok" and r.get("clients") == clients and r.get("overrides") == overrides}


def write_rows(out: str, rows: list[dict]) -> None:
    write_text(os.path.join(out, "runs.json"), json.dumps(rows, indent=1, default=str))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "flags": ";".join(row.get("flags", []))})
    write_text(os.path.join(out, "runs.csv"), buffer.getvalue())


def report(rows: list[dict], skipped: list[str], clients: int, overrides: str, jobs: int) -> str:
    return "\n\n".join([
        "# Method comparison",
        f"In-process runs (`server_app.inprocess`, clients sequential, no Ray; {jobs} job(s) side by side), "
        f"{clients} clients, shared overrides: `{overrides or 'none'}`. Entries are mean ± std over the seeds; "
        "`(k/n)`: only k of n seeds gave a number; `*`: the method trains its own original model (its "
        "`run.own_original` in results.json), not the shared one the other rows start from.",
        fedup_tables(rows), lethe_tables(rows), pretraining_table(rows),
        "## Failed, flagged, exact fallbacks and skipped", problems(rows, skipped)]) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,retrain,fedup,lethe")
    parser.add_argument("--scenarios", default="client,class,sample")
    parser.add_argument("--tasks", default="digits-lenet5")
    parser.add_argument("--seeds", default="42")
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--run-config", default="continue-rounds=20",
                        help="shared overrides, as for flwr run --run-config (default: continue-rounds=20)")
    parser.add_argument("--out", required=True, help="folder for the tables, the plot, the rows, the cache and runs")
    parser.add_argument("--jobs", type=int, default=1,
                        help="processes running (task, scenario, seed) groups side by side (<= the cores)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows of finished runs already in OUT/runs.json (same clients and overrides)")
    args = parser.parse_args(argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds: {args.seeds!r} must be comma-separated integers") from None
    if args.clients < 2:
        raise SystemExit(f"--clients: {args.clients} must be >= 2")
    if not 1 <= args.jobs <= (os.cpu_count() or 1):
        raise SystemExit(f"--jobs: {args.jobs} must be in 1..{os.cpu_count()} (this machine's cores)")
    cells, skipped = plan(args.methods.split(","), args.scenarios.split(","), args.tasks.split(","), seeds)
    os.makedirs(args.out, exist_ok=True)
    shared = {"cache-dir": os.path.join(args.out, "cache"), "outputs-dir": os.path.join(args.out, "runs"),
              **parse_overrides(args.run_config)}
    quiet_logs()
    done = finished_rows(args.out, args.clients, args.run_config) if args.resume else {}
    rows: dict[Cell, dict] = {cell: done[cell] for cell in cells if cell in done}
    started = time.perf_counter()

    def on_row(cell: Cell, row: dict, seconds: float) -> None:
        rows[cell] = {**row, "clients": args.clients, "overrides": args.run_config}
        write_rows(args.out, [rows[c] for c in cells if c in rows])
        elapsed, finished = time.perf_counter() - started, len(rows) - len(done)
        left = len(cells) - len(rows)
        print(f"[{len(rows)}/{len(cells)}] {cell.method} on {cell.task} / {cell.scenario} / seed {cell.seed}: "
              f"{row['status']} in {seconds:.0f}s; elapsed {elapsed / 60:.1f} min, about "
              f"{elapsed / finished * left / 60:.1f} min left", flush=True)

    run_matrix([c for c in cells if c not in done], shared, args.clients, args.jobs, on_row)
    rows = [rows[c] for c in cells]
    text = report(rows, skipped, args.clients, args.run_config, args.jobs)
    write_text(os.path.join(args.out, "tables.md"), text)
    plot_curves(rows, os.path.join(args.out, "kr_curves.png"))
    print(text)
    print(f"tables, plot and rows in {args.out}")
    return args.out


if __name__ == "__main__":
    main()
