"""The comparison runner (``benchmarks/compare_methods.py``): its plan, its table entries, and one small matrix."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # a script folder, not a package
import compare_methods as compare  # noqa: E402  (its --jobs workers import it by this name, too)


def _row(seed, method="fedup", scenario="class", **values):
    base = {"task": "digits-lenet5", "scenario": scenario, "seed": seed, "method": method, "status": "ok",
            "retain_acc": 0.9, "forget_acc": 0.0, "test_acc": 0.9, "mia": 0.1, "target_rate": None, "ct_kr": 0.1,
            "rr": 5.0, "diverged_at_round": None, "seconds": 2.0, "bytes": 2_000_000, "rounds": 1, "flags": [],
            "reasons": [], "kr_unlearned": 0.0, "kr_curve": [0.0, 0.1], "error": ""}
    return {**base, **values}


def test_entries_are_mean_and_std_over_seeds_and_say_what_is_missing():
    rows = [_row(1, test_acc=0.90), _row(2, test_acc=0.94)]
    assert compare.entry(rows, "test_acc") == "0.920 ± 0.028"
    assert compare.entry(rows[:1], "test_acc") == "0.900"
    failed = {"task": "digits-lenet5", "scenario": "class", "seed": 3, "method": "fedup", "status": "failed",
              "error": "RunStopped: boom", "flags": [], "reasons": []}
    assert compare.entry(rows + [failed], "test_acc") == "0.920 ± 0.028 (2/3)"
    assert compare.entry([failed], "test_acc") == "failed"
    invalid = _row(4, flags=["original_learned"], reasons=["no forget knowledge"])
    assert compare.entry([invalid], "forget_acc") == "flagged"  # never a number from an invalid cell
    assert compare.entry([invalid], "seconds", digits=1) == "2.0"  # its cost is still what it cost
    diverged = _row(5, diverged_at_round=3, flags=["continued_finite"])
    assert compare.entry([diverged], "ct_kr") == "diverged@3" and compare.entry([diverged], "test_acc") == "0.900"
    lost = _row(6, flags=["unlearned_utility"])
    assert compare.entry([lost], "test_acc") == "flagged" and compare.entry([lost], "ct_kr") == "0.100"


def test_tables_have_the_papers_layouts_and_list_problems():
    rows = [_row(1, scenario=s, method=m) for s in ("client", "class") for m in ("retrain", "fedup")]
    rows.append(_row(1, scenario="class", method="lethe", flags=["original_usable"], reasons=["original broken"]))
    rows.append(_row(1, scenario="client", method="exact-fun", own_original={"exact-fun-quantised-step": 0.001}))
    fedup = compare.fedup_tables(rows)
    assert "| method | Client R-A | Client F-A | Client MIA | Class R-A | Class F-A | Class MIA |" in fedup
    assert "| fedup | 0.900 | 0.000 | 0.100 | 0.900 | 0.000 | 0.100 |" in fedup
    assert "| lethe | — | — | — | flagged | flagged | flagged |" in fedup  # no client row for lethe: not run
    assert "| fedup | 2.0 | 2.00 | 2.0 | 2.00 |" in fedup  # Table 4: seconds and MB per scenario
    lethe = compare.lethe_tables(rows)
    assert "Table III layout (Lethe): client" in lethe and "Table IV layout (Lethe): class" in lethe
    assert "Table V" not in lethe
    assert "| fedup | 0.900 | 0.000 | 0.100 | 5.0 | 2.00 |" in lethe  # RR is a percentage already
    assert "| exact-fun * | 0.900 |" in lethe and "| exact-fun * | 0.900 |" in fedup  # its own original
    rows.append(_row(1, scenario="client", method="lethe", exact_fallback={"1": 0.99, "4": 0.9666}))
    listed = compare.problems(rows, ["pga on digits-lenet5 / sample: does not support the sample scenario"])
    assert "flagged: lethe on digits-lenet5 / class / seed 1: original broken" in listed
    assert ("exact fallback: lethe on digits-lenet5 / client / seed 1: retrain's own model (the request removes "
            "0.99 of class 1, 0.97 of class 4)") in listed
    assert "skipped: pga on digits-lenet5 / sample" in listed


def test_plan_skips_what_a_method_does_not_support_and_rejects_unknown_names():
    cells, skipped = compare.plan(["retrain", "firm"], ["class"], ["digits-lenet5"], [1, 2])
    assert [(c.method, c.seed) for c in cells] == [("retrain", 1), ("retrain", 2)]
    assert skipped == ["firm on digits-lenet5 / class: runs on llm tasks, not vision"]
    with pytest.raises(SystemExit, match="--methods: nosuch is not allowed"):
        compare.plan(["nosuch"], ["class"], ["digits-lenet5"], [1])
    with pytest.raises(SystemExit, match="--scenarios: everything"):
        compare.plan(["retrain"], ["everything"], ["digits-lenet5"], [1])


def test_one_small_matrix_in_two_jobs_writes_tables_plot_and_rows(tmp_path):
    out = str(tmp_path / "cmp")
    matrix = ["--methods", "none,retrain", "--scenarios", "class,sample", "--seeds", "3", "--clients", "3",
              "--run-config", "smoke=true", "--out", out]
    compare.main(matrix + ["--jobs", "2"])  # the class and the sample group side by side
    with open(os.path.join(out, "runs.json")) as handle:
        rows = json.load(handle)
    assert [(r["scenario"], r["method"], r["status"]) for r in rows] == [
        ("class", "none", "ok"), ("class", "retrain", "ok"), ("sample", "none", "ok"), ("sample", "retrain", "ok")]
    none, retrain = rows[:2]
    assert none["bytes"] == 0 and retrain["bytes"] > 0  # none sends nothing; retrain's cost is its build
    assert retrain["forget_acc"] < none["forget_acc"] or "original_learned" in none["flags"]
    tables = open(os.path.join(out, "tables.md")).read()
    assert "Table 3 layout" in tables and "Table IV layout (Lethe): class" in tables and "2 job(s)" in tables
    assert os.path.getsize(os.path.join(out, "kr_curves.png")) > 1000
    compare.main(matrix + ["--resume"])  # nothing left to run: the rows are kept
    with open(os.path.join(out, "runs.json")) as handle:
        assert json.load(handle) == rows
