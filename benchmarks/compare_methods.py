"""Compare methods side by side: the FedUP paper's Tables 3-4 and the Lethe paper's Tables III-V, rebuilt.

One command runs a matrix of methods x scenarios x tasks x seeds and writes into one folder. A
method runs its paper unless a recipe (the project's named, opt-in settings) is selected: a token
``M@R`` in ``--methods`` runs method M with the run config ``recipe='R'`` and names it "M (R)", so
one call puts a paper and a recipe side by side (``--methods retrain,lethe,lethe@lethe-robust``);
``--run-config "recipe='R'"`` selects R for every plain token instead (then every plain token must
be a method R is written for; ``M@paper`` keeps M's paper). A recipe that does not exist or is not
written for its method stops the call before any run. Every table names each row's recipe (``paper`` where none was selected; read from the
run's ``run.recipe``, absent in older results: ``paper``) and every plot legend names it after the
method:

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
  runs only the rest, e.g. after adding a method; it refuses, in one line, a ``runs.json`` that is
  not readable or was made with other ``--clients`` or another ``--run-config``).

Every config error (an argument, ``--run-config``, a method token's recipe, any cell's run config as
``strategies.run_config.parse_config`` checks it) is one line on stderr and exit status 2, before any run; a
call whose runs all failed exits with status 1.

How the numbers are made: every run goes through the real phases in process
(``server_app.inprocess``: the production ServerApp and ClientApp code, no Ray and no SuperLink, so
no start-up cost per run; clients run one after the other, so a method's seconds add up over its
clients — the same for every method). ``--jobs 2`` runs two (task, scenario, seed) groups in two
processes side by side, one core each; the tables say how many jobs ran. All runs share one model cache, so every method of a
(task, scenario, seed) starts from the same original model and is compared with the same retrain
oracle. The client scenario uses ``poison='backdoor'`` unless ``--run-config`` says otherwise.

Validity (``tasks.validity``) flags, never hides: when a run's original or retrain model fails its
checks, every accuracy and KR entry of that run shows its number marked ``(flagged)``; when its
unlearned model lost utility (``unlearned_utility``), its accuracy entries are; the seeds without a
flag are averaged apart from the flagged ones (``0.912 (2/3); 0.410 (flagged, 1/3)``), and the
reasons are listed at the end. A run whose method did not carry the request out
(``method.carried_out`` false: it reports its own model) shows its numbers marked ``(not carried
out)`` in the same way. When continued training diverged, CT-KR and RR read ``diverged@<round>``. A
run that raises is listed as failed and the matrix goes on.

    python benchmarks/compare_methods.py --methods none,retrain,fedup,lethe,pga \\
        --scenarios client,class,sample --tasks digits-lenet5 --seeds 42 --clients 10 \\
        --run-config "continue-rounds=20" --out /tmp/compare

    # Lethe's paper beside the lethe-robust recipe, with retrain as the reference
    python benchmarks/compare_methods.py --methods retrain,lethe,lethe@lethe-robust \\
        --scenarios client,class,sample --seeds 42,43,44 --out /tmp/lethe-recipe
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
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one's

from core.files import atomic_path, folder_problem, write_text  # noqa: E402
from server_app.inprocess import parse_overrides, run_inprocess, setup_logging  # noqa: E402
from server_app.report import carried_out, run_recipe  # noqa: E402
from tasks.validity import ORIGINAL_CHECKS  # noqa: E402

SCENARIO_NAMES = {"client": "Client", "class": "Class", "sample": "Sample"}
ACCURACY_METRICS = ("retain_acc", "forget_acc", "mia", "test_acc")
PAPER = "paper"  # the recipe of a run that selected none
ROW_FIELDS = ("task", "scenario", "seed", "method", "recipe", "status", "carried_out", "retain_acc", "forget_acc",
              "test_acc", "mia", "target_rate", "ct_kr", "rr", "diverged_at_round", "seconds", "bytes", "rounds",
              "flags", "error", "folder")
# what building the original cost (the pretraining table): the same whatever the unlearning did
PRETRAINING_METRICS = ("pretrain_seconds", "pretrain_bytes", "aux_seconds", "aux_storage_bytes", "history_bytes")


@dataclass(frozen=True)
class Cell:
    """One run of the matrix."""

    task: str
    scenario: str
    seed: int
    method: str
    recipe: str = PAPER  # what the run is asked to run (``M@R``; else the shared run config's recipe)
    pinned: bool = False  # the recipe was given with the method (``M@R``), not by the shared run config


def parse_methods(tokens: list[str], default: str = PAPER, flag: str = "--methods") -> list[tuple[str, str | None]]:
    """``--methods`` tokens -> ``(method, recipe)``: ``"lethe"`` -> ``("lethe", None)`` (the shared run
    config decides: the paper unless it selects a recipe), ``"lethe@lethe-robust"`` -> ``("lethe",
    "lethe-robust")`` (that recipe, whatever the shared run config says; ``@paper``: the paper).
    Two tokens that run the same method and recipe (``default``: the shared run config's, a plain
    token's), a token with an empty method or recipe, or a recipe that does not exist or is written for
    other methods (``recipes/<name>.toml``) are a one-line ``SystemExit`` before any run. Shared by
    ``robustness_grid.py``."""
    from strategies.registry import method_names
    from tasks.recipes import RecipeError, load_recipe, recipe_names

    parsed = []
    for token in tokens:
        method, sep, recipe = token.strip().partition("@")
        if not method or (sep and not recipe) or "@" in recipe:
            raise SystemExit(f"{flag}: {token!r} is not METHOD or METHOD@RECIPE")
        parsed.append((method, recipe if sep else None))
    unknown = list(dict.fromkeys(m for m, _ in parsed if m not in method_names()))
    if unknown or not parsed:
        raise SystemExit(f"{flag}: {', '.join(unknown) or 'nothing given'} is not allowed; "
                         f"must be among {', '.join(method_names())}")
    resolved = [(m, r or default) for m, r in parsed]
    twice = sorted({method_label(m, r) for m, r in resolved if resolved.count((m, r)) > 1})
    if twice:
        raise SystemExit(f"{flag}: {', '.join(twice)} given more than once")
    for method, recipe in dict.fromkeys(resolved):
        if recipe == PAPER:
            continue
        if recipe not in recipe_names():
            raise SystemExit(f"{flag}: {method_label(method, recipe)}: no recipe {recipe!r}; the recipes are "
                             f"{', '.join(recipe_names()) or 'none'} (or {PAPER})")
        try:
            written_for = load_recipe(recipe).methods
        except RecipeError as err:
            raise SystemExit(f"{flag}: {method_label(method, recipe)}: {err}") from None
        if method not in written_for:
            raise SystemExit(f"{flag}: {method_label(method, recipe)}: recipe {recipe!r} is for "
                             f"{', '.join(written_for)}, not {method} (give it with the method: "
                             f"{written_for[0] if written_for else 'METHOD'}@{recipe})")
    return parsed


def with_recipe(config: dict, recipe: str | None) -> dict:
    """``config`` (a run config) with a ``--methods`` token's recipe (:func:`parse_methods`) applied:
    unchanged for a plain token (``None``), ``recipe='R'`` for ``M@R``, and without a ``recipe`` key
    for ``M@paper``. Shared by ``robustness_grid.py``."""
    if recipe is None:
        return dict(config)
    if recipe == PAPER:
        return {k: v for k, v in config.items() if k != "recipe"}
    return {**config, "recipe": recipe}


def method_label(method: str, recipe: str) -> str:
    """How plots and lines name a run: ``"lethe (paper)"``, ``"lethe (lethe-robust)"``."""
    return f"{method} ({recipe})"


def plan(methods: list[str], scenarios: list[str], tasks: list[str], seeds: list[int],
         recipe: str = PAPER) -> tuple[list[Cell], list[str]]:
    """The runs to make and the combinations skipped (one line each: a method that does not support
    a task kind or scenario). ``methods`` are ``--methods`` tokens (``M`` or ``M@R``,
    :func:`parse_methods`); ``recipe`` is the shared run config's (a plain token's). Unknown names are
    a one-line ``SystemExit`` before any run."""
    from strategies.registry import method_names, method_spec
    from tasks.registry import task_for, task_names

    variants = parse_methods(methods, recipe)
    for flag, names, known in (("--methods", [m for m, _ in variants], method_names()),
                               ("--tasks", tasks, task_names()),
                               ("--scenarios", scenarios, tuple(SCENARIO_NAMES))):
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise SystemExit(f"{flag}: {', '.join(unknown) or 'nothing given'} is not allowed; "
                             f"must be among {', '.join(known)}")
    cells, skipped = [], []
    for task_name in tasks:
        task = task_for(task_name)
        for scenario in scenarios:
            for method, pinned in variants:
                spec = method_spec(method)
                if task.kind not in spec.task_kinds:
                    reason = f"runs on {', '.join(spec.task_kinds)} tasks, not {task.kind}"
                elif scenario not in spec.scenarios or scenario not in task.scenarios:
                    reason = f"does not support the {scenario} scenario"
                else:
                    cells += [Cell(task_name, scenario, seed, method, pinned or recipe, pinned is not None)
                              for seed in seeds]
                    continue
                skipped.append(f"{method_label(method, pinned or recipe)} on {task_name} / {scenario}: {reason}")
    return cells, skipped


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def summarise(cell: Cell, results: dict, folder: str) -> dict:
    """One row from a run's results.json."""
    unlearned, res, cost = results["models"]["unlearned"], results["resurfacing"], results["cost"]["unlearn"]
    failed = list(results.get("validity", {}).get("failed", []))
    return {"task": cell.task, "scenario": cell.scenario, "seed": cell.seed, "method": cell.method,
            "recipe": run_recipe(results["run"]), "status": "ok", "carried_out": carried_out(results),
            **{k: _num(unlearned.get(k)) for k in ACCURACY_METRICS + ("target_rate",)},
            "ct_kr": _num(res.get("ct_kr")), "rr": _num(res.get("rr")),
            "diverged_at_round": res.get("diverged_at_round"),
            "kr_unlearned": _num(res.get("kr_unlearned")), "kr_curve": [_num(v) for v in res.get("kr_curve", [])],
            "seconds": _num(cost.get("seconds")), "bytes": int(cost["bytes_up"] + cost["bytes_down"]),
            "rounds": int(cost.get("rounds", 0)), "flags": failed,
            "reasons": list(results.get("validity", {}).get("reasons", [])), "error": "", "folder": folder,
            "own_original": results["run"].get("own_original"),
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


def cell_config(cell: Cell, shared: dict) -> dict:
    """The run config of one cell: the shared one (``--run-config`` and the folders) with the cell's
    task, scenario, seed and method, and its token's recipe (:func:`with_recipe`)."""
    return with_recipe({**shared, "task": cell.task, "scenario": cell.scenario, "seed": cell.seed,
                        "method": cell.method}, cell.recipe if cell.pinned else None)


def check_configs(cells: list[Cell], shared: dict, clients: int) -> None:
    """Every cell's run config through ``strategies.run_config.parse_config`` before any run, as each run would
    check it: the first error is a one-line ``SystemExit`` naming the ``--run-config`` and the token."""
    from core.config import ConfigError
    from strategies.run_config import parse_config

    seen = set()
    for cell in cells:
        config = cell_config(cell, shared)
        key = json.dumps(config, sort_keys=True, default=str)
        if key in seen:
            continue
        seen.add(key)
        try:
            parse_config(config, clients)
        except ConfigError as err:
            token = cell.method + (f"@{cell.recipe}" if cell.pinned else "")
            raise SystemExit(f"--run-config with --methods {token} on {cell.task} / {cell.scenario} / seed "
                             f"{cell.seed} (--clients {clients}): {err}") from None


class OneLineParser(argparse.ArgumentParser):
    """``argparse`` whose errors are one line on stderr and exit status 2 (no usage block)."""

    def error(self, message: str) -> NoReturn:
        config_error(f"{self.prog}: {message}")


def config_error(message: str) -> NoReturn:
    """A config error as a person reads it: ``error: ...`` in one line on stderr, exit status 2."""
    print("error: " + " ".join(str(message).split()), file=sys.stderr, flush=True)
    raise SystemExit(2)


@contextmanager
def config_errors() -> Iterator[None]:
    """The checks of a benchmark's arguments: a ``SystemExit`` with a message raised in the block (the
    checks' one-line errors) becomes :func:`config_error` (one line on stderr, exit status 2).
    Shared by ``robustness_grid.py``."""
    try:
        yield
    except SystemExit as err:
        if isinstance(err.code, str):
            config_error(err.code)
        raise


def run_cell(cell: Cell, shared: dict, clients: int) -> dict:
    """Run one cell in process; a run that raises becomes a failed row with its one-line error."""
    config = cell_config(cell, shared)
    try:
        folder = run_inprocess(config, clients)
        with open(os.path.join(folder, "results.json"), encoding="utf-8") as handle:
            return summarise(cell, json.load(handle), folder)
    except Exception as err:  # listed as failed; the rest of the matrix still completes
        return {**_failed(cell), "error": " ".join(f"{type(err).__name__}: {err}".split())[:300]}


def _failed(cell: Cell) -> dict:
    """A failed run's row, before its error: what was asked (its recipe as asked; no results tell)."""
    return {"task": cell.task, "scenario": cell.scenario, "seed": cell.seed, "method": cell.method,
            "recipe": cell.recipe, "status": "failed", "carried_out": None, "flags": [], "reasons": []}


def quiet_logs() -> None:
    """Warnings only (Flower logs every round at INFO), so the progress lines stay readable; each
    line once (``setup_logging``)."""
    setup_logging(logging.WARNING)
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
                    on_row(cell, {**_failed(cell), "error": "its worker process ended before running it"}, 0.0)
                return
            pending.discard(cell)
            on_row(cell, row, seconds)
    finally:
        for worker in workers:
            worker.join(timeout=5)
            if worker.is_alive():
                worker.terminate()


def flagged_metrics(row: dict) -> set[str]:
    """The metrics a run's failed validity checks flag: every accuracy and KR entry where its original
    or retrain model failed (``ORIGINAL_CHECKS``), its accuracy entries where its unlearned model lost
    utility. Their numbers are shown, marked; costs are what they cost and carry no mark."""
    flags = set(row.get("flags", []))
    flagged = set()
    if flags & set(ORIGINAL_CHECKS):
        flagged.update(ACCURACY_METRICS + ("target_rate", "ct_kr", "rr"))
    if "unlearned_utility" in flags:
        flagged.update(ACCURACY_METRICS + ("target_rate",))
    return flagged


def marks(row: dict, metric: str) -> tuple[str, ...]:
    """What a run's number for ``metric`` is shown with: ``flagged`` (:func:`flagged_metrics`), ``not
    carried out`` (``method.carried_out`` false: the method reported its own model of a request it did
    not carry out; every number of its unlearning, not what its original cost to pretrain)."""
    return (("flagged",) if metric in flagged_metrics(row) else ()) + \
        (("not carried out",) if row.get("carried_out") is False and metric not in PRETRAINING_METRICS else ())


def _stats(values: list[float], digits: int) -> str:
    text = f"{statistics.mean(values):.{digits}f}"
    return text + (f" ± {statistics.stdev(values):.{digits}f}" if len(values) > 1 else "")


def entry(rows: list[dict], metric: str, scale: float = 1.0, digits: int = 3) -> str:
    """One table entry over the seeds of one (task, scenario, method, recipe): ``mean ± std`` of the
    runs whose number carries no mark, ``(k/n)`` when only k of n seeds gave one; then, beside it, the
    runs with a mark (:func:`marks`) averaged apart and marked (``0.410 (flagged, 1/3)``), never
    mixed into the unmarked mean; where no run gave a number, why none did."""
    if not rows:
        return "—"
    groups: dict[tuple, list[float]] = {}
    blocked = []
    for row in rows:
        if row["status"] != "ok":
            blocked.append("failed")
        elif metric in ("ct_kr", "rr") and row.get("diverged_at_round") is not None:
            blocked.append(f"diverged@{row['diverged_at_round']}")
        elif row.get(metric) is None:
            blocked.append("—")
        else:
            groups.setdefault(marks(row, metric), []).append(row[metric] * scale)
    if not groups:
        return blocked[0] if len(set(blocked)) == 1 else "/".join(sorted(set(blocked)))
    parts = []
    for mark in sorted(groups, key=len):  # the unmarked runs first
        values = groups[mark]
        notes = list(mark) + ([f"{len(values)}/{len(rows)}"] if len(values) < len(rows) else [])
        parts.append(_stats(values, digits) + (f" ({', '.join(notes)})" if notes else ""))
    return "; ".join(parts)


def _recipe(row: dict) -> str:
    return row.get("recipe") or PAPER  # rows written before the recipe column: the paper


def _variant(row: dict) -> tuple[str, str]:
    return row["method"], _recipe(row)


def _group(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Rows by (task, scenario, (method, recipe))."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["task"], row["scenario"], _variant(row)), []).append(row)
    return groups


def _order(rows: list[dict], key: str) -> list[str]:
    return list(dict.fromkeys(row[key] for row in rows))


def _variants(rows: list[dict]) -> list[tuple[str, str]]:
    """The (method, recipe) pairs in the order they first appear."""
    return list(dict.fromkeys(_variant(row) for row in rows))


def _label(rows: list[dict], variant: tuple[str, str]) -> list[str]:
    """A table row's first two cells, method and recipe; ``*`` after the method when it started from
    its own original, not the shared one."""
    own = any(_variant(r) == variant and r.get("own_original") for r in rows)
    return [variant[0] + (" *" if own else ""), variant[1]]


def fedup_tables(rows: list[dict]) -> str:
    """FedUP's Table 3 (R-A, F-A, MIA per scenario) and Table 4 (time, communication per scenario)."""
    groups, scenarios, variants = _group(rows), _order(rows, "scenario"), _variants(rows)
    parts = []
    for title, columns in (("Table 3 layout (FedUP): retain accuracy R-A, forget accuracy F-A, MIA",
                            (("R-A", "retain_acc", 1.0, 3), ("F-A", "forget_acc", 1.0, 3), ("MIA", "mia", 1.0, 3))),
                           ("Table 4 layout (FedUP): unlearning time and communication",
                            (("time (s)", "seconds", 1.0, 1), ("comm. (MB)", "bytes", 1e-6, 2)))):
        for task in _order(rows, "task"):
            header = ["method", "recipe"] + [f"{SCENARIO_NAMES[s]} {c[0]}" for s in scenarios for c in columns]
            lines = [f"### {title} — {task}", "", "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            for variant in variants:
                cells = [entry(groups.get((task, s, variant), []), m, scale, d)
                         for s in scenarios for _, m, scale, d in columns]
                lines.append("| " + " | ".join(_label(rows, variant) + cells) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def lethe_tables(rows: list[dict]) -> str:
    """Lethe's Tables III-V: one table per scenario, MU, U-KR, CT-KR, RR (%), communication."""
    groups, variants = _group(rows), _variants(rows)
    columns = (("MU", "test_acc", 1.0, 3), ("U-KR", "forget_acc", 1.0, 3), ("CT-KR", "ct_kr", 1.0, 3),
               ("RR (%)", "rr", 1.0, 1), ("comm. (MB)", "bytes", 1e-6, 2))
    parts = []
    for number, scenario in zip(("III", "IV", "V"), ("client", "class", "sample")):
        if scenario not in _order(rows, "scenario"):
            continue
        for task in _order(rows, "task"):
            header = ["method", "recipe"] + [c[0] for c in columns]
            lines = [f"### Table {number} layout (Lethe): {scenario} unlearning — {task}", "",
                     "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
            for variant in variants:
                group = groups.get((task, scenario, variant), [])
                if group:
                    lines.append("| " + " | ".join(_label(rows, variant) + [entry(group, m, s, d)
                                                                            for _, m, s, d in columns]) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts)


def _short(method: str, recipe: str) -> str:
    """A method in a list of methods (the pretraining table): ``"lethe"`` for the paper (its heading
    says so), ``"lethe (lethe-robust)"`` under a recipe."""
    return method if recipe == PAPER else method_label(method, recipe)


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
        lines = [f"### Pretraining: what each original cost — {task} (a method named without a recipe: its paper)",
                 "",
                 "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
        for scenario in _order(rows, "scenario"):
            shared = [v for v in _variants(rows) if groups.get((task, scenario, v))
                      and not any(r.get("own_original") for r in groups[(task, scenario, v)])]
            own = [v for v in _variants(rows) if groups.get((task, scenario, v))
                   and any(r.get("own_original") for r in groups[(task, scenario, v)])]
            plain = [v for v in shared if not any(r.get("history_bytes") for r in groups[(task, scenario, v)])]
            history = [v for v in shared if v not in plain]
            named = ([(f"shared ({', '.join(_short(*v) for v in shared)})", plain[0])] if plain else []) + \
                [(f"{_short(*v)} (shared, with its history)", v) for v in history] + \
                [(f"{_short(*v)} *", v) for v in own]
            for label, variant in named:
                group = groups[(task, scenario, variant)]
                lines.append("| " + " | ".join([label, scenario] + [entry(group, m, sc, d) for _, m, sc, d in columns])
                             + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def problems(rows: list[dict], skipped: list[str]) -> str:
    """The failed runs, the flagged ones, those whose method did not carry the request out and the
    skipped combinations, one line each."""
    lines = []
    for row in rows:
        where = f"{method_label(*_variant(row))} on {row['task']} / {row['scenario']} / seed {row['seed']}"
        if row["status"] != "ok":
            lines.append(f"- failed: {where}: {row['error']}")
        elif row.get("reasons"):
            lines.append(f"- flagged: {where}: {'; '.join(row['reasons'])}")
        if row.get("carried_out") is False:
            lines.append(f"- not carried out: {where}: the method reported its own model of a request it did not "
                         "carry out (its numbers are marked)")
    lines += [f"- skipped: {line}" for line in skipped]
    return "\n".join(lines) if lines else "none"


def curves_figure(rows: list[dict]):
    """Lethe's Fig. 4: forget accuracy over continued rounds, one line per method and recipe (the
    legend names both, ``lethe (lethe-robust)``), one panel per task and scenario (mean over the seeds;
    a diverged curve ends where it diverged). Each method keeps its colour and line style of every plot
    (``tasks.plot_style``); the seeds that are flagged or not carried out are averaged apart, drawn
    dashed and named so in the legend (``lethe (paper) — flagged 1/3``). Each panel's legend sits right
    of it; the x axis has whole rounds only."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from strategies.registry import method_styles
    from tasks.plot_style import legend_outside, line_style, overlap_style, whole_rounds

    styles = method_styles()

    groups = _group([r for r in rows if r["status"] == "ok"])
    panels = list(dict.fromkeys((t, s) for t, s, _ in groups))
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(6.4 * max(1, len(panels)), 3.8), squeeze=False,
                             layout="constrained")
    for ax, (task, scenario) in zip(axes[0], panels):
        drawn, longest = 0, 1
        for (t, s, variant), group in groups.items():
            if (t, s) != (task, scenario):
                continue
            apart: dict[tuple, list[dict]] = {}  # the unmarked seeds, then each mark's, never averaged together
            for r in group:
                mark = (("flagged",) if r.get("flags") else ()) + \
                    (("not carried out",) if r.get("carried_out") is False else ())
                apart.setdefault(mark, []).append(r)
            for mark in sorted(apart, key=len):
                curves = [[r["kr_unlearned"]] + r["kr_curve"] for r in apart[mark] if r.get("kr_unlearned") is not None]
                length = min((len(c) for c in curves), default=0)
                if not length:
                    continue
                mean = [statistics.mean(c[i] for c in curves) for i in range(length)]
                part = len(apart[mark]) < len(group)
                note = "" if not mark else \
                    f" — {', '.join(mark)}" + (f" {len(apart[mark])}/{len(group)}" if part else "")
                ax.plot(range(length), mean, label=method_label(*variant) + note,
                        **{**line_style(variant[0], variant[1], bool(mark), styles), **overlap_style(drawn)})
                drawn, longest = drawn + 1, max(longest, length)
        whole_rounds(ax, longest)
        ax.set_title(f"{task} / {scenario} unlearning", fontsize=9)
        ax.set_xlabel("continued-training round (0 = right after unlearning)")
        ax.set_ylabel("forget accuracy (KR), mean over seeds")
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.25)
        if drawn:
            legend_outside(ax, fontsize=7)
    fig.suptitle("Knowledge resurfacing: forget accuracy during continued training on retained data "
                 "(dashed: flagged or not carried out)", fontsize=10)
    return fig


def plot_curves(rows: list[dict], path: str) -> None:
    """:func:`curves_figure` as a PNG at ``path``."""
    from matplotlib import pyplot as plt

    fig = curves_figure(rows)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)


def _key(task: str, scenario: str, seed: int, method: str, recipe: str) -> tuple:
    return task, scenario, seed, method, recipe


def _overrides_of(text) -> dict | None:
    """A row's recorded ``--run-config`` (``overrides``) as a dict; None where it is missing or unreadable."""
    try:
        return parse_overrides(text) if isinstance(text, str) else None
    except ValueError:
        return None


def finished_rows(out: str, clients: int, overrides: str) -> dict[tuple, dict]:
    """The successful rows of an earlier call into ``out``, by (task, scenario, seed, method, recipe)
    (:func:`_key`). Every row records the ``--clients`` and ``--run-config`` (``overrides``) it was run
    with; a ``runs.json`` that is not readable JSON rows (truncated, edited) or that holds a row made
    with other ``--clients`` or another ``--run-config`` (compared as parsed: the same keys and values)
    is a one-line ``SystemExit`` naming what differs — never a traceback, never rows silently
    replaced by runs made with other settings."""
    path = os.path.join(out, "runs.json")
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            rows = json.load(handle)
    except (OSError, ValueError) as err:  # json.JSONDecodeError, UnicodeDecodeError: ValueErrors
        raise SystemExit(f"--resume: {path} is not readable JSON ({err}); repair or remove it, or leave "
                         "--resume out to start again") from None
    fields = ("task", "scenario", "seed", "method", "status")
    if not isinstance(rows, list) or not all(isinstance(r, dict) and all(k in r for k in fields) for r in rows):
        raise SystemExit(f"--resume: {path} is not a list of runs as this runner writes them (each with "
                         f"{', '.join(fields)}); repair or remove it, or leave --resume out to start again")
    differ = []
    other_clients = [c for c in dict.fromkeys(r.get("clients") for r in rows) if c != clients]
    if other_clients:
        differ.append(f"--clients {', '.join(map(str, other_clients))} there, {clients} here")
    wanted = parse_overrides(overrides)
    for text in dict.fromkeys(r.get("overrides") for r in rows):
        there = _overrides_of(text)
        if there == wanted:
            continue
        keys = sorted(k for k in set(there or {}) | set(wanted) if (there or {}).get(k, ...) != wanted.get(k, ...))
        differ.append(f"--run-config {text!r} there, {overrides!r} here"
                      + (f" ({', '.join(keys)} differ)" if there is not None and keys else ""))
    if differ:
        raise SystemExit(f"--resume: {path} was made with other settings: {'; '.join(differ)}; resume with "
                         "the same ones, or use another --out")
    return {_key(r["task"], r["scenario"], r["seed"], r["method"], _recipe(r)): r for r in rows
            if r["status"] == "ok"}


def _cell_key(cell: Cell) -> tuple:
    return _key(cell.task, cell.scenario, cell.seed, cell.method, cell.recipe)


def write_rows(out: str, rows: list[dict]) -> None:
    write_text(os.path.join(out, "runs.json"), json.dumps(rows, indent=1, default=str))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=ROW_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow({**row, "recipe": _recipe(row), "flags": ";".join(row.get("flags", [])),
                         "carried_out": {True: "true", False: "false"}.get(row.get("carried_out"), "")})
    write_text(os.path.join(out, "runs.csv"), buffer.getvalue())


def report(rows: list[dict], skipped: list[str], clients: int, overrides: str, jobs: int) -> str:
    return "\n\n".join([
        "# Method comparison",
        f"In-process runs (`server_app.inprocess`, clients sequential, no Ray; {jobs} job(s) side by side), "
        f"{clients} clients, shared overrides: `{overrides or 'none'}`. Entries are mean ± std over the seeds; "
        "`(k/n)`: only k of n seeds gave a number; `recipe`: the project's named settings the method ran "
        "with (`paper`: none, the method's paper); `(flagged)`: a validity check failed (reasons below), "
        "`(not carried out)`: the method did not carry the request out and reported its own model — "
        "such runs are averaged apart, beside the others; `*`: the method trains its own original model (its "
        "`run.own_original` in results.json), not the shared one the other rows start from.",
        fedup_tables(rows), lethe_tables(rows), pretraining_table(rows),
        "## Failed, flagged, not carried out and skipped", problems(rows, skipped)]) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="none,retrain,fedup,lethe",
                        help="comma-separated METHOD or METHOD@RECIPE tokens: lethe@lethe-robust runs lethe with "
                             "recipe='lethe-robust' beside a plain lethe (its paper)")
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
    with config_errors():  # every config error: one line on stderr, exit status 2, before any run
        try:
            seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            raise SystemExit(f"--seeds: {args.seeds!r} must be comma-separated integers") from None
        if args.clients < 2:
            raise SystemExit(f"--clients: {args.clients} must be >= 2")
        if not 1 <= args.jobs <= (os.cpu_count() or 1):
            raise SystemExit(f"--jobs: {args.jobs} must be in 1..{os.cpu_count()} (this machine's cores)")
        try:
            overrides = parse_overrides(args.run_config)
        except ValueError as err:
            raise SystemExit(f"--run-config: {args.run_config!r} is not 'key=value ...' in TOML syntax: {err}") \
                from None
        cells, skipped = plan(args.methods.split(","), args.scenarios.split(","), args.tasks.split(","), seeds,
                              recipe=str(overrides.get("recipe") or PAPER))
        shared = {"cache-dir": os.path.join(args.out, "cache"), "outputs-dir": os.path.join(args.out, "runs"),
                  **overrides}
        check_configs(cells, shared, args.clients)
        problem = folder_problem(args.out)  # creates it: only once the rest is known good
        if problem:
            raise SystemExit(f"--out: {problem}")
        done = finished_rows(args.out, args.clients, args.run_config) if args.resume else {}
    quiet_logs()
    rows: dict[Cell, dict] = {cell: done[_cell_key(cell)] for cell in cells if _cell_key(cell) in done}
    kept_cells = set(rows)
    kept = len(rows)
    started = time.perf_counter()

    def on_row(cell: Cell, row: dict, seconds: float) -> None:
        rows[cell] = {**row, "clients": args.clients, "overrides": args.run_config}
        write_rows(args.out, [rows[c] for c in cells if c in rows])
        elapsed, finished = time.perf_counter() - started, len(rows) - kept
        left = len(cells) - len(rows)
        print(f"[{len(rows)}/{len(cells)}] {method_label(cell.method, cell.recipe)} on {cell.task} / "
              f"{cell.scenario} / seed {cell.seed}: "
              f"{row['status']} in {seconds:.0f}s; elapsed {elapsed / 60:.1f} min, about "
              f"{elapsed / finished * left / 60:.1f} min left", flush=True)

    run_matrix([c for c in cells if c not in rows], shared, args.clients, args.jobs, on_row)
    ran = [rows[c] for c in cells if c not in kept_cells]
    rows = [rows[c] for c in cells]
    text = report(rows, skipped, args.clients, args.run_config, args.jobs)
    write_text(os.path.join(args.out, "tables.md"), text)
    plot_curves(rows, os.path.join(args.out, "kr_curves.png"))
    print(text)
    print(f"tables, plot and rows in {args.out}")
    if ran and all(row["status"] != "ok" for row in ran):
        print(f"error: every run failed ({len(ran)} of {len(ran)}); their errors are listed in "
              f"{os.path.join(args.out, 'tables.md')}", file=sys.stderr, flush=True)
        raise SystemExit(1)
    return args.out


if __name__ == "__main__":
    main()
