"""FIRM's Tables 1-4 and Fig. 2 in miniature, over the app's phases: one set of uploads, many merges.

For each benchmark task the FIRM paper reports on (sec. 5.2-5.4), one federation runs in process
(``server_app.inprocess``) through the app's own phases and code: setup and hello (clients declare
their forget domains), the cached original (FedAvg pretraining) and retrain oracle, then **one**
``query.fisher`` round (``strategies.firm.strategy.FisherMerge.collect``: every forget and retain
client uploads its task vector and Fisher once). From those uploads the server merges, without
asking the clients again,

* FIRM-base (``firm.epsilon`` = inf, the paper's Tables 1-4) at every ``--gammas`` value,
* FULM at every ``--gammas`` value (its scale, swept independently in the paper),
* AVG (unit scale), SUM (scale 0.05) and TIES (density 0.5), the settings of the paper's Table 2,

and every merged model (original adapter + merged update) is evaluated by the clients in one
``evaluate`` round with the task's metrics. Tables (``tables.md``):

* Table 1 (``llm-wmdp``): per method and gamma, Bio / Cyber (forget-domain accuracy, lower = forgotten),
  Utility (MMLU-style accuracy) and the merged update's L2 norm; ``†`` marks utility at or below
  chance (0.25, the paper's collapse mark);
* Table 2 (``llm-wmdp``): AVG / SUM / TIES at their settings beside FIRM at gamma 1;
* Table 3 (``llm-tofu-forget01``): Fgt / Ret / RA / RW ROUGE-L and Util (RA / RW only on TOFU files);
* Table 4 (``llm-muse``): HP (KnowMem forget ROUGE-L) and Util;

each with the operating points at matched forgetting (`matched_points`: for each FULM gamma and each
baseline, the FIRM gamma whose forget metric is closest, and the two utilities), and a Fig. 2-like
plot per task, forget metric against utility (``fig2_<task>.png``). Every task's models go to
``<task>/results.json`` in the app's results-contract shape (run, models, cost); files are written
atomically. Offline default: the tiny model and the synthetic data, a few minutes on a CPU.

    python benchmarks/firm_tables.py                      # writes outputs/firm_tables/
    python benchmarks/firm_tables.py --tables 1,2 --gammas 0.5,1,2,4,8
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from flwr.app import ArrayRecord  # noqa: E402

from core.files import atomic_path, write_text  # noqa: E402
from server_app.evaluation import evaluate_models  # noqa: E402
from server_app.experiment import Experiment  # noqa: E402
from server_app.inprocess import InProcessGrid  # noqa: E402
from server_app.report import package_versions, write_results  # noqa: E402
from strategies.common.base import ModelState  # noqa: E402
from strategies.common.federation import Federation  # noqa: E402
from strategies.firm.aggregate import FIRM  # noqa: E402
from strategies.merges.merge import merge_baseline  # noqa: E402
from strategies.registry import method_for  # noqa: E402
from strategies.run_config import parse_config  # noqa: E402

CHANCE = 0.25
"""Four-option accuracy by chance: the paper's utility-collapse mark."""
BASELINES = (("avg", {"scale": 1.0}), ("sum", {"scale": 0.05}), ("ties", {"scale": 1.0, "density": 0.5}))
"""The merge baselines at the paper's Table 2 settings (App. C: AVG unit scale, SUM 0.05, TIES 0.5)."""


@dataclass(frozen=True)
class Benchmark:
    """One task of the paper's tables: its columns (results key, header) and its forget metric."""

    task: str
    columns: tuple[tuple[str, str], ...]
    forget_key: str
    tables: tuple[int, ...]


BENCHMARKS = (
    Benchmark("llm-wmdp", (("forget_mc_acc_bio", "Bio↓"), ("forget_mc_acc_cyber", "Cyber↓"), ("utility", "Utility↑")),
              "forget_mc_acc", (1, 2)),
    Benchmark("llm-tofu-forget01", (("forget_rouge", "Fgt↓"), ("retain_rouge", "Ret↑"), ("real_authors_rouge", "RA↑"),
                                    ("world_facts_rouge", "RW↑"), ("utility", "Util↑")), "forget_rouge", (3,)),
    Benchmark("llm-muse", (("knowmem_forget_rouge", "HP↓"), ("utility", "Util↑")), "knowmem_forget_rouge", (4,)),
)


# ------------------------------------------------------------------------------------------- pure
def _value(row: dict, key: str) -> float:
    value = row.get(key)
    return math.nan if value is None else float(value)


def matched_points(reference: list[dict], others: list[dict], forget_key: str) -> list[dict]:
    """For each row of ``others``, the row of ``reference`` whose ``forget_key`` is closest (ties: the
    earlier row); rows without a forget metric are skipped. Each match: both rows' labels, forget
    metrics and utilities, the forget gap and ``delta_utility`` = reference minus other."""
    usable = [r for r in reference if not math.isnan(_value(r, forget_key))]
    matches = []
    for other in others:
        target = _value(other, forget_key)
        if math.isnan(target) or not usable:
            continue
        best = min(usable, key=lambda r: abs(_value(r, forget_key) - target))
        matches.append({"reference": best["label"], "other": other["label"],
                        "reference_forget": _value(best, forget_key), "other_forget": target,
                        "forget_gap": abs(_value(best, forget_key) - target),
                        "reference_utility": _value(best, "utility"), "other_utility": _value(other, "utility"),
                        "delta_utility": _value(best, "utility") - _value(other, "utility")})
    return matches


def _cell(value: float, key: str) -> str:
    if math.isnan(value):
        return "–"
    text = f"{100 * value:.2f}"
    return text + "†" if key == "utility" and value <= CHANCE else text


def sweep_table(rows: list[dict], bench: Benchmark) -> str:
    """The paper's sweep layout: one row per method and gamma, the task's columns, ``‖Δ‖``."""
    header = ["Method", "γ", *(name for _, name in bench.columns), "‖Δ‖"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        gamma = "–" if row.get("gamma") is None else f"{row['gamma']:g}"
        norm = "–" if row.get("update_norm") is None else f"{row['update_norm']:.4g}"
        cells = [_cell(_value(row, key), key) for key, _ in bench.columns]
        lines.append("| " + " | ".join([row["method"], gamma, *cells, norm]) + " |")
    return "\n".join(lines)


def matched_table(matches: list[dict]) -> str:
    """Matched-forgetting operating points (FIRM is the reference)."""
    lines = ["| FIRM | other | forget (FIRM / other) | utility (FIRM / other) | Δ utility |", "|---|---|---|---|---|"]
    for m in matches:
        lines.append(f"| {m['reference']} | {m['other']} | {100 * m['reference_forget']:.2f} / "
                     f"{100 * m['other_forget']:.2f} | {100 * m['reference_utility']:.2f} / "
                     f"{100 * m['other_utility']:.2f} | {100 * m['delta_utility']:+.2f} |")
    return "\n".join(lines)


def plot_frontier(path: str, rows: list[dict], bench: Benchmark) -> None:
    """Fig. 2-like: forget metric (x, lower = more forgotten) against utility (y), one line per swept
    method, the baselines and the original as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from strategies.registry import method_styles
    from tasks.plot_style import method_colour, method_marker

    styles = method_styles()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method in dict.fromkeys(r["method"] for r in rows):
        points = [r for r in rows if r["method"] == method]
        colour, marker = method_colour(method.lower(), styles), method_marker(method.lower(), styles)
        xs, ys = [_value(r, bench.forget_key) for r in points], [_value(r, "utility") for r in points]
        ax.plot(xs, ys, marker=marker, color=colour, label=method, linestyle="-" if len(points) > 1 else "none")
        for r, x, y in zip(points, xs, ys):
            if r.get("gamma") is not None and len(points) > 1:
                ax.annotate(f"{r['gamma']:g}", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 3))
    ax.set_xlabel(f"{bench.forget_key} (lower = more forgotten)")
    ax.set_ylabel("utility")
    ax.set_title(f"{bench.task}: forgetting vs utility")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)


# ------------------------------------------------------------------------------------- federation
def merged_models(uploads: list[dict], shapes: dict, original: dict, gammas: list[float], cfg) -> list[tuple]:
    """``(label, method, gamma, state, report)`` of every merge of the one set of uploads."""
    def adapter(update):
        return {k: original[k] + update[k].to(original[k].dtype) for k in original}

    out = []
    for gamma in gammas:
        update, report = FIRM(gamma=gamma, alpha=cfg["firm.alpha"], eps0=cfg["firm.eps0"]).aggregate(uploads, shapes)
        out.append((f"FIRM γ={gamma:g}", "FIRM", gamma, adapter(update), report))
    for gamma in gammas:
        update, report = merge_baseline("fulm", uploads, gamma, expected_shapes=shapes,
                                        threshold=cfg["fulm.threshold"], density=cfg["fulm.density"])
        out.append((f"FULM γ={gamma:g}", "FULM", gamma, adapter(update), report))
    for name, params in BASELINES:
        settings = dict(params)
        scale = settings.pop("scale")
        update, report = merge_baseline(name, uploads, scale, expected_shapes=shapes, **settings)
        label = f"{name.upper()} " + " ".join(f"{k}={v:g}" for k, v in params.items())
        out.append((label, name.upper(), None, adapter(update), report))
    return out


def run_benchmark(bench: Benchmark, run_config: dict, clients: int, gammas: list[float], out: Path) -> list[dict]:
    """One federation of ``bench.task``: phases, one upload round, every merge evaluated; the rows."""
    config = {**run_config, "task": bench.task, "method": "firm"}
    cfg = parse_config(config)
    fed = Federation(InProcessGrid(clients, config), round_timeout=cfg["round-timeout"],
                     min_reply_fraction=cfg["min-reply-fraction"])
    exp = Experiment(fed, config)
    exp.setup()
    original = exp.original()
    retrain = exp.retrain()
    ctx = exp.unlearn_context(original, exp.model_ids["original"])
    exp.say("unlearn: one query.fisher round, then every merge on the server")
    exp.fed.start_phase("unlearn")
    uploads, asked = method_for("firm").collect(ctx)
    state = original.arrays.to_torch_state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    merges = merged_models(uploads, shapes, state, gammas, exp.cfg)
    keys = {label: "-".join(label.lower().replace("=", "").split()) for label, *_ in merges}  # names that travel
    models = {"original": original, "retrain": retrain,
              **{keys[label]: ModelState(ArrayRecord(adapter)) for label, _, _, adapter, _ in merges}}
    exp.say(f"evaluate: {len(models)} models, in one round")
    entries = evaluate_models(exp.fed, exp.cfg, models)
    retrain_entry = entries.pop("retrain")
    exp.cfg.task.finish_entries(list(entries.values()), retrain_entry)
    rows = [{"label": "Original", "method": "Original", "gamma": None, "update_norm": None, **entries["original"]}]
    for label, method, gamma, _, report in merges:
        rows.append({"label": label, "method": method, "gamma": gamma, "update_norm": report.merged_norm,
                     **entries[keys[label]]})
    folder = out / bench.task
    folder.mkdir(parents=True, exist_ok=True)
    write_results(str(folder), {
        "run": {"task": bench.task, "num_clients": exp.fed.num_clients, "gammas": gammas,
                "forget_clients": asked.get("forget", []), "config": exp.cfg.as_dict(),
                "versions": package_versions()},
        "models": {"original": entries["original"], "retrain": retrain_entry,
                   **{keys[r["label"]]: r for r in rows[1:]}},
        "cost": {name: exp.fed.cost(name).as_dict() for name in ("pretrain", "retrain", "unlearn", "evaluate")},
        "method": {"domains": {str(u["client_id"]): u["domain"] for u in uploads if u["role"] == "forget"},
                   "asked": asked},
    })
    return rows


def render(bench: Benchmark, rows: list[dict]) -> str:
    """The markdown of ``bench``'s tables (module docstring)."""
    firm = [r for r in rows if r["method"] == "FIRM"]
    sweep = [r for r in rows if r["method"] in ("Original", "FIRM", "FULM")]
    sections = [f"### Table {bench.tables[0]} ({bench.task}): γ sweep, FIRM-base and FULM\n\n" + sweep_table(sweep, bench)]
    if 2 in bench.tables:
        listed = [r for r in rows if r["method"] in ("AVG", "SUM", "TIES")]
        listed += [r for r in firm if r["gamma"] == 1.0] or firm[:1]
        sections.append(f"### Table 2 ({bench.task}): merge baselines at their settings\n\n" + sweep_table(listed, bench))
    others = [r for r in rows if r["method"] not in ("Original", "FIRM")]
    sections.append(f"### Matched forgetting ({bench.task}, forget metric `{bench.forget_key}`)\n\n"
                    + matched_table(matched_points(firm, others, bench.forget_key)))
    return "\n\n".join(sections)


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="1,2,3,4", help="which of the paper's tables (1-4), comma-separated")
    parser.add_argument("--gammas", default="0.5,1,2,4,8,16,32", help="γ values of FIRM and FULM (at least five)")
    parser.add_argument("--clients", type=int, default=4, help="federation size: n - 1 forget clients, one retain")
    parser.add_argument("--out", default="outputs/firm_tables", help="output folder")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--set", default="", help="further run-config overrides, e.g. \"pretrain-rounds=5\"")
    parser.add_argument("--quick", action="store_true", help="the smoke setting (a test of the pipeline, no findings)")
    args = parser.parse_args(argv)
    import logging

    from server_app.inprocess import parse_overrides, setup_logging

    setup_logging(logging.INFO)

    wanted = {int(t) for t in args.tables.split(",") if t.strip()}
    gammas = [float(g) for g in args.gammas.split(",") if g.strip()]
    if not wanted <= {1, 2, 3, 4}:
        parser.error(f"--tables must name tables among 1, 2, 3, 4, got {args.tables!r}")
    if len(gammas) < 5 or any(not math.isfinite(g) or g < 0 for g in gammas):
        parser.error(f"--gammas needs at least five finite values >= 0, got {args.gammas!r}")
    out = Path(args.out)
    run_config = {"seed": args.seed, "cache-dir": str(out / "cache"), "outputs-dir": str(out),
                  "smoke": args.quick, **parse_overrides(args.set)}
    listed = ", ".join(f"{g:g}" for g in gammas)
    parts = ["# FIRM's Tables 1-4 in miniature",
             (f"Clients: {args.clients} ({args.clients - 1} forget, 1 retain); γ: {listed}; "
              "values in percent; † utility at or below chance (25 %).")]
    for bench in BENCHMARKS:
        if not wanted & set(bench.tables):
            continue
        rows = run_benchmark(bench, run_config, args.clients, gammas, out)
        plot_frontier(str(out / f"fig2_{bench.task}.png"), rows, bench)
        parts.append(render(bench, rows))
    os.makedirs(out, exist_ok=True)
    write_text(str(out / "tables.md"), "\n\n".join(parts) + "\n")
    print(out / "tables.md")
    return out


if __name__ == "__main__":
    main()
