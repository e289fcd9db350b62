"""Robustness grid: methods x scenarios x report seeds x federation shapes, each cell judged against
its bar, with the run's validity flags.

One cell = (seed, shape, scenario); every method of a cell runs through the real phases in process
(``server_app.inprocess``) with one shared cache, so the original and retrain models are built once
per cell and every method starts from the same original. The client scenario uses
``poison='backdoor'``. Bars (a cell whose original fails validity is flagged and judged by none):

- Lethe: test accuracy within 0.03 of retrain's in every valid cell; U-KR and CT-KR within 0.05 of
  retrain's in at least 80 % of the valid cells.
- FedUP (class scenario): forget accuracy <= 0.02 with retain accuracy within 0.02 of retrain's in
  every valid cell.
- No run may crash the grid (a failing run is reported with its one-line error and the grid goes
  on), and no non-finite model is shown as a number (continued training that diverged shows its
  round, CT-KR and RR are not printed).

"Within" is read as written, on both sides: a method that keeps 0.10 *more* test accuracy than the
retrain oracle is as far from it as one that keeps 0.10 less (``holds``). A utility bar can also be
read one-sided, "not more than the tolerance below retrain" (nothing destroyed); that reading is
kept beside it in ``no_worse``, the totals count both, and a miss says ``above`` or ``below``, so a
table never mixes the two readings. ``d_orig`` (the cell's original test accuracy minus retrain's)
says where every method starts: the totals count the valid cells where the original itself lies
outside Lethe's test tolerance, and Lethe's misses in and out of them.

``--retrain-draws K`` (K >= 2) measures how far the reference itself moves: each cell also runs the
retrain oracle K - 1 more times from other initial weights (``init-seed``; same data, partition and
request), as rows ``retrain@init<S>``, and judges each draw by Lethe's bars against the grid's
retrain. The totals count how often exact unlearning, drawn again, meets them (and, in class cells,
FedUP's retain tolerance), and how often the draw's own original stays within Lethe's test tolerance
of the grid's original: a bar that retrain itself misses in a cell is met or missed there by the
draw, not by the method. A last line reads Lethe against the band the draws span (within the test
tolerance of the grid's retrain or of any draw); it is a reading beside the bar, not the bar. Then,
per federation shape and in the same cells, how often the draws meet a bar read on both sides beside
how often the method does (Lethe's test bar, FedUP's class bar).

Beside every miss the ``context`` column states what the cell shows around it, as facts, not as a
verdict (``miss_context``): where the cell's original itself lies outside the test tolerance, what
the retrain draws read (and whether they miss on the same side), the classes the leaving client
holds and the test accuracy on each of them beside retrain's (``held_test``) and on the other classes
(``outside_held``), or the KR figures; the totals count Lethe's test misses by these facts, and those with none
of them.

What ran: ``--methods`` takes the tokens of ``compare_methods.py`` (one parser): ``M`` runs method M
as the shared run config says (its paper unless ``--run-config`` selects a recipe), ``M@R`` runs M
with ``recipe='R'``; ``--methods retrain,lethe,lethe@lethe-robust`` puts Lethe's paper and the
lethe-robust recipe side by side in every cell. The ``recipe`` column names each row's (``paper``:
none; read from ``run.recipe``, absent in older results and CSVs: ``paper``), every bar applies to
every recipe of its method alike, and the totals are given per method and recipe (``Lethe (paper)``,
``Lethe (lethe-robust)``). ``carried_out`` is ``NO`` where the method did not carry the request out
(``method.carried_out`` false: it reported its own model), and the bar says so; it is judged as it
is. A flagged row (its original invalid) is judged by no bar and counted in no total, but its
figures are shown: in the table marked ``(flagged)``, in the CSV beside its ``validity`` flags.

The report seeds default to 285-289: seeds no default was chosen on (tuning uses others). The Markdown table
goes to stdout as cells finish; ``--out`` receives ``<out>.csv`` and ``<out>.json``, rewritten after
every cell, so a partial run is usable.

    python benchmarks/robustness_grid.py --seeds 285,286,287,288,289 --shapes 10:0.5,7:0.1 \\
        --methods retrain,fedup,lethe --scenarios client,class,sample --retrain-draws 2 --out /tmp/grid

    # Lethe's paper and the lethe-robust recipe, judged by the same bars in the same cells
    python benchmarks/robustness_grid.py --methods retrain,lethe,lethe@lethe-robust --out /tmp/grid-recipe
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one's
sys.path.insert(0, str(Path(__file__).resolve().parent))  # compare_methods.py beside it (its --methods parser)

from compare_methods import (  # noqa: E402
    PAPER,
    OneLineParser,
    config_errors,
    parse_methods,
    with_recipe,
)

from core.files import write_text  # noqa: E402
from server_app.inprocess import parse_overrides, run_inprocess, setup_logging  # noqa: E402
from server_app.report import carried_out, run_recipe  # noqa: E402
from tasks.validity import ORIGINAL_CHECKS  # noqa: E402

LETHE_TEST_TOL, LETHE_KR_TOL, LETHE_KR_SHARE = 0.03, 0.05, 0.8
FEDUP_FORGET_MAX, FEDUP_RETAIN_TOL = 0.02, 0.02
HELD_SHARE = 0.8
DRAW = "retrain@init"  # method label prefix of a retrain draw from other initial weights
# The grid's own run config, under --run-config: 60 local epochs of continued training at digits' one
# epoch a round. --run-config adds to it key by key, so a probe that sets other keys keeps these.
GRID_RUN_CONFIG = {"continue-rounds": 60}
COLUMNS = ("seed", "clients", "alpha", "scenario", "method", "recipe", "carried_out", "validity", "test_acc", "d_test",
           "d_orig", "orig_test", "u_kr", "ct_kr", "rr", "forget_acc", "retain_acc", "bar", "holds", "no_worse",
           "leaving_holds", "held_test", "outside_held", "context", "error")


def parse_shapes(text: str) -> list[tuple[int, float]]:
    """``"10:0.5,7:0.1"`` -> ``[(10, 0.5), (7, 0.1)]`` (clients : Dirichlet alpha)."""
    shapes = []
    for item in text.split(","):
        clients, sep, alpha = item.partition(":")
        try:
            shape = (int(clients), float(alpha))
        except ValueError:
            shape = None
        if not sep or shape is None or shape[0] < 2 or not shape[1] > 0:
            raise SystemExit(f"--shapes: {item!r} is not CLIENTS:ALPHA with CLIENTS >= 2 and ALPHA > 0")
        shapes.append(shape)
    return shapes


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def leaving_holds(config: dict, clients: int) -> str:
    """Client scenario: the classes of which the leaving client holds at least ``HELD_SHARE`` of the
    training pool, as ``class:share`` (e.g. ``"1:0.91 3:0.99"``; ``""`` for none).

    The retrain oracle never sees most of those classes, so its test accuracy falls below the
    original's by about their share of the test set while its retain accuracy stays high: a method
    that removes only the poisoned behaviour and keeps the client's clean classes lands *above*
    retrain. The column says when a cell is of that kind; it flags nothing."""
    from strategies.run_config import parse_config
    from tasks.partition import dirichlet_partitions
    from tasks.requests import resolve_forget_client

    cfg = parse_config({**config, "scenario": "client"}, num_clients=clients)
    labels = cfg.task.load_images(cfg["data-dir"], cfg["download"]).y.numpy()
    leaving = dirichlet_partitions(labels, clients, cfg["dirichlet-alpha"], cfg["seed"])[
        resolve_forget_client(cfg, labels, clients)]
    share = np.bincount(labels[leaving], minlength=labels.max() + 1) / np.bincount(labels, minlength=labels.max() + 1)
    return " ".join(f"{c}:{share[c]:.2f}" for c in np.flatnonzero(share >= HELD_SHARE))


def held_test(by_class: list | None, held: str | None) -> str:
    """The unlearned model's test accuracy on each class ``held`` names (``leaving_holds``), as
    ``class:accuracy`` (``""`` where the cell names none or the run kept no per-class figures): beside
    retrain's, it shows whether a method gave up a class the leaving client held nearly alone more, or
    less, than exact unlearning does."""
    if not held or not by_class:
        return ""
    classes = [int(item.split(":")[0]) for item in held.split()]
    return " ".join(f"{c}:{_fmt(_num(by_class[c]) if c < len(by_class) else None)}" for c in classes)


def test_class_counts(config: dict, clients: int) -> list[int]:
    """Client scenario: the test samples per class of the pooled local test splits (what ``test_acc``
    is measured on), so that :func:`outside_held` can take the held classes out of it."""
    from strategies.run_config import parse_config
    from tasks.requests import build_client_data

    cfg = parse_config({**config, "scenario": "client"}, num_clients=clients)
    images = cfg.task.load_images(cfg["data-dir"], cfg["download"])
    counts = np.zeros(int(images.y.max()) + 1, dtype=np.int64)
    for partition in range(clients):
        counts += np.bincount(build_client_data(cfg, images, partition, clients).test_y.numpy(), minlength=len(counts))
    return counts.tolist()


def outside_held(test_acc: float | None, held: str | None, counts: list[int] | None) -> float | None:
    """Test accuracy on every class ``held`` (a ``held_test`` string) does not name: ``test_acc`` with
    those classes' samples (``counts``, :func:`test_class_counts`) taken out. Beside retrain's, it says
    whether a test miss lies in the leaving client's classes alone."""
    pairs = [item.split(":") for item in (held or "").split()]
    if test_acc is None or not pairs or not counts or any(_parse(acc) is None for _, acc in pairs):
        return None
    taken = sum(counts[int(c)] for c, _ in pairs)
    if taken >= sum(counts):
        return None
    return (test_acc * sum(counts) - sum(float(acc) * counts[int(c)] for c, acc in pairs)) / (sum(counts) - taken)


def summarise(results: dict) -> dict:
    """The figures a bar reads from one run's results.json (``None`` where not a finite number)."""
    unlearned, res = results["models"]["unlearned"], results["resurfacing"]
    return {"orig_test": _num(results["models"].get("original", {}).get("test_acc")),
            "test_acc": _num(unlearned.get("test_acc")), "u_kr": _num(unlearned.get("forget_acc")),
            "forget_acc": _num(unlearned.get("forget_acc")), "retain_acc": _num(unlearned.get("retain_acc")),
            "ct_kr": _num(res.get("ct_kr")), "rr": _num(res.get("rr")), "diverged_at_round": res.get("diverged_at_round"),
            "kr_retrain": _num(res.get("kr_retrain")), "test_by_class": unlearned.get("test_acc_by_class"),
            "recipe": run_recipe(results.get("run") or {}), "carried_out": carried_out(results)}


OWN_PREFIXES = ("draw:", "own:")  # a row's own original's failed checks (``run_cell`` says when)


def _own_flagged(flags) -> bool:
    """Whether a row's own original (a retrain draw's, or that of a method that trains its own) or a
    draw's oracle failed a validity check (``draw:<check>``, ``own:<check>``)."""
    return any(f.startswith(OWN_PREFIXES) for f in flags)


def _own_prefix(method: str, results: dict) -> str | None:
    """How a row shows its own original's failed checks: ``draw:`` for a retrain draw, ``own:`` for a
    method that trains its own original (``run.own_original`` in results.json: FedAU, Exact-Fun,
    ...); ``None`` where the row starts from the cell's shared original, whose checks are the cell's."""
    if method.startswith(DRAW):
        return "draw:"
    return "own:" if results.get("run", {}).get("own_original") else None


def draw_seed(seed: int, draw: int) -> int:
    """``init-seed`` of the cell's retrain draw number ``draw`` (1, 2, ...)."""
    return (seed + 1000 * draw) % 2**32


def _side(mine: float | None, theirs: float | None, tol: float) -> str | None:
    """``above`` / ``below`` where ``mine`` lies more than ``tol`` from ``theirs``, else ``None``."""
    if mine is None or theirs is None or abs(mine - theirs) <= tol:
        return None
    return "above" if mine > theirs else "below"


def judge(method: str, scenario: str, row: dict, ref: dict | None) -> tuple[str, bool | None]:
    """``(bar, holds)`` of one method in one valid cell (``holds`` None: no bar, or not measurable).

    ``method`` is the method alone: every recipe of a method is held to that method's bars. Lethe's
    KR items are judged per cell here and counted against the 80 % share at the end; a retrain draw
    is judged by Lethe's bars. A row whose method did not carry the request out (``carried_out``
    False) is judged as it is, and its bar says so."""
    bar, holds = _bar(method, scenario, row, ref)
    return (bar + " (not carried out)" if row.get("carried_out") is False else bar), holds


def _bar(method: str, scenario: str, row: dict, ref: dict | None) -> tuple[str, bool | None]:
    """:func:`judge` before its not-carried-out note."""
    if ref is None or method == "retrain":
        return ("reference" if method == "retrain" else "no retrain reference"), None
    mine = {k: _num(row.get(k)) for k in ("test_acc", "u_kr", "ct_kr", "forget_acc", "retain_acc")}
    theirs = {k: _num(ref.get(k)) for k in ("test_acc", "u_kr", "ct_kr", "retain_acc")}

    def near(key: str, tol: float) -> bool:
        return mine[key] is not None and theirs[key] is not None and abs(mine[key] - theirs[key]) <= tol

    def utility(key: str, tol: float) -> str:
        """``ok``, ``above`` or ``below``: where ``key`` lies against retrain's, ``tol`` either side;
        sets ``row["no_worse"]`` (the one-sided reading)."""
        if mine[key] is None or theirs[key] is None:
            row["no_worse"] = False
            return "unmeasured"
        row["no_worse"] = mine[key] >= theirs[key] - tol
        return _side(mine[key], theirs[key], tol) or "ok"

    if method == "lethe" or method.startswith(DRAW):
        test = utility("test_acc", LETHE_TEST_TOL)
        row["kr_ok"] = near("u_kr", LETHE_KR_TOL) and near("ct_kr", LETHE_KR_TOL)
        return (f"test+-{LETHE_TEST_TOL}:{test if test == 'ok' else 'MISS ' + test} "
                f"U/CT-KR+-{LETHE_KR_TOL}:{'ok' if row['kr_ok'] else 'miss'}"), test == "ok"
    if method == "fedup" and scenario == "class":
        forgets = mine["forget_acc"] is not None and mine["forget_acc"] <= FEDUP_FORGET_MAX
        retain = utility("retain_acc", FEDUP_RETAIN_TOL)
        row["no_worse"] = forgets and row["no_worse"]
        return (f"forget<={FEDUP_FORGET_MAX}:{'ok' if forgets else 'MISS'} "
                f"retain+-{FEDUP_RETAIN_TOL}:{retain if retain == 'ok' else 'MISS ' + retain}"), forgets and retain == "ok"
    return "no bar", None


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def _markdown(row: dict) -> str:
    """One table line; a flagged row's figures (kept as ``<column>_raw``, judged by no bar) are shown,
    marked ``(flagged)``."""
    cells = [f"{_fmt(row[c + '_raw'])} (flagged)" if row.get(c) is None and row.get(c + "_raw") not in (None, "")
             else _fmt(row.get(c)) for c in COLUMNS]
    return "| " + " | ".join(cells) + " |"


def _set_d_test(row: dict, ref: dict | None) -> None:
    """``row["d_test"]``: its test accuracy minus retrain's, and ``row["d_orig"]``: the cell's original
    model's test accuracy minus retrain's, where both are numbers.

    ``d_orig`` is where every method starts: a method that keeps the original's utility lands near
    it, so where ``|d_orig|`` passes a test bar's tolerance, such a method misses that bar read on
    both sides whatever it does to the forget knowledge."""
    if ref is None or _num(ref.get("test_acc")) is None:
        return
    if _num(row.get("test_acc")) is not None:
        row["d_test"] = row["test_acc"] - ref["test_acc"]
    if _num(row.get("orig_test")) is not None:
        row["d_orig"] = row["orig_test"] - ref["test_acc"]


# miss_context's kinds, as the totals name them
MISS_FACTS = (("original", "original outside the tolerance"), ("draw", "a retrain draw misses on the same side"),
              ("leaving", "the leaving client holds most of a class"),
              ("held_only", "within the tolerance outside those classes"))


def miss_context(row: dict, cell: list[dict]) -> tuple[str, set[str]]:
    """What the cell shows around one row's miss of a bar (test, KR or retain), as facts (``""`` where
    the row meets its bars or has none), and which of ``MISS_FACTS`` they include:

    - ``original +0.072``: the cell's original is that far from retrain's test accuracy, beyond
      Lethe's tolerance (a method that keeps the original's utility lands near it);
    - ``moved +0.035 from its original``: the row's test accuracy against the original's;
    - ``draw 0.917 also above`` / ``draw 0.957``: the retrain draws' figure on the missed bar (test
      accuracy; retain accuracy for FedUP's), and whether a draw misses on the same side;
    - ``leaving client holds 7:0.99``: client scenario, the classes retrain barely sees; for a test
      miss then also ``test on those classes 7:0.000 against retrain's 7:0.650`` (``held_test``) and
      ``outside those classes 0.951 against retrain's 0.957`` (``outside_held``; kind ``held_only``
      where that difference is within the tolerance: the miss lies in those classes alone);
    - ``U-KR / CT-KR 0.000 / 0.126 against 0.014 / 0.014``: a KR miss."""
    missed = row.get("holds") is False or row.get("kr_ok") is False
    if not missed or "error" in row or row.get("bar", "").startswith(("flagged", "no ")):
        return "", set()
    ref = next((r for r in cell if r["method"] == "retrain"), None)
    draws = [r for r in cell if r["method"].startswith(DRAW) and r is not row and r.get("holds") is not None]
    key, tol = ("retain_acc", FEDUP_RETAIN_TOL) if row["method"] == "fedup" else ("test_acc", LETHE_TEST_TOL)
    side = _side(_num(row.get(key)), _num((ref or {}).get(key)), tol)
    facts, kinds = [], set()
    if side:
        d_orig, test, orig = _num(row.get("d_orig")), _num(row.get("test_acc")), _num(row.get("orig_test"))
        if key == "test_acc" and d_orig is not None and abs(d_orig) > LETHE_TEST_TOL:
            facts.append(f"original {d_orig:+.3f}")
            kinds.add("original")
        if key == "test_acc" and test is not None and orig is not None:
            facts.append(f"moved {test - orig:+.3f} from its original")
        for draw in draws:
            value = _num(draw.get(key))
            if value is not None:
                same = _side(value, _num(ref.get(key)), tol) == side
                facts.append(f"draw {value:.3f}{' also ' + side if same else ''}")
                if same:
                    kinds.add("draw")
        if row.get("leaving_holds"):
            facts.append(f"leaving client holds {row['leaving_holds']}")
            kinds.add("leaving")
            if key == "test_acc" and row.get("held_test") and (ref or {}).get("held_test"):
                facts.append(f"test on those classes {row['held_test']} against retrain's {ref['held_test']}")
            mine, theirs = _num(row.get("outside_held")), _num((ref or {}).get("outside_held"))
            if key == "test_acc" and mine is not None and theirs is not None:
                facts.append(f"outside those classes {mine:.3f} against retrain's {theirs:.3f}")
                if _side(mine, theirs, tol) is None:
                    kinds.add("held_only")
    if row["method"] != "fedup" and row.get("kr_ok") is False and ref is not None:
        facts.append(f"U-KR / CT-KR {_fmt(_num(row.get('u_kr')))} / {_fmt(_num(row.get('ct_kr')))} against "
                     f"{_fmt(_num(ref.get('u_kr')))} / {_fmt(_num(ref.get('ct_kr')))}")
    if row["method"] == "fedup" and (_num(row.get("forget_acc")) or 0.0) > FEDUP_FORGET_MAX:
        facts.append(f"forget {row['forget_acc']:.3f}")
    return "; ".join(facts), kinds


def _set_context(cell: list[dict]) -> None:
    """``row["context"]`` and ``row["miss_kinds"]`` of every row of one cell (``miss_context``)."""
    for row in cell:
        text, kinds = miss_context(row, cell)
        row["context"], row["miss_kinds"] = text, sorted(kinds)


def run_cell(seed: int, clients: int, alpha: float, scenario: str, methods: list[str], shared: dict,
             retrain_draws: int = 1) -> list[dict]:
    """Every method of one cell (``methods``: ``--methods`` tokens, ``M`` or ``M@R``, parsed by
    ``compare_methods.parse_methods``), then the retrain draws after the first (``retrain_draws``,
    when retrain runs); a row's ``method`` is the method alone and its ``recipe`` what ran
    (``run.recipe``; as asked where the run failed: the token's, else the shared run config's, else
    ``paper``); rows carry the validity flags of the cell's shared original, and a row with an
    original of its own (a draw; a method such as FedAU that trains its own) also that original's
    failed checks as ``draw:<check>`` / ``own:<check>``, which flag that row alone."""
    base = {**shared, "seed": seed, "dirichlet-alpha": alpha, "scenario": scenario}
    default = str(shared.get("recipe") or PAPER)
    runs = [(method, recipe, {"method": method}) for method, recipe in parse_methods(methods, default)]
    if "retrain" in methods:
        runs += [(f"{DRAW}{draw_seed(seed, d)}", None, {"method": "retrain", "init-seed": draw_seed(seed, d)})
                 for d in range(1, retrain_draws)]
    rows, validity, own_validity, ref = [], None, None, None
    for method, recipe, overrides in runs:
        row = {"seed": seed, "clients": clients, "alpha": alpha, "scenario": scenario, "method": method,
               "recipe": recipe or default}
        started = time.perf_counter()
        try:
            folder = run_inprocess(with_recipe({**base, **overrides}, recipe), clients)
            with open(os.path.join(folder, "results.json"), encoding="utf-8") as handle:
                results = json.load(handle)
            row.update(summarise(results), folder=folder)
            row["own_prefix"] = _own_prefix(method, results)
            if row["own_prefix"] is None:  # the cell's flags come from the shared original
                validity = validity or results.get("validity")
            else:  # ... unless no row starts from it
                own_validity = own_validity or results.get("validity")
            row["validity_failed"] = results.get("validity", {}).get("failed", [])
            if method == "retrain" and ref is None:  # the first retrain (``retrain`` runs first: the plain token)
                ref = row
        except Exception as err:  # a failing run is reported in one line and the grid goes on
            row["error"] = " ".join(f"{type(err).__name__}: {err}".split())[:300]
        row["seconds"] = round(time.perf_counter() - started, 1)
        rows.append(row)
    validity = validity or own_validity
    valid = bool(validity and validity.get("original_valid"))
    held = leaving_holds(base, clients) if scenario == "client" else None
    counts = test_class_counts(base, clients) if held else None
    for row in rows:
        row["leaving_holds"] = held
        row["held_test"] = held_test(row.get("test_by_class"), held)
        row["outside_held"] = outside_held(_num(row.get("test_acc")), row["held_test"], counts)
        own = row.get("validity_failed", [])
        cell_flags = [f for f in (validity or {}).get("failed", []) if f in ORIGINAL_CHECKS]
        # a row with its own original (a draw, or a method that trains its own) shows that original's
        # failed checks as "draw:<check>" / "own:<check>" and is flagged by them, not by the shared one's alone
        prefix = row.pop("own_prefix", None)
        flags = sorted(set(cell_flags) | {f for f in own if f not in ORIGINAL_CHECKS}
                       | ({f"{prefix}{f}" for f in own if f in ORIGINAL_CHECKS} if prefix else set()))
        row["validity"] = ";".join(flags) if flags else ("ok" if validity else "unknown")
        row["cell_valid"] = valid
        if row.get("diverged_at_round") is not None:
            row["ct_kr"] = f"diverged@{row['diverged_at_round']}"
            row["rr"] = None
        if "error" in row:
            row["bar"], row["holds"] = "error", False
        elif not valid or _own_flagged(flags):
            row["bar"], row["holds"] = "flagged (original invalid)", None
            _set_aside(row)
        else:
            row["bar"], row["holds"] = judge(row["method"], scenario, row, ref)
        _set_d_test(row, ref)
    _set_context(rows)
    return rows


# a flagged row's figures: no bar reads them (kept as ``<key>_raw``); the table and the CSV show them
# beside the row's flags (``_markdown``, ``write_outputs``)
SET_ASIDE = ("test_acc", "orig_test", "u_kr", "ct_kr", "rr", "forget_acc", "retain_acc", "held_test", "outside_held")


def _set_aside(row: dict) -> None:
    for key in SET_ASIDE:
        row[f"{key}_raw"], row[key] = row.get(key), None


def _count_no_worse(rows: list[dict]) -> int:
    return sum(1 for r in rows if r.get("no_worse") is True)


def _recipe(row: dict) -> str:
    return row.get("recipe") or PAPER  # rows written before the recipe column: the paper


def _variants(rows: list[dict], method: str, name: str) -> list[tuple[str, str]]:
    """``(recipe, display name)`` of every recipe ``method`` ran with in ``rows``, in order of
    appearance: ``("paper", "Lethe (paper)")``, ``("lethe-robust", "Lethe (lethe-robust)")``."""
    recipes = dict.fromkeys(_recipe(r) for r in rows if r["method"] == method)
    return [(recipe, f"{name} ({recipe})") for recipe in recipes]


def _not_carried_out_line(judged: list[dict], name: str) -> list[str]:
    """Where a method did not carry the request out (``carried_out`` False) in some of its valid cells."""
    count = sum(1 for r in judged if r.get("carried_out") is False)
    return [f"{name} did not carry the request out in {count}/{len(judged)} valid cells (each judged as it "
            "is, its own model)"] if count else []


def totals(rows: list[dict]) -> list[str]:
    """One line per bar and per method and recipe (each recipe of a method held to that method's
    bars): how many valid cells meet it."""
    lines = []
    for recipe, name in _variants(rows, "lethe", "Lethe"):
        lethe = [r for r in rows if r["method"] == "lethe" and _recipe(r) == recipe and r.get("cell_valid")
                 and "error" not in r]
        if not lethe:
            continue
        test_ok = sum(1 for r in lethe if r["holds"])
        kr_ok = sum(1 for r in lethe if r.get("kr_ok"))
        lines.append(f"{name} test_acc within {LETHE_TEST_TOL} of retrain: {test_ok}/{len(lethe)} valid cells "
                     f"({'holds' if test_ok == len(lethe) else 'MISSED'}, bar: every cell); "
                     f"not more than {LETHE_TEST_TOL} below it: {_count_no_worse(lethe)}/{len(lethe)}")
        far = [r.get("d_orig") is not None and abs(r["d_orig"]) > LETHE_TEST_TOL for r in lethe]
        missed = [not r["holds"] for r in lethe]
        lines.append(f"valid cells whose original is itself more than {LETHE_TEST_TOL} from retrain's test accuracy: "
                     f"{sum(far)}/{len(lethe)}; test misses of {name} there: "
                     f"{sum(f and m for f, m in zip(far, missed))}, "
                     f"elsewhere: {sum(m and not f for f, m in zip(far, missed))}")
        lines += _miss_facts_line(lethe, name)
        lines.append(f"{name} U-KR and CT-KR within {LETHE_KR_TOL} of retrain: {kr_ok}/{len(lethe)} valid cells "
                     f"({'holds' if kr_ok >= LETHE_KR_SHARE * len(lethe) else 'MISSED'}, bar: "
                     f">= {LETHE_KR_SHARE:.0%})")
        lines += _not_carried_out_line(lethe, name)
    for recipe, name in _variants(rows, "fedup", "FedUP"):
        fedup = [r for r in rows if r["method"] == "fedup" and _recipe(r) == recipe and r["scenario"] == "class"
                 and r.get("cell_valid") and "error" not in r]
        if not fedup:
            continue
        ok = sum(1 for r in fedup if r["holds"])
        lines.append(f"{name} class forget <= {FEDUP_FORGET_MAX}, retain within {FEDUP_RETAIN_TOL}: {ok}/{len(fedup)} "
                     f"valid cells ({'holds' if ok == len(fedup) else 'MISSED'}, bar: every cell); "
                     f"retain not more than {FEDUP_RETAIN_TOL} below: {_count_no_worse(fedup)}/{len(fedup)}")
        lines += _not_carried_out_line(fedup, name)
    lines += _draw_totals(rows)
    errors = [r for r in rows if "error" in r]
    flagged = {_cell(r) for r in rows if not r.get("cell_valid")}
    lines.append(f"runs that failed: {len(errors)}; cells flagged (original invalid): {len(flagged)}")
    return lines


def _miss_facts_line(lethe: list[dict], name: str) -> list[str]:
    """The test misses of one Lethe recipe (``name``) on each side, and how many of them show each fact
    of ``miss_context`` (one miss can show several) or none."""
    parts = []
    for side in ("above", "below"):
        misses = [r for r in lethe if f"MISS {side}" in r.get("bar", "")]
        if misses:
            counts = [f"{text}: {sum(1 for r in misses if kind in r['miss_kinds'])}" for kind, text in MISS_FACTS]
            none = sum(1 for r in misses if not r["miss_kinds"])
            parts.append(f"{len(misses)} {side} ({', '.join(counts)}; none of these: {none})")
    return [f"test misses of {name}: {'; '.join(parts)}"] if parts else []


def _cell(row: dict) -> tuple:
    return tuple(str(row[k]) for k in ("seed", "clients", "alpha", "scenario"))


def _draw_totals(rows: list[dict]) -> list[str]:
    """The retrain draws judged by Lethe's bars (``--retrain-draws``), and their originals against the
    grid's: how often the reference, drawn again, meets the bars a method is held to; then Lethe read
    against the band the grid's retrain and its draws span."""
    draws = [r for r in rows if r["method"].startswith(DRAW) and r.get("holds") is not None]
    if not draws:
        return []
    refs: dict[tuple, dict] = {}
    for r in rows:
        if r["method"] == "retrain":
            refs.setdefault(_cell(r), r)  # the cell's first retrain, as ``run_cell`` judged against

    def within(r: dict, key: str, tol: float) -> bool:
        mine, theirs = _num(r.get(key)), _num(refs.get(_cell(r), {}).get(key))
        return mine is not None and theirs is not None and abs(mine - theirs) <= tol

    classes = [r for r in draws if r["scenario"] == "class"]
    n = len(draws)
    lines = [f"retrain drawn again from other initial weights, judged by Lethe's bars: test within {LETHE_TEST_TOL} "
             f"of the grid's retrain in {sum(1 for r in draws if r['holds'])}/{n} draws (not more than "
             f"{LETHE_TEST_TOL} below: {_count_no_worse(draws)}/{n}); U-KR and CT-KR within {LETHE_KR_TOL}: "
             f"{sum(1 for r in draws if r.get('kr_ok'))}/{n}; the draw's original within {LETHE_TEST_TOL} of "
             f"the grid's original: {sum(within(r, 'd_orig', LETHE_TEST_TOL) for r in draws)}/{n}"
             + (f"; class cells, retain within {FEDUP_RETAIN_TOL} (FedUP's bar): "
                f"{sum(within(r, 'retain_acc', FEDUP_RETAIN_TOL) for r in classes)}/{len(classes)}" if classes else "")]
    band: dict[tuple, list[float]] = {}
    for r in [*refs.values(), *draws]:
        if _num(r.get("test_acc")) is not None:
            band.setdefault(_cell(r), []).append(r["test_acc"])
    for recipe, name in _variants(rows, "lethe", "Lethe"):
        lethe = [r for r in rows if r["method"] == "lethe" and _recipe(r) == recipe and r.get("holds") is not None
                 and len(band.get(_cell(r), [])) > 1 and _num(r.get("test_acc")) is not None]
        if lethe:
            inside = sum(1 for r in lethe if min(band[_cell(r)]) - LETHE_TEST_TOL <= r["test_acc"]
                         <= max(band[_cell(r)]) + LETHE_TEST_TOL)
            lines.append(f"{name} test_acc within {LETHE_TEST_TOL} of the grid's retrain or of a retrain draw: "
                         f"{inside}/{len(lethe)} valid cells with a draw")
    return lines + _shape_parity_lines(rows, draws, refs)


def _shape_parity_lines(rows: list[dict], draws: list[dict], refs: dict[tuple, dict]) -> list[str]:
    """Per federation shape, in the same cells: how often exact unlearning drawn again meets a bar read
    on both sides, beside how often the method does (Lethe's test bar; FedUP's class bar). Where the
    reference misses its own bar as often as the method, the bar measures the reference's spread on
    that shape, not the method. ``refs``: the grid's retrain row of each cell."""
    lines, judged = [], {_cell(r) for r in draws}
    for shape in sorted({(r["clients"], r["alpha"]) for r in draws}, key=lambda s: (-float(s[1]), s[0])):
        parts = []
        for method, recipe, name, scenarios, bar in (
                *[("lethe", recipe, name, None, f"Lethe's test within {LETHE_TEST_TOL}")
                  for recipe, name in _variants(rows, "lethe", "Lethe")],
                *[("fedup", recipe, name, {"class"}, "FedUP's class bar")
                  for recipe, name in _variants(rows, "fedup", "FedUP")]):
            mine = {_cell(r): r for r in rows if r["method"] == method and _recipe(r) == recipe
                    and r.get("holds") is not None and _cell(r) in judged and (r["clients"], r["alpha"]) == shape
                    and (scenarios is None or r["scenario"] in scenarios)}
            theirs = [r for r in draws if _cell(r) in mine]
            if mine and theirs:
                draw_ok = sum(1 for r in theirs if _draw_meets(r, method, refs[_cell(r)]))
                parts.append(f"{bar}: retrain drawn again {draw_ok}/{len(theirs)} draws, {name} "
                             f"{sum(1 for r in mine.values() if r['holds'])}/{len(mine)} cells")
        if parts:
            lines.append(f"{shape[0]} clients alpha {shape[1]}, both sides, same cells: {'; '.join(parts)}")
    return lines


def _draw_meets(draw: dict, method: str, ref: dict) -> bool:
    """Whether a retrain draw meets ``method``'s bar against the grid's retrain ``ref``: Lethe's test bar is
    the draw's own verdict; FedUP's class bar is ``judge``'s, on a copy (``judge`` sets the row's
    one-sided reading, which the draw keeps for Lethe's bars)."""
    if method == "lethe":
        return bool(draw["holds"])
    return bool(judge("fedup", "class", dict(draw), ref)[1])


def _parse(text: str) -> float | None:
    """A saved CSV figure as a number (``None`` for blanks and marks such as ``diverged@4``)."""
    try:
        return _num(float(text))
    except (TypeError, ValueError):
        return None


def rejudge(paths: list[str], overrides: dict) -> list[dict]:
    """The rows of saved grid CSVs (``--out``), judged again by this file's bars; nothing is run.

    A cell is valid when its rows carry none of ``ORIGINAL_CHECKS`` (as ``run_cell`` wrote them). A
    later file's row replaces an earlier one's of the same cell, method and recipe (a cell run again;
    a CSV from before the ``recipe`` column: ``paper``).
    ``overrides`` are the grid's ``--run-config`` (the rows do not keep it; ``leaving_holds`` needs
    the task). ``d_test`` and ``d_orig`` are taken again against the cell's retrain row, so a method
    run again without retrain (``--methods lethe``, no ``d_orig`` of its own) gets them back from
    its ``orig_test``."""
    latest: dict[tuple, dict] = {}
    for path in paths:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                row["recipe"] = _recipe(row)
                row["carried_out"] = {"yes": True, "NO": False}.get(row.get("carried_out") or "")
                latest[tuple(row[k] for k in ("seed", "clients", "alpha", "scenario", "method", "recipe"))] = row
    rows = list(latest.values())
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        for key in ("test_acc", "d_test", "d_orig", "orig_test", "u_kr", "ct_kr", "rr", "forget_acc", "retain_acc"):
            row[key] = _parse(row.get(key))  # d_orig and orig_test are absent from CSVs written before their columns
        if not row.get("error"):
            row.pop("error", None)
        flags = set(filter(None, row["validity"].split(";")))
        row["cell_valid"] = row["validity"] != "unknown" and not flags & set(ORIGINAL_CHECKS)
        row["own_flagged"] = _own_flagged(flags)
        if "error" not in row and (not row["cell_valid"] or row["own_flagged"]):
            _set_aside(row)  # as ``run_cell`` did: no bar, no reference and no d_test reads them
        cells.setdefault(_cell(row), []).append(row)
    for (seed, clients, alpha, scenario), cell in cells.items():
        ref = next((r for r in cell if r["method"] == "retrain" and "error" not in r), None)
        config = {**overrides, "seed": int(seed), "dirichlet-alpha": float(alpha)}
        held = leaving_holds(config, int(clients)) if scenario == "client" else None
        counts = test_class_counts(config, int(clients)) if held else None
        for row in cell:
            row["leaving_holds"], row["holds"] = held, None
            row["outside_held"] = outside_held(row["test_acc"], row.get("held_test"), counts)
            row.pop("no_worse", None)
            if "error" in row:
                row["holds"] = False
            elif row["cell_valid"] and not row["own_flagged"]:
                row["bar"], row["holds"] = judge(row["method"], row["scenario"], row, ref)
            _set_d_test(row, ref)
        _set_context(cell)
    return rows


def write_outputs(out: str, rows: list[dict]) -> None:
    """``<out>.json`` (every row, all fields) and ``<out>.csv`` (the table's columns), atomically; a
    flagged row's figures, set aside from the bars, are written beside its ``validity`` flags."""
    write_text(out + ".json", json.dumps(rows, indent=1, default=str))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS + ("seconds", "folder"), extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        shown = {k: row[f"{k}_raw"] if row.get(k) is None and row.get(f"{k}_raw") is not None else row.get(k)
                 for k in writer.fieldnames}
        writer.writerow({k: _fmt(v) if k in ("holds", "no_worse", "carried_out") else v for k, v in shown.items()})
    write_text(out + ".csv", buffer.getvalue())


def grid_run_config(text: str) -> dict:
    """The grid's run config: :data:`GRID_RUN_CONFIG` with ``--run-config``'s keys (``text``) over it."""
    return {**GRID_RUN_CONFIG, **parse_overrides(text)}


def check_configs(seeds: list[int], shapes: list[tuple[int, float]], scenarios: list[str], methods: list[str],
                  overrides: dict, retrain_draws: int) -> None:
    """Every run config the grid will make (as ``run_cell`` makes it) through ``strategies.run_config.parse_config``
    before any run: the first error is a one-line ``SystemExit`` naming the ``--run-config``, the token
    and the cell."""
    from core.config import ConfigError
    from strategies.run_config import parse_config

    runs = [(method + (f"@{recipe}" if recipe else ""), recipe, {"method": method})
            for method, recipe in parse_methods(methods, str(overrides.get("recipe") or PAPER))]
    if "retrain" in methods and retrain_draws > 1:
        runs.append(("retrain (its draws)", None, {"method": "retrain", "init-seed": draw_seed(seeds[0], 1)}))
    for seed in seeds:
        for clients, alpha in shapes:
            for scenario in scenarios:
                base = {**overrides, "seed": seed, "dirichlet-alpha": alpha, "scenario": scenario}
                for token, recipe, extra in runs:
                    try:
                        parse_config(with_recipe({**base, **extra}, recipe), clients)
                    except ConfigError as err:
                        raise SystemExit(f"--run-config with --methods {token}, seed {seed}, shape {clients}:{alpha}, "
                                         f"{scenario} scenario: {err}") from None


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="285,286,287,288,289",
                        help="report seeds (no default was chosen on them)")
    parser.add_argument("--shapes", default="10:0.5,7:0.1", help="CLIENTS:ALPHA pairs")
    parser.add_argument("--methods", default="retrain,fedup,lethe",
                        help="comma-separated METHOD or METHOD@RECIPE tokens (as compare_methods.py): "
                             "lethe@lethe-robust runs lethe with recipe='lethe-robust' beside a plain lethe "
                             "(its paper)")
    parser.add_argument("--scenarios", default="client,class,sample")
    parser.add_argument("--run-config", default="",
                        help="shared overrides, as for flwr run --run-config, on top of the grid's continue-rounds=60 "
                             "(60 local epochs of continued training at digits' one epoch a round), which they "
                             "replace key by key")
    parser.add_argument("--out", default="", help="prefix of the CSV/JSON files (default: <work>/grid)")
    parser.add_argument("--work", default="", help="folder for cache and run outputs (default: a new temp folder)")
    parser.add_argument("--retrain-draws", type=int, default=1,
                        help="retrain runs per cell, each from other initial weights (init-seed); >= 2 judges "
                        "the draws after the first by Lethe's bars against the first")
    parser.add_argument("--rejudge", default="", help="comma-separated grid CSVs (from --out) to judge again "
                        "by the bars above, without running anything")
    args = parser.parse_args(argv)
    with config_errors():  # every config error: one line on stderr, exit status 2, before any run
        if args.retrain_draws < 1 or (args.retrain_draws > 1 and "retrain" not in args.methods.split(",")):
            raise SystemExit(f"--retrain-draws: {args.retrain_draws} is not allowed: it must be >= 1, and above 1 "
                             "only with retrain among --methods (the draws are judged against it)")
        try:
            run_config = grid_run_config(args.run_config)
        except ValueError as err:
            raise SystemExit(f"--run-config: {args.run_config!r} is not 'key=value ...' in TOML syntax: {err}") \
                from None
        missing = [p for p in args.rejudge.split(",") if p and not os.path.isfile(p)] if args.rejudge else []
        if missing:
            raise SystemExit(f"--rejudge: no file {', '.join(missing)}")
    if args.rejudge:
        rows = rejudge(args.rejudge.split(","), run_config)
        print(_header())
        for row in rows:
            print(_markdown(row))
        print("\n" + "\n".join(totals(rows)))
        return
    with config_errors():
        try:
            seeds = [int(s) for s in args.seeds.split(",")]
        except ValueError:
            raise SystemExit(f"--seeds: {args.seeds!r} must be comma-separated integers") from None
        shapes = parse_shapes(args.shapes)
        methods, scenarios = args.methods.split(","), args.scenarios.split(",")
        parse_methods(methods, str(run_config.get("recipe") or PAPER))  # a bad token: before any run
        unknown = [s for s in scenarios if s not in ("client", "class", "sample")]
        if unknown or not scenarios:
            raise SystemExit(f"--scenarios: {', '.join(unknown) or 'nothing given'} is not allowed; "
                             "must be among client, class, sample")
        check_configs(seeds, shapes, scenarios, methods, run_config, args.retrain_draws)
    if "retrain" in methods:  # the reference runs first in every cell
        methods = ["retrain"] + [m for m in methods if m != "retrain"]
    work = args.work or tempfile.mkdtemp(prefix="grid-")
    out = args.out or os.path.join(work, "grid")
    shared = {"cache-dir": os.path.join(work, "cache"), "outputs-dir": os.path.join(work, "out"), **run_config}
    setup_logging(logging.WARNING)
    print(_header(), flush=True)
    rows: list[dict] = []
    for seed in seeds:  # seeds outermost: a partial run still covers every shape and scenario
        for clients, alpha in shapes:
            for scenario in scenarios:
                for row in run_cell(seed, clients, alpha, scenario, methods, shared, args.retrain_draws):
                    rows.append(row)
                    print(_markdown(row), flush=True)
                write_outputs(out, rows)
    print()
    for line in totals(rows):
        print(line)
    print(f"\nrows: {out}.csv, {out}.json; runs under {work}")


if __name__ == "__main__":
    main()
