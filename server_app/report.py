"""Results: ``results.json`` (the run's contract, see the README), one CSV row per run, and plots.

All files are written atomically. The run folder is ``<outputs-dir>/<utc-time>-<task>-<method>-
<scenario>-s<seed>``, created exclusively (``-2``, ``-3`` ... when that name is taken, e.g. by an
identical run started in the same second); the CSV (``<outputs-dir>/results.csv``) gains one row per
run under a file lock, so parallel runs of a sweep become one table without losing rows.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from collections.abc import Iterable
from importlib import metadata

from core.files import atomic_path, locked, write_text

CSV_FIELDS = ("time", "task", "method", "recipe", "scenario", "seed", "init_seed", "num_clients",
              "original_test_acc", "original_forget_acc", "unlearned_retain_acc", "unlearned_forget_acc",
              "unlearned_test_acc", "unlearned_mia", "unlearned_mia_efficacy", "unlearned_target_rate", "ct_kr", "rr",
              "unlearn_seconds", "unlearn_bytes_up", "unlearn_bytes_down", "carried_out", "validity_failed", "folder")
VERSIONED = ("flwr", "torch", "torchvision", "scikit-learn", "flwr-datasets", "transformers", "peft")


def package_versions() -> dict[str, str]:
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "absent"
    return out


def run_recipe(run: dict) -> str:
    """The recipe a run's ``results.json`` says it ran (``run.recipe``): ``"paper"`` where none was
    selected, else the recipe's name. A results.json from before the key existed has none (read as
    ``"paper"``, or the ``recipe`` its run config names, where it names one)."""
    recipe = run.get("recipe")
    if recipe is None:
        recipe = (run.get("config") or {}).get("recipe")
    return str(recipe) if recipe else "paper"


def carried_out(results: dict) -> bool | None:
    """``method.carried_out``: False where the method did not carry the request out (it still reports
    its own model), True where its own check passed, None where nothing judged it."""
    value = (results.get("method") or {}).get("carried_out")
    return value if isinstance(value, bool) else None


def method_label(run: dict) -> str:
    """A run's method as plots name it: ``"M"`` for method M's paper, ``"M (R)"``
    for it under a recipe."""
    recipe = run_recipe(run)
    return run.get("method", "?") if recipe == "paper" else f"{run.get('method', '?')} ({recipe})"


def run_folder(outputs_dir: str, cfg: dict) -> str:
    """Create this run's new, empty results folder and return its path (never one another run holds)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = os.path.join(os.path.abspath(os.path.expanduser(outputs_dir)),
                        f"{stamp}-{cfg['task']}-{cfg['method']}-{cfg['scenario']}-s{cfg['seed']}")
    os.makedirs(os.path.dirname(base), exist_ok=True)
    attempt = 1
    while True:
        folder = base if attempt == 1 else f"{base}-{attempt}"
        try:
            os.mkdir(folder)  # atomic and exclusive: exactly one process creates each name
            return folder
        except FileExistsError:
            attempt += 1


#: the phase that makes each model (results.json ``saw_fewer_clients``: a model whose phase lost a node)
MODEL_PHASES = {"original": "pretrain", "retrain": "retrain", "unlearned": "unlearn", "continued": "continue"}


def saw_fewer_clients(fed, models: Iterable[str] = tuple(MODEL_PHASES)) -> dict[str, list[dict]]:
    """``models`` whose phase lost a node (``fed``: the run's Federation), each with the nodes it missed."""
    return {model: missed for model in models if (missed := fed.missed(MODEL_PHASES[model]))}


def replace_nonfinite(value, replacement):
    """``value`` with every non-finite float (JSON has no NaN or inf) replaced by ``replacement(it)``,
    through nested dicts and lists."""
    if isinstance(value, float) and not math.isfinite(value):
        return replacement(value)
    if isinstance(value, dict):
        return {k: replace_nonfinite(v, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [replace_nonfinite(v, replacement) for v in value]
    return value


def write_results(folder: str, results: dict) -> str:
    path = os.path.join(folder, "results.json")
    # a figure that could not be measured is written null
    write_text(path, json.dumps(replace_nonfinite(results, lambda _: None), indent=2, sort_keys=False))
    return path


def append_csv(outputs_dir: str, results: dict, folder: str) -> str:
    """Append one row (header first when the file is new): under the CSV's lock, the file is read
    and rewritten atomically, so a crash never truncates it and parallel runs never drop a row."""
    path = os.path.join(os.path.abspath(os.path.expanduser(outputs_dir)), "results.csv")
    models, res, cost = results["models"], results["resurfacing"], results["cost"]["unlearn"]
    unlearned = models.get("unlearned", {})
    row = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "task": results["run"]["task"],
        "method": results["run"]["method"], "recipe": run_recipe(results["run"]),
        "scenario": results["run"]["scenario"],
        "seed": results["run"]["seed"], "init_seed": results["run"].get("init_seed", ""),
        "num_clients": results["run"]["num_clients"],
        "original_test_acc": models["original"]["test_acc"], "original_forget_acc": models["original"]["forget_acc"],
        "unlearned_retain_acc": unlearned.get("retain_acc"), "unlearned_forget_acc": unlearned.get("forget_acc"),
        "unlearned_test_acc": unlearned.get("test_acc"), "unlearned_mia": unlearned.get("mia"),
        "unlearned_mia_efficacy": unlearned.get("mia_efficacy"),
        "unlearned_target_rate": unlearned.get("target_rate", ""), "ct_kr": res.get("ct_kr"), "rr": res.get("rr"),
        "unlearn_seconds": cost["seconds"], "unlearn_bytes_up": cost["bytes_up"],
        "unlearn_bytes_down": cost["bytes_down"],
        "carried_out": {True: "true", False: "false", None: ""}[carried_out(results)],
        "validity_failed": ";".join(results.get("validity", {}).get("failed", [])), "folder": folder,
    }
    with locked(path):
        previous = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=CSV_FIELDS)
        if previous and previous.splitlines()[0].split(",")[:len(CSV_FIELDS)] != list(CSV_FIELDS):
            previous = _under_current_header(previous)
        if not previous:
            writer.writeheader()
        writer.writerow(row)
        write_text(path, previous + buffer.getvalue())
    return path


def _under_current_header(text: str) -> str:
    """The rows of a CSV written under an older header, rewritten under ``CSV_FIELDS`` (a column the
    old file lacks is empty; a column it has that ``CSV_FIELDS`` lacks is kept at the end), so a new
    row never lands under the wrong column names and no old value is lost."""
    rows = list(csv.DictReader(io.StringIO(text)))
    extra = [name for name in (rows[0].keys() if rows else ()) if name not in CSV_FIELDS]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=(*CSV_FIELDS, *extra), restval="")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def plot_kr_curve(folder: str, resurfacing: dict, title: str, run: dict | None = None) -> str:
    """PNG of forget accuracy (KR) over the continued-training rounds, with the reference lines. The
    curve is named by the run's method, with its recipe where that is not the paper's (``run``: the
    results' ``run`` block; by default read from the folder's results.json), and drawn dashed and
    marked in the legend where the folder's results.json says its validity checks failed
    (``(flagged)``) or the method did not carry the request out (``(not carried out)``)."""
    from matplotlib import pyplot as plt

    results = {}
    path = os.path.join(folder, "results.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as handle:
            results = json.load(handle)
    if run is None:
        run = results.get("run") or {}
    fig = kr_curve_figure(resurfacing, title, method_label(run) if run else None, marks=run_marks(results))
    path = os.path.join(folder, "kr_curve.png")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def run_marks(results: dict) -> tuple[str, ...]:
    """What a run's curve is marked with: ``flagged`` (a validity check failed), ``not carried out``."""
    return (("flagged",) if (results.get("validity") or {}).get("failed") else ()) + \
        (("not carried out",) if carried_out(results) is False else ())


def kr_curve_figure(resurfacing: dict, title: str, label: str | None = None, marks: tuple[str, ...] = ()):
    """The figure of :func:`plot_kr_curve`; ``label`` names the method's curve (e.g. ``"M
    (R)"``: method M with recipe R), drawn in the method's style (``tasks.plot_style``); ``marks`` (``flagged``,
    ``not carried out``) draw it dashed and name them in the legend. The legend sits right of the
    axes, the x axis has whole rounds only."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from strategies.registry import method_styles
    from tasks.plot_style import (
        ORIGINAL_COLOUR,
        label_style,
        legend_outside,
        line_style,
        overlap_style,
        whole_rounds,
    )

    styles = method_styles()
    curve = [resurfacing["kr_unlearned"]] + list(resurfacing["kr_curve"])
    note = f" ({', '.join(marks)})" if marks else ""
    fig, ax = plt.subplots(figsize=(7.2, 3.6), layout="constrained")
    style = label_style(label, bool(marks), styles) if label else line_style("?", marked=bool(marks))
    ax.plot(range(len(curve)), curve, **{**style, **overlap_style(0)},
            label=f"{label}{note}: unlearned, continued" if label else f"unlearned, continued{note}")
    references = (("kr_original", "original", {"color": ORIGINAL_COLOUR, "linestyle": ":"}),
                  ("kr_retrain", "retrain", {**line_style("retrain", styles=styles), "marker": None}))
    for key, name, ref_style in references:
        if resurfacing.get(key) is not None and not math.isnan(resurfacing[key]):
            ax.axhline(resurfacing[key], linewidth=1.2, alpha=0.85, zorder=2, label=name, **ref_style)
    whole_rounds(ax, len(curve))
    ax.set_xlabel("continued-training round on retained data (0 = right after unlearning)")
    ax.set_ylabel("forget accuracy (KR)")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.25)
    ax.set_title(f"Knowledge resurfacing: forget accuracy over continued training\n{title}", fontsize=10)
    legend_outside(ax)
    return fig
