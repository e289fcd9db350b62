"""Forgetting-utility frontier of FIRM vs AVG / SUM / TIES / FULM from one set of client uploads.

Offline default (tiny model, synthetic authors; minutes on a CPU):

1. pretrain: the tiny Llama learns every author (LoRA fine-tune with ``tasks.llm.train.finetune``);
   the adapter is merged into the base weights, which are the *reference* model all clients receive;
2. release: every client attaches a fresh LoRA adapter and calls ``strategies.firm.client.firm_release``
   once: forget clients (one author each, own domain) with gradient ascent, retain clients (the other
   authors) with cross-entropy; uploads are cached in ``OUT/uploads.pt`` (reused when the settings match);
3. sweep, without retraining: FIRM-base (epsilon = inf) over ``--gammas`` (and FIRM-QP with a finite
   ``--epsilon``),
   the baselines over ``--scales``; each merged update is added to the reference weights and evaluated
   with ``tasks.llm.metrics.evaluate_llm`` on the forget authors and the retain authors;
4. write ``OUT/frontier.csv`` (one row per method and scale, incl. the merged update's L2 norm, like
   the paper's Table 1 / Table 9), ``OUT/norms_by_clients.csv`` (norm vs number of forget clients at
   fixed scale, like its Table 9 / Fig. 3) and ``OUT/frontier.png`` (Fig. 2-like); files are written
   atomically.

    python benchmarks/sweep_firm.py                    # offline default, writes outputs/firm_sweep/
"""

from __future__ import annotations

import argparse
import copy
import csv
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from peft import LoraConfig, get_peft_model  # noqa: E402

from strategies.firm.aggregate import FIRM  # noqa: E402
from strategies.merges.merge import merge_baseline  # noqa: E402
from strategies.firm.client import firm_release  # noqa: E402
from strategies.firm.fisher import lora_state  # noqa: E402
from tasks.llm.metrics import evaluate_llm  # noqa: E402
from tasks.llm.model import LLAMA_TARGET_MODULES, build_llm  # noqa: E402
from tasks.llm.synthetic import fictitious_authors  # noqa: E402
from tasks.llm.train import finetune, qa_batches  # noqa: E402

COLUMNS = ("method", "scale", "forget_fact_acc", "retain_fact_acc", "model_utility", "forget_rouge_l",
           "retain_rouge_l", "update_norm")


def atomic_write(path: Path, write) -> None:
    """Write via a temporary file in the same folder, then rename (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=path.suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def split_authors(records: list[dict], forget_clients: int, retain_clients: int):
    """Forget client i holds author i; the other authors are dealt round-robin to the retain clients."""
    authors = list(dict.fromkeys(r["author"] for r in records))
    if len(authors) < forget_clients + retain_clients:
        raise ValueError(f"--authors must be >= forget + retain clients ({forget_clients + retain_clients})")
    forget = [[r for r in records if r["author"] == authors[i]] for i in range(forget_clients)]
    rest = authors[forget_clients:]
    retain = [[r for r in records if r["author"] in rest[k::retain_clients]] for k in range(retain_clients)]
    return forget, retain


def fresh_adapter(reference, args, seed: int):
    config = LoraConfig(r=args.lora_rank, lora_alpha=2 * args.lora_rank, lora_dropout=0.0,
                        target_modules=list(LLAMA_TARGET_MODULES), task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(copy.deepcopy(reference), config)


def prepare(args, out: Path):
    """Reference model, tokenizer, evaluation sets and the cached (or new) uploads."""
    model, tokenizer = build_llm("tiny", seed=args.seed, lora_rank=args.lora_rank, lora_alpha=2 * args.lora_rank)
    records = fictitious_authors(args.authors, args.qa_per_author, seed=args.seed)
    forget_sets, retain_sets = split_authors(records, args.forget_clients, args.retain_clients)
    settings = {k: v for k, v in vars(args).items() if k not in ("gammas", "scales", "out", "epsilon")}
    cache = out / "uploads.pt"
    if cache.exists():
        stored = torch.load(cache, weights_only=False)
        if stored["settings"] == settings:
            print(f"reusing uploads from {cache}")
            return stored["reference"], tokenizer, forget_sets, retain_sets, stored["uploads"]
    batches = qa_batches(records, tokenizer, batch_size=8, seed=args.seed)
    losses = finetune(model, batches, args.pretrain_epochs, args.pretrain_lr, args.seed)
    print(f"pretrain loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    reference = model.merge_and_unload()
    uploads = []
    roles = [("forget", "ascent", s, f"author{i}") for i, s in enumerate(forget_sets)]
    roles += [("retain", "ce", s, "") for s in retain_sets]
    for index, (role, objective, client_records, domain) in enumerate(roles):
        client = fresh_adapter(reference, args, args.seed + 100 + index)
        client_batches = qa_batches(client_records, tokenizer, batch_size=4, seed=args.seed + index)
        epochs, lr = (args.forget_epochs, args.forget_lr) if role == "forget" else (args.retain_epochs, args.retain_lr)
        release = firm_release(client, lora_state(client), client_batches, role=role, objective=objective,
                               epochs=epochs, lr=lr, seed=args.seed + index, fisher_batches=args.fisher_batches)
        uploads.append({"client_id": f"{role}{index}", "role": role, "domain": domain, **release})
    atomic_write(cache, lambda p: torch.save({"settings": settings, "reference": reference, "uploads": uploads}, p))
    return reference, tokenizer, forget_sets, retain_sets, uploads


def apply_update(reference, update: dict[str, torch.Tensor]):
    model = copy.deepcopy(reference)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, delta in update.items():
            params[name].add_(delta.to(params[name]))
    return model.eval()


def evaluate(model, tokenizer, forget_records, retain_records) -> dict:
    result = evaluate_llm(model, tokenizer, forget_records, retain_records)
    return {k: result[k] for k in COLUMNS[2:-1]}


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "reference"))
    reference = next(r for r in rows if r["method"] == "reference")
    for method in methods:
        points = [r for r in rows if r["method"] == method]
        for ax, y in zip(axes[:2], ("retain_fact_acc", "model_utility")):
            ax.plot([p["forget_fact_acc"] for p in points], [p[y] for p in points], "o-", label=method)
        axes[2].plot([p["scale"] for p in points], [p["update_norm"] for p in points], "o-", label=method)
    for ax, y in zip(axes[:2], ("retain_fact_acc", "model_utility")):
        ax.plot([reference["forget_fact_acc"]], [reference[y]], "k*", markersize=12, label="reference")
        ax.set_xlabel("forget fact accuracy (lower = more forgotten)")
        ax.set_ylabel(y.replace("_", " "))
        ax.invert_xaxis()
        ax.grid(alpha=0.3)
    axes[2].set_xscale("log")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("gamma / scale")
    axes[2].set_ylabel("merged update L2 norm")
    axes[2].grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("FIRM vs merge baselines: forgetting-utility frontier (tiny model, synthetic authors)")
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)


def write_csv(rows: list[dict], columns, path: Path) -> None:
    def write(p):
        with open(p, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(columns))
            writer.writeheader()
            for row in rows:
                writer.writerow({k: f"{v:.4g}" if isinstance(v, float) else v for k, v in row.items()})

    atomic_write(path, write)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="outputs/firm_sweep")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--authors", type=int, default=6)
    parser.add_argument("--qa-per-author", type=int, default=10)
    parser.add_argument("--forget-clients", type=int, default=2)
    parser.add_argument("--retain-clients", type=int, default=2)
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--pretrain-epochs", type=int, default=30)
    parser.add_argument("--pretrain-lr", type=float, default=3e-3)
    parser.add_argument("--forget-epochs", type=int, default=3)
    parser.add_argument("--forget-lr", type=float, default=1e-3)
    parser.add_argument("--retain-epochs", type=int, default=2)
    parser.add_argument("--retain-lr", type=float, default=1e-3)
    parser.add_argument("--fisher-batches", type=int, default=20)
    parser.add_argument("--gammas", type=float, nargs="+", default=[0.5, 1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.125, 0.25, 0.5, 1, 2, 4, 8])
    parser.add_argument("--epsilon", type=float, default=float("inf"),
                        help="finite: also sweep FIRM-QP with this per-tensor retention budget")
    args = parser.parse_args()
    out = Path(args.out)
    reference, tokenizer, forget_sets, retain_sets, uploads = prepare(args, out)
    forget_records = [r for s in forget_sets for r in s]
    retain_records = [r for s in retain_sets for r in s]

    rows = [{"method": "reference", "scale": 0.0, **evaluate(reference, tokenizer, forget_records, retain_records),
             "update_norm": 0.0}]
    print(json.dumps(rows[0]))
    candidates = [("firm", g, lambda g=g: FIRM(gamma=g).aggregate(uploads)) for g in args.gammas]
    if args.epsilon != float("inf"):
        candidates += [("firm-qp", g, lambda g=g: FIRM(gamma=g, epsilon=args.epsilon).aggregate(uploads))
                       for g in args.gammas]
    for name in ("sum", "avg", "ties", "fulm"):
        candidates += [(name, s, lambda n=name, s=s: merge_baseline(n, uploads, s)) for s in args.scales]
    for method, scale, merge in candidates:
        update, report = merge()
        model = apply_update(reference, update)
        rows.append({"method": method, "scale": scale, **evaluate(model, tokenizer, forget_records, retain_records),
                     "update_norm": report.merged_norm})
        print(json.dumps(rows[-1]))
        write_csv(rows, COLUMNS, out / "frontier.csv")

    norm_rows = []
    for k in range(1, args.forget_clients + 1):
        subset = uploads[:k] + uploads[args.forget_clients:]
        norm_rows.append({"forget_clients": k,
                          "firm_gamma1": FIRM(gamma=1.0).aggregate(subset)[1].merged_norm,
                          "sum_scale1": merge_baseline("sum", subset, 1.0)[1].merged_norm,
                          "fulm_scale1": merge_baseline("fulm", subset, 1.0)[1].merged_norm})
    write_csv(norm_rows, list(norm_rows[0]), out / "norms_by_clients.csv")
    plot(rows, out / "frontier.png")
    print(f"wrote {out / 'frontier.csv'}, {out / 'norms_by_clients.csv'}, {out / 'frontier.png'}")


if __name__ == "__main__":
    main()
