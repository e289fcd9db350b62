"""The comparison runner (``benchmarks/compare_methods.py``): its plan, its table entries, what each row and
legend says ran (method and recipe), and one small matrix."""

from __future__ import annotations

import csv
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
    diverged = _row(5, diverged_at_round=3, flags=["continued_finite"])
    assert compare.entry([diverged], "ct_kr") == "diverged@3" and compare.entry([diverged], "test_acc") == "0.900"


def test_a_flagged_or_not_carried_out_run_shows_its_numbers_marked_and_apart():
    """A validity flag or ``method.carried_out`` false never replaces a number: the number is shown with
    its mark beside it, and averaged apart from the seeds without one (never into their mean)."""
    invalid = _row(4, forget_acc=0.25, flags=["original_learned"], reasons=["no forget knowledge"])
    assert compare.entry([invalid], "forget_acc") == "0.250 (flagged)"
    assert compare.entry([invalid], "seconds", digits=1) == "2.0"  # its cost is what it cost: no mark
    lost = _row(6, test_acc=0.40, flags=["unlearned_utility"])
    assert compare.entry([lost], "test_acc") == "0.400 (flagged)" and compare.entry([lost], "ct_kr") == "0.100"
    clean = [_row(1, test_acc=0.90), _row(2, test_acc=0.94)]
    assert compare.entry(clean + [lost], "test_acc") == "0.920 ± 0.028 (2/3); 0.400 (flagged, 1/3)"
    undone = _row(7, test_acc=0.80, carried_out=False, pretrain_seconds=9.0)
    assert compare.entry([undone], "test_acc") == "0.800 (not carried out)"
    assert compare.entry([undone], "seconds", digits=1) == "2.0 (not carried out)"
    assert compare.entry([undone], "pretrain_seconds", digits=1) == "9.0"  # the original it started from
    assert compare.entry(clean + [undone], "test_acc") == "0.920 ± 0.028 (2/3); 0.800 (not carried out, 1/3)"
    both = _row(8, test_acc=0.30, carried_out=False, flags=["original_usable"])
    assert compare.entry([both], "test_acc") == "0.300 (flagged, not carried out)"
    assert compare.entry([_row(9, carried_out=True)], "test_acc") == "0.900"  # its own check passed: no mark


def test_tables_have_the_papers_layouts_name_each_rows_recipe_and_list_problems():
    rows = [_row(1, scenario=s, method=m) for s in ("client", "class") for m in ("retrain", "fedup")]
    rows.append(_row(1, scenario="class", method="lethe", flags=["original_usable"], reasons=["original broken"]))
    rows.append(_row(1, scenario="class", method="lethe", recipe="lethe-robust", test_acc=0.7, carried_out=False))
    rows.append(_row(1, scenario="client", method="exact-fun", own_original={"exact-fun-quantised-step": 0.001}))
    fedup = compare.fedup_tables(rows)
    assert "| method | recipe | Client R-A | Client F-A | Client MIA | Class R-A | Class F-A | Class MIA |" in fedup
    assert "| fedup | paper | 0.900 | 0.000 | 0.100 | 0.900 | 0.000 | 0.100 |" in fedup
    # no client row for lethe (not run); the flagged class row shows its numbers, marked
    assert "| lethe | paper | — | — | — | 0.900 (flagged) | 0.000 (flagged) | 0.100 (flagged) |" in fedup
    assert ("| lethe | lethe-robust | — | — | — | 0.900 (not carried out) | 0.000 (not carried out) "
            "| 0.100 (not carried out) |") in fedup  # the paper and the recipe: two rows, never averaged together
    assert "| fedup | paper | 2.0 | 2.00 | 2.0 | 2.00 |" in fedup  # Table 4: seconds and MB per scenario
    lethe = compare.lethe_tables(rows)
    assert "| method | recipe | MU | U-KR | CT-KR | RR (%) | comm. (MB) |" in lethe
    assert "Table III layout (Lethe): client" in lethe and "Table IV layout (Lethe): class" in lethe
    assert "Table V" not in lethe
    assert "| fedup | paper | 0.900 | 0.000 | 0.100 | 5.0 | 2.00 |" in lethe  # RR is a percentage already
    assert "| lethe | lethe-robust | 0.700 (not carried out) |" in lethe
    assert "| exact-fun * | paper | 0.900 |" in lethe and "| exact-fun * | paper | 0.900 |" in fedup  # own original
    assert "flagged |" not in fedup.replace("(flagged) |", "")  # never a bare "flagged" in a number's place
    pretraining = compare.pretraining_table(rows)
    assert "what each original cost — digits-lenet5 (a method named without a recipe: its paper)" in pretraining
    assert "| shared (retrain, fedup, lethe, lethe (lethe-robust)) | class |" in pretraining
    assert "| exact-fun * | client |" in pretraining
    listed = compare.problems(rows, ["pga (paper) on digits-lenet5 / sample: does not support the sample scenario"])
    assert "flagged: lethe (paper) on digits-lenet5 / class / seed 1: original broken" in listed
    assert "not carried out: lethe (lethe-robust) on digits-lenet5 / class / seed 1" in listed
    assert "not carried out: lethe (paper)" not in listed and "exact" not in listed
    assert "skipped: pga (paper) on digits-lenet5 / sample" in listed
    report = compare.report(rows, [], 3, "", 1)
    assert "## Failed, flagged, not carried out and skipped" in report and "exact fallback" not in report


def _results(recipe=None, carried=None, **method):
    """A results.json as ``summarise`` reads it; ``recipe`` None: one written before ``run.recipe``."""
    run = {"task": "digits-lenet5", "method": "lethe", **({"recipe": recipe} if recipe is not None else {})}
    details = {**method, **({"carried_out": carried} if carried is not None else {})}
    return {"run": run, "method": details,
            "models": {"unlearned": {"retain_acc": 0.9, "forget_acc": 0.1, "test_acc": 0.88, "mia": 0.5}},
            "resurfacing": {"ct_kr": 0.2, "rr": 10.0, "kr_unlearned": 0.1, "kr_curve": [0.15, 0.2]},
            "cost": {"unlearn": {"seconds": 1.0, "bytes_up": 10, "bytes_down": 20, "rounds": 1}},
            "validity": {"failed": [], "reasons": []}}


def test_a_row_says_the_recipe_its_run_reports_and_whether_it_carried_the_request_out():
    cell = compare.Cell("digits-lenet5", "class", 1, "lethe", "lethe-robust", True)
    row = compare.summarise(cell, _results("lethe-robust", carried=False), "f")
    assert row["recipe"] == "lethe-robust" and row["carried_out"] is False
    old = compare.summarise(compare.Cell("digits-lenet5", "class", 1, "lethe"), _results(), "f")
    assert old["recipe"] == "paper" and old["carried_out"] is None  # an older results.json: the paper, unjudged
    assert compare.summarise(cell, _results("paper", carried=True), "f")["carried_out"] is True
    # Lethe's exact fallback is gone: nothing of it reaches a row, whatever an old results.json holds
    assert "exact_fallback" not in compare.summarise(cell, _results(exact_fallback={"classes": {"1": 0.9}}), "f")
    assert "exact_fallback" not in compare.ROW_FIELDS and "recipe" in compare.ROW_FIELDS


def test_the_kr_plot_legend_names_each_method_with_its_recipe():
    rows = [_row(1, method="lethe"), _row(1, method="lethe", recipe="lethe-robust", carried_out=False),
            _row(1, method="retrain")]
    fig = compare.curves_figure(rows)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["lethe (paper)", "lethe (lethe-robust) — not carried out", "retrain (paper)"]


def test_plan_skips_what_a_method_does_not_support_and_rejects_unknown_names():
    cells, skipped = compare.plan(["retrain", "firm"], ["class"], ["digits-lenet5"], [1, 2])
    assert [(c.method, c.seed) for c in cells] == [("retrain", 1), ("retrain", 2)]
    assert skipped == ["firm (paper) on digits-lenet5 / class: runs on llm tasks, not vision"]
    with pytest.raises(SystemExit, match="--methods: nosuch is not allowed"):
        compare.plan(["nosuch"], ["class"], ["digits-lenet5"], [1])
    with pytest.raises(SystemExit, match="--methods: nosuch is not allowed"):
        compare.plan(["nosuch@lethe-robust"], ["class"], ["digits-lenet5"], [1])
    with pytest.raises(SystemExit, match="--scenarios: everything"):
        compare.plan(["retrain"], ["everything"], ["digits-lenet5"], [1])


def test_a_method_token_may_carry_a_recipe_and_the_run_config_gets_it():
    cells, _ = compare.plan(["retrain", "lethe", "lethe@lethe-robust"], ["class"], ["digits-lenet5"], [1])
    assert [(c.method, c.recipe, c.pinned) for c in cells] == [
        ("retrain", "paper", False), ("lethe", "paper", False), ("lethe", "lethe-robust", True)]
    # --run-config "recipe='lethe-robust'" selects it for the plain tokens; lethe@paper keeps the paper
    cells, _ = compare.plan(["lethe", "lethe@paper"], ["class"], ["digits-lenet5"], [1], recipe="lethe-robust")
    assert [(c.recipe, c.pinned) for c in cells] == [("lethe-robust", False), ("paper", True)]
    for bad in ("lethe@", "@lethe-robust", "lethe@a@b"):
        with pytest.raises(SystemExit, match="is not METHOD or METHOD@RECIPE"):
            compare.parse_methods([bad])
    with pytest.raises(SystemExit, match=r"lethe \(paper\) given more than once"):
        compare.parse_methods(["lethe", "lethe@paper"])
    with pytest.raises(SystemExit, match="lethe \\(nosuch\\): no recipe 'nosuch'; the recipes are .*lethe-robust"):
        compare.parse_methods(["lethe@nosuch"])
    with pytest.raises(SystemExit, match="recipe 'lethe-robust' is for lethe, not retrain"):  # before any run
        compare.plan(["retrain", "lethe"], ["class"], ["digits-lenet5"], [1], recipe="lethe-robust")
    assert compare.with_recipe({"a": 1}, None) == {"a": 1}
    assert compare.with_recipe({"a": 1, "recipe": "x"}, None) == {"a": 1, "recipe": "x"}
    assert compare.with_recipe({"a": 1}, "lethe-robust") == {"a": 1, "recipe": "lethe-robust"}
    assert compare.with_recipe({"a": 1, "recipe": "lethe-robust"}, "paper") == {"a": 1}


def test_a_paper_and_its_recipe_side_by_side_in_one_call(tmp_path, monkeypatch):
    """``--methods retrain,lethe,lethe@lethe-robust``: the recipe's run gets ``recipe='lethe-robust'`` in
    its run config, the others none; tables, runs.csv and the problems name each row's recipe."""
    configs = []

    def fake_run(config, clients):
        configs.append(dict(config))
        folder = tmp_path / f"run-{len(configs)}"
        folder.mkdir()
        results = _results(config.get("recipe", "paper"), carried=False if "recipe" in config else None)
        results["run"]["method"] = config["method"]
        (folder / "results.json").write_text(json.dumps(results))
        return str(folder)

    monkeypatch.setattr(compare, "run_inprocess", fake_run)
    out = str(tmp_path / "cmp")
    compare.main(["--methods", "retrain,lethe,lethe@lethe-robust", "--scenarios", "class", "--seeds", "1",
                  "--clients", "3", "--run-config", "", "--out", out])
    assert [(c["method"], c.get("recipe")) for c in configs] == [
        ("retrain", None), ("lethe", None), ("lethe", "lethe-robust")]
    tables = open(os.path.join(out, "tables.md")).read()
    assert "| lethe | paper | 0.880 | 0.100 | 0.200 | 10.0 | 0.00 |" in tables
    assert "| lethe | lethe-robust | 0.880 (not carried out) |" in tables
    assert "not carried out: lethe (lethe-robust) on digits-lenet5 / class / seed 1" in tables
    with open(os.path.join(out, "runs.csv"), newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [(r["method"], r["recipe"], r["carried_out"]) for r in rows] == [
        ("retrain", "paper", ""), ("lethe", "paper", ""), ("lethe", "lethe-robust", "false")]
    compare.main(["--methods", "retrain,lethe,lethe@lethe-robust", "--scenarios", "class", "--seeds", "1",
                  "--clients", "3", "--run-config", "", "--out", out, "--resume"])
    assert len(configs) == 3  # each run found by its method and recipe: nothing ran again


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
    assert "| none | paper |" in tables and "| retrain | paper |" in tables  # no recipe selected: the papers
    assert os.path.getsize(os.path.join(out, "kr_curves.png")) > 1000
    compare.main(matrix + ["--resume"])  # nothing left to run: the rows are kept
    with open(os.path.join(out, "runs.json")) as handle:
        assert json.load(handle) == rows


def _refused(capsys, argv, code=2) -> str:
    """``compare.main(argv)`` stops with ``code`` and one line on stderr, which is returned."""
    with pytest.raises(SystemExit) as info:
        compare.main(argv)
    assert info.value.code == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_every_config_error_is_one_line_and_status_2_before_any_run(tmp_path, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(compare, "run_inprocess", lambda config, clients: ran.append(config))
    out = ["--out", str(tmp_path / "cmp"), "--scenarios", "class", "--methods", "retrain,lethe"]
    assert "unknown run-config key(s) nosuch" in _refused(capsys, out + ["--run-config", "nosuch=1"])
    assert "'continue-rounds'=-3" in _refused(capsys, out + ["--run-config", "continue-rounds=-3"])
    assert "TOML syntax" in _refused(capsys, out + ["--run-config", "continue-rounds="])
    assert "--methods lethe@nosuch" not in _refused(capsys, out[:-1] + ["lethe@nosuch"])  # named as lethe (nosuch)
    assert "--clients" in _refused(capsys, out + ["--clients", "x"])  # argparse's own errors, too
    assert "--seeds" in _refused(capsys, out + ["--seeds", "1,b"])
    # a cell's config as parse_config checks it with the federation size: the forget client must exist
    assert "forget-client" in _refused(capsys, out + ["--clients", "3", "--run-config", "forget-client=5"])
    assert ran == []
    (tmp_path / "file").write_text("x")
    assert "--out:" in _refused(capsys, ["--out", str(tmp_path / "file"), "--methods", "retrain"])


def test_a_config_error_from_the_command_line_has_no_traceback(tmp_path):
    import subprocess

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_methods.py"
    run = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "cmp"), "--run-config", "nosuch=1"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.startswith("error: --run-config") and not (tmp_path / "cmp").exists()


def test_a_call_whose_runs_all_failed_exits_non_zero(tmp_path, monkeypatch, capsys):
    def broken(config, clients):
        raise RuntimeError("boom")

    monkeypatch.setattr(compare, "run_inprocess", broken)
    out = str(tmp_path / "cmp")
    err = _refused(capsys, ["--methods", "retrain,lethe", "--scenarios", "class", "--run-config", "", "--out", out],
                   code=1)
    assert "every run failed (2 of 2)" in err
    with open(os.path.join(out, "runs.json")) as handle:
        assert [r["status"] for r in json.load(handle)] == ["failed", "failed"]  # the rows are still written


def test_resume_refuses_a_broken_runs_json_or_one_made_with_other_settings(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run(config, clients):
        calls.append(config)
        folder = tmp_path / f"run-{len(calls)}"
        folder.mkdir()
        results = _results()
        results["run"]["method"] = config["method"]
        (folder / "results.json").write_text(json.dumps(results))
        return str(folder)

    monkeypatch.setattr(compare, "run_inprocess", fake_run)
    out = str(tmp_path / "cmp")
    argv = ["--methods", "retrain", "--scenarios", "class", "--clients", "3", "--run-config", "continue-rounds=2",
            "--out", out]
    compare.main(argv)
    capsys.readouterr()
    path = os.path.join(out, "runs.json")
    kept = open(path).read()
    other_clients = _refused(capsys, argv[:5] + ["4"] + argv[6:] + ["--resume"])
    assert "made with other settings: --clients 3 there, 4 here" in other_clients
    other_config = _refused(capsys, argv[:7] + ["continue-rounds=5 smoke=true"] + argv[8:] + ["--resume"])
    assert ("--run-config 'continue-rounds=2' there, 'continue-rounds=5 smoke=true' here "
            "(continue-rounds, smoke differ)") in other_config
    assert open(path).read() == kept and len(calls) == 1  # nothing ran, nothing replaced
    compare.main(argv[:7] + [" continue-rounds=2"] + argv[8:] + ["--resume"])  # the same settings, written apart
    assert len(calls) == 1
    open(path, "w").write(kept[: len(kept) // 2])  # a truncated runs.json
    assert "is not readable JSON" in _refused(capsys, argv + ["--resume"])
    open(path, "w").write('{"rows": []}')
    assert "is not a list of runs" in _refused(capsys, argv + ["--resume"])
    assert len(calls) == 1
