"""The plots a person looks at: ``kr_curve.png`` (one run, ``server_app.report``), ``kr_curves.png`` (the
comparison runner) and ``features_pca.png`` (``tasks.diagnostics``) share one style (``tasks.plot_style``):
one colour and line style per method in every plot, legends outside the data, whole-round x ticks, marked
(flagged / not carried out) runs dashed and named so, lines at the same value still told apart."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import pytest
import torch
from matplotlib import pyplot as plt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb

from server_app import report
from tasks import plot_style
from tasks.diagnostics import pca_scatter_figure, pca_scatter_png

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # a script folder, not a package
import compare_methods as compare


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _distance(a, b) -> float:
    return sum((x - y) ** 2 for x, y in zip(to_rgb(a), to_rgb(b))) ** 0.5


def _declared(method: str) -> str:
    """The colour a method declares in its package (``MethodSpec.style``)."""
    from strategies.registry import method_styles

    return method_styles()[method][0]


def _luminance(colour) -> float:
    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4
    r, g, b = (linear(c) for c in to_rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


# ----------------------------------------------------------------------------- the style map

def test_each_method_declares_one_fixed_strong_colour_and_retrain_and_lethe_differ_clearly():
    from strategies.registry import method_names, method_styles

    styles = method_styles()
    assert plot_style.method_colour("lethe", styles) == styles["lethe"][0] == \
        plot_style.line_style("lethe", styles=styles)["color"]
    assert _distance(plot_style.method_colour("retrain", styles), plot_style.method_colour("lethe", styles)) > 0.8
    registered = method_names()
    missing = [m for m in registered if m not in styles]
    assert not missing, f"give these registered methods a style (MethodSpec.style) in their package: {missing}"
    colours = [plot_style.method_colour(m, styles) for m in registered]
    close = [(a, b) for i, a in enumerate(registered) for b in registered[i + 1:]
             if _distance(plot_style.method_colour(a, styles), plot_style.method_colour(b, styles)) < 0.15]
    assert not close, f"colours too alike: {close}"
    pale = [m for m, c in zip(registered, colours) if _luminance(c) > 0.5]
    assert not pale, f"pale colours: {pale}"
    for method in registered:  # every method drawn solid, with a marker on every point
        style = plot_style.line_style(method, styles=styles)
        assert style["linestyle"] == "-" and style["marker"] not in (None, "", "None")


def test_a_recipe_variant_keeps_its_methods_colour_in_another_line_style_and_a_marked_run_is_dashed():
    paper, robust = plot_style.line_style("lethe", "paper"), plot_style.line_style("lethe", "lethe-robust")
    assert paper == plot_style.line_style("lethe") == plot_style.label_style("lethe")
    assert robust == plot_style.label_style("lethe (lethe-robust)")
    assert robust["color"] == paper["color"]
    assert robust["linestyle"] != paper["linestyle"] and robust["linestyle"] != "--"  # dashed means marked
    assert robust["markerfacecolor"] != paper["markerfacecolor"]  # hollow markers
    assert plot_style.line_style("lethe", marked=True)["linestyle"] == "--"
    assert plot_style.line_style("lethe", "lethe-robust", marked=True)["linestyle"] == "--"
    assert plot_style.split_label("lethe (lethe-robust)") == ("lethe", "lethe-robust")
    assert plot_style.split_label("exact-fun") == ("exact-fun", "paper")


def test_an_unknown_label_gets_the_same_strong_style_in_every_process():
    style = plot_style.label_style("brand-new-method (its-recipe)")
    assert style == plot_style.label_style("brand-new-method (its-recipe)")
    assert style["color"] in plot_style.FALLBACK_COLOURS and _luminance(style["color"]) <= 0.5
    code = ("from tasks import plot_style; s = plot_style.label_style('brand-new-method (its-recipe)'); "
            "print(s['color'], s['marker'], s['linestyle'])")
    root = str(Path(__file__).resolve().parents[1])
    seen = {subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": seed, "PATH": ""}).stdout for seed in ("1", "2")}
    assert seen == {f"{style['color']} {style['marker']} {style['linestyle']}\n"}


# ----------------------------------------------------------------------------- layout helpers

def _assert_legend_outside(fig, ax, legend=None):
    if not hasattr(fig.canvas, "get_renderer"):  # a bare Figure (the PCA plot): give it an Agg canvas
        FigureCanvasAgg(fig)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    legend = legend or ax.get_legend()
    box, axes_box = legend.get_window_extent(renderer), ax.get_window_extent(renderer)
    assert box.x0 >= axes_box.x1 - 0.5, (box, axes_box)  # right of the data area: covers no curve
    assert box.x1 <= fig.bbox.x1 + 0.5 and box.y0 >= fig.bbox.y0 - 0.5  # and inside the figure


def _assert_whole_round_ticks(fig, ax, last_round):
    fig.canvas.draw()
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), ticks
    assert min(ticks) == 0 and max(ticks) >= last_round
    texts = [t.get_text() for t in ax.get_xticklabels() if t.get_text() and low <= t.get_position()[0] <= high]
    assert texts and all(re.fullmatch(r"\d+", t) for t in texts), texts


# ----------------------------------------------------------------------------- kr_curve.png (one run)

RES = {"kr_unlearned": 0.0, "kr_curve": [0.0], "kr_original": 1.0, "kr_retrain": 0.0, "ct_kr": 0.0, "rr": 0.0}


@pytest.mark.parametrize("curve", [[], [0.0], [0.1, 0.4, 0.2]])
def test_the_kr_curve_has_its_legend_outside_and_whole_round_ticks(curve):
    fig = report.kr_curve_figure({**RES, "kr_curve": curve}, "lethe / class / digits-lenet5", "lethe")
    ax = fig.axes[0]
    _assert_legend_outside(fig, ax)
    _assert_whole_round_ticks(fig, ax, len(curve))
    assert "forget accuracy" in ax.get_ylabel() and "round" in ax.get_xlabel()
    assert "lethe / class / digits-lenet5" in ax.get_title() and "forget accuracy" in ax.get_title()
    line = ax.get_lines()[0]
    assert line.get_color() == _declared("lethe") and line.get_linestyle() == "-"
    assert line.get_marker() not in (None, "", "None")
    retrain = next(l for l in ax.get_lines() if l.get_label() == "retrain")
    assert retrain.get_color() == _declared("retrain")  # retrain's colour in every plot


def test_a_flagged_or_not_carried_out_run_is_drawn_dashed_and_named_so(tmp_path, monkeypatch):
    figures, build = [], report.kr_curve_figure
    monkeypatch.setattr(report, "kr_curve_figure", lambda *a, **kw: figures.append(build(*a, **kw)) or figures[-1])
    results = {"run": {"method": "lethe", "recipe": "lethe-robust"}, "method": {"carried_out": False},
               "validity": {"failed": ["original_learned"], "reasons": ["x"]}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    path = report.plot_kr_curve(str(tmp_path), RES, "lethe / class / digits")
    assert Path(path).stat().st_size > 1000
    line = figures[-1].axes[0].get_lines()[0]
    assert line.get_linestyle() == "--" and line.get_color() == _declared("lethe")
    assert line.get_label() == "lethe (lethe-robust) (flagged, not carried out): unlearned, continued"
    fig = figures[-1]
    _assert_legend_outside(fig, fig.axes[0])
    assert fig.axes[0].get_position().width > 0.45  # the long entry is wrapped, not squeezing the data area
    assert "(flagged, not carried out)" in fig.axes[0].get_legend().get_texts()[0].get_text().replace("\n", " ")
    (tmp_path / "results.json").write_text(json.dumps({**results, "method": {}, "validity": {"failed": []}}))
    report.plot_kr_curve(str(tmp_path), RES, "t")
    line = figures[-1].axes[0].get_lines()[0]
    assert line.get_linestyle() != "--" and line.get_label() == "lethe (lethe-robust): unlearned, continued"


# ----------------------------------------------------------------------------- kr_curves.png (the runner)

def _row(seed, method, recipe="paper", scenario="class", curve=(0.0, 0.0), **values):
    return {"task": "digits-lenet5", "scenario": scenario, "seed": seed, "method": method, "recipe": recipe,
            "status": "ok", "flags": [], "reasons": [], "kr_unlearned": 0.0, "kr_curve": list(curve),
            "diverged_at_round": None, **values}


def _lines(ax):
    return {line.get_label(): line for line in ax.get_lines()}


def test_the_runners_curves_keep_each_methods_style_legend_outside_and_whole_rounds():
    rows = [_row(1, "retrain", curve=[0.0]), _row(1, "lethe", curve=[0.0]), _row(1, "fedup", curve=[0.0]),
            _row(1, "lethe", "lethe-robust", curve=[0.0]), _row(1, "lethe", scenario="sample", curve=[0.0])]
    fig = compare.curves_figure(rows)
    assert len(fig.axes) == 2
    for ax in fig.axes:
        _assert_legend_outside(fig, ax)
        _assert_whole_round_ticks(fig, ax, 1)  # a 2-round axis: 0 and 1, nothing between
        assert "forget accuracy" in ax.get_ylabel() and "round" in ax.get_xlabel()
    assert "forget accuracy" in fig.get_suptitle()
    lines = _lines(fig.axes[0])
    assert list(lines) == ["retrain (paper)", "lethe (paper)", "fedup (paper)", "lethe (lethe-robust)"]
    single = report.kr_curve_figure(RES, "t", "lethe").axes[0].get_lines()[0]
    assert lines["lethe (paper)"].get_color() == single.get_color() == _lines(fig.axes[1])["lethe (paper)"].get_color()
    assert lines["retrain (paper)"].get_color() != lines["lethe (paper)"].get_color()
    assert lines["lethe (lethe-robust)"].get_color() == lines["lethe (paper)"].get_color()
    assert lines["lethe (lethe-robust)"].get_linestyle() != lines["lethe (paper)"].get_linestyle()
    # all four lie at KR 0: each has a marker on every point, and no two are drawn alike
    drawn = [(l.get_linewidth(), l.get_markersize(), l.get_marker(), l.get_color()) for l in lines.values()]
    assert all(d[2] not in (None, "", "None") for d in drawn)
    assert len({d[:2] for d in drawn}) == len(drawn) and len(set(drawn)) == len(drawn)


def test_the_runners_flagged_and_not_carried_out_seeds_are_dashed_named_and_averaged_apart():
    rows = [_row(1, "lethe", curve=[0.2, 0.2]), _row(2, "lethe", curve=[0.8, 0.8], flags=["original_learned"]),
            _row(1, "fedup", carried_out=False), _row(1, "retrain")]
    lines = _lines(compare.curves_figure(rows).axes[0])
    assert list(lines) == ["lethe (paper)", "lethe (paper) — flagged 1/2", "fedup (paper) — not carried out",
                           "retrain (paper)"]
    assert lines["lethe (paper)"].get_linestyle() == "-" and lines["retrain (paper)"].get_linestyle() == "-"
    assert lines["lethe (paper) — flagged 1/2"].get_linestyle() == "--"
    assert lines["fedup (paper) — not carried out"].get_linestyle() == "--"
    assert list(lines["lethe (paper)"].get_ydata()) == [0.0, 0.2, 0.2]  # the flagged seed is not in its mean
    assert list(lines["lethe (paper) — flagged 1/2"].get_ydata()) == [0.0, 0.8, 0.8]


def test_the_runner_writes_a_png_that_is_not_clipped(tmp_path):
    path = tmp_path / "kr_curves.png"
    compare.plot_curves([_row(1, "retrain"), _row(1, "lethe", flags=["original_usable"])], str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 1000


# ----------------------------------------------------------------------------- features_pca.png

def test_the_pca_plot_keeps_its_panels_grey_retained_red_forget_and_a_legend_outside(tmp_path):
    g = torch.Generator().manual_seed(0)
    feats = {name: (torch.randn(30, 5, generator=g), torch.randn(10, 5, generator=g) + 3)
             for name in ("original", "retrain", "unlearned")}
    fig = pca_scatter_figure(feats)
    assert len(fig.axes) == 3 and "PCA" in fig.get_suptitle() and "retained" in fig.get_suptitle()
    for ax, name in zip(fig.axes, feats):
        assert ax.get_title().startswith(f"{name} model (FD=")
        retained, forget = ax.collections
        assert to_rgb(retained.get_facecolor()[0][:3]) == to_rgb(plot_style.RETAINED_COLOUR)
        assert to_rgb(forget.get_facecolor()[0][:3]) == to_rgb(plot_style.FORGET_COLOUR)
        assert ax.get_legend() is None  # no legend inside a panel
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["retained data", "forget set"]
    _assert_legend_outside(fig, fig.axes[-1], fig.legends[0])
    assert pca_scatter_png(tmp_path / "features_pca.png", feats) == str(tmp_path / "features_pca.png")
