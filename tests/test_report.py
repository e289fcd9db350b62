"""``server_app.report``: the CSV row and the KR plot say what ran — the method's recipe (``run.recipe``,
"paper" where none was selected or the results predate the key) and whether the method carried the
request out (``method.carried_out``)."""

from __future__ import annotations

import csv
import json

from server_app import report


def _results(recipe=None, carried=None, method="lethe"):
    run = {"task": "digits-lenet5", "method": method, "scenario": "class", "seed": 7, "num_clients": 3}
    if recipe is not None:
        run["recipe"] = recipe
    return {"run": run, "method": {} if carried is None else {"carried_out": carried},
            "models": {"original": {"test_acc": 0.9, "forget_acc": 1.0},
                       "unlearned": {"test_acc": 0.85, "forget_acc": 0.1, "mia": 0.5}},
            "resurfacing": {"ct_kr": 0.2, "rr": 3.0, "kr_unlearned": 0.1, "kr_curve": [0.15, 0.2],
                            "kr_original": 1.0, "kr_retrain": 0.05},
            "cost": {"unlearn": {"seconds": 1, "bytes_up": 2, "bytes_down": 3}}}


def _rows(path):
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_the_csv_row_names_the_recipe_right_after_the_method_and_whether_it_was_carried_out(tmp_path):
    assert report.CSV_FIELDS.index("recipe") == report.CSV_FIELDS.index("method") + 1
    assert "carried_out" in report.CSV_FIELDS and not [f for f in report.CSV_FIELDS if "exact" in f]
    for results in (_results("lethe-robust", carried=False), _results(carried=True), _results("paper")):
        report.append_csv(str(tmp_path), results, "folder")
    rows = _rows(tmp_path / "results.csv")
    assert [(r["method"], r["recipe"], r["carried_out"]) for r in rows] == [
        ("lethe", "lethe-robust", "false"), ("lethe", "paper", "true"), ("lethe", "paper", "")]
    with open(tmp_path / "results.csv", encoding="utf-8") as handle:
        assert handle.readline().startswith("time,task,method,recipe,scenario,")


def test_a_csv_from_before_the_recipe_column_keeps_its_rows_readable(tmp_path):
    """Rows written under the header without ``recipe`` and ``carried_out`` are rewritten under the
    current one (those columns empty: nothing said then what ran), and the new row lands under its names."""
    old_fields = [f for f in report.CSV_FIELDS if f not in ("recipe", "carried_out")]
    with open(tmp_path / "results.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=old_fields)
        writer.writeheader()
        writer.writerow({**{f: "" for f in old_fields}, "method": "old", "scenario": "class", "unlearned_mia": "0.25"})
    report.append_csv(str(tmp_path), _results("lethe-robust", carried=False), "folder")
    rows = _rows(tmp_path / "results.csv")
    assert [(r["method"], r["recipe"], r["scenario"], r["carried_out"]) for r in rows] == [
        ("old", "", "class", ""), ("lethe", "lethe-robust", "class", "false")]
    assert rows[0]["unlearned_mia"] == "0.25" and rows[1]["unlearned_mia"] == "0.5"


def test_the_run_recipe_reads_older_results_as_the_paper():
    assert report.run_recipe({"method": "lethe"}) == "paper"
    assert report.run_recipe({"method": "lethe", "recipe": "lethe-robust"}) == "lethe-robust"
    assert report.run_recipe({"method": "lethe", "config": {"recipe": "lethe-robust"}}) == "lethe-robust"
    assert report.carried_out({"method": {"carried_out": False}}) is False
    assert report.carried_out({"method": {}}) is None and report.carried_out({}) is None


def _legend(fig):
    return [text.get_text() for text in fig.axes[0].get_legend().get_texts()]


def test_the_kr_plot_names_the_curve_with_its_recipe_where_it_is_not_the_papers(tmp_path, monkeypatch):
    res = _results()["resurfacing"]
    assert _legend(report.kr_curve_figure(res, "t", "lethe (lethe-robust)"))[0] == \
        "lethe (lethe-robust): unlearned, continued"
    fig = report.kr_curve_figure(res, "t", report.method_label({"method": "lethe", "recipe": "paper"}))
    assert _legend(fig) == ["lethe: unlearned, continued", "original", "retrain"]
    labels, figure = [], report.kr_curve_figure
    monkeypatch.setattr(report, "kr_curve_figure",
                        lambda r, title, label=None, **kw: labels.append(label) or figure(r, title, label, **kw))
    for recipe in ("lethe-robust", "paper", None):  # None: a results.json from before run.recipe
        folder = tmp_path / str(recipe)
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(_results(recipe)))
        path = report.plot_kr_curve(str(folder), res, "lethe / class / digits")  # as the experiment calls it
        assert path == str(folder / "kr_curve.png") and (folder / "kr_curve.png").stat().st_size > 1000
    assert labels == ["lethe (lethe-robust)", "lethe", "lethe"]
    report.plot_kr_curve(str(tmp_path / "None"), res, "t", run={"method": "fedup", "recipe": "fedup-x"})
    assert labels[-1] == "fedup (fedup-x)"  # a run block given wins over the folder's results.json
