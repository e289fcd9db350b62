"""The FIRM tables command (benchmarks/firm_tables.py): matched-forgetting selection and one end-to-end run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # a script folder, not a package
from firm_tables import BENCHMARKS, main, matched_points, sweep_table  # noqa: E402


def row(label, forget, utility, method="FIRM", gamma=1.0):
    return {"label": label, "method": method, "gamma": gamma, "forget_mc_acc": forget, "utility": utility,
            "update_norm": 0.5}


def test_each_other_point_is_matched_to_the_reference_point_with_the_closest_forget_metric():
    firm = [row("F1", 0.60, 0.55), row("F2", 0.45, 0.50), row("F3", 0.30, 0.40)]
    fulm = [row("U1", 0.43, 0.46, "FULM"), row("U2", 0.33, 0.20, "FULM"), row("U3", 0.9, 0.6, "FULM")]
    matches = matched_points(firm, fulm, "forget_mc_acc")
    assert [(m["reference"], m["other"]) for m in matches] == [("F2", "U1"), ("F3", "U2"), ("F1", "U3")]
    assert matches[0]["delta_utility"] == pytest.approx(0.50 - 0.46)
    assert matches[0]["forget_gap"] == pytest.approx(0.02)


def test_points_without_a_forget_metric_are_never_matched_and_ties_take_the_earlier_point():
    firm = [row("F1", None, 0.5), row("F2", 0.4, 0.3), row("F3", 0.6, 0.9)]
    others = [row("A", 0.5, 0.4, "AVG", None), row("B", math.nan, 0.4, "SUM", None)]
    matches = matched_points(firm, others, "forget_mc_acc")
    assert [(m["reference"], m["other"]) for m in matches] == [("F2", "A")]


def test_the_sweep_table_marks_utility_at_chance_and_lists_gamma_and_norm():
    table = sweep_table([row("F", 0.3, 0.25, gamma=2.0)], BENCHMARKS[0])
    assert "| FIRM | 2 |" in table and "25.00†" in table and "0.5" in table


@pytest.mark.slow
def test_the_command_writes_every_table_the_plots_and_results_over_one_upload_round(tmp_path):
    out = main(["--quick", "--out", str(tmp_path), "--gammas", "0.5,1,2,4,8"])
    text = (out / "tables.md").read_text()
    for table in ("Table 1", "Table 2", "Table 3", "Table 4", "Matched forgetting"):
        assert table in text
    for task in ("llm-wmdp", "llm-tofu-forget01", "llm-muse"):
        assert (out / f"fig2_{task}.png").stat().st_size > 0
        results = json.loads((out / task / "results.json").read_text())
        swept = [m for m in results["models"].values() if m.get("method") in ("FIRM", "FULM")]
        assert len(swept) == 10 and all(m["update_norm"] > 0 for m in swept)
        assert results["cost"]["unlearn"]["rounds"] == 1  # one set of uploads for every merge
