"""Reference vs project: TOFU's published per-sample evaluation logs through the federated metric code.

locuslab/tofu ships the per-sample evaluation logs of its fine-tuned models, e.g. for Llama-2-7B
``data/ft_epoch5_lr1e-05_llama2-7b_full_wd0/eval_results/ds_size300/eval_log_aggregated.json`` and
the same under ``..._retain90_wd0`` (the retrain oracle of ``forget10``). Each file holds, per
evaluation set (retain, forget, real authors, world facts) and per record, the average answer loss
``-log P~`` of the answer, of the paraphrased answer and of every perturbed answer, the greedy
generation and its ROUGE-L recall. This script splits those records over ``--clients`` simulated
clients, turns them into the clients' sums (``tasks.llm.federation_metrics.set_sums``), pools them
(``pool_llm_metrics``) and attaches forget quality (``attach_forget_quality``) exactly as a federated
run does, and prints each figure beside TOFU's own formula (``aggregate_eval_stat.py``:
``get_model_utility``, ``get_forget_quality``), re-derived here with numpy/scipy:

* truth statistic ``s_i = exp(mean_j loss(a~_ij) - loss(y_i))`` (``y`` = paraphrased answer on
  retain/forget, the answer on real authors / world facts); forget score ``mean min(s, 1/s)``,
  retain-side score ``mean max(0, 1 - 1/s)``;
* probability ``mean exp(-loss(a))`` on retain/forget, ``mean P~(a) / (P~(a) + sum_j P~(a~_j))`` on
  real authors / world facts; ROUGE ``mean rougeL_recall``;
* model utility = ``scipy.stats.hmean`` of the nine non-forget values; forget quality =
  ``ks_2samp(s_model, s_retain90).pvalue`` on the forget set.

Expected (TOFU's aggregate of the ``wd0`` logs; what the bar asks the project to reproduce to 1e-3):
full model utility 0.627, forget truth ratio 0.517, retain truth ratio 0.473; forget quality of full
vs retain90 1.1e-19. The "synthetic protocol" rows show the same logs scored with the trained answer
as truth-ratio reference (the synthetic default's choice), and "ROUGE-L, 12 words" the logged
generations cut to their first 12 words (about the 16 Llama tokens the synthetic default
generates). The MIA-efficacy and privleak rows use seeded scores (the logs hold no confidences or
token log-probabilities): Unlearn-Sparse's ``SVC_fit_predict`` (scikit-learn ``SVC(C=3,
gamma='auto')``) and open-unlearning's ``roc_auc_score`` / ``privleak`` formula against the project's.

    python benchmarks/tofu_reference.py --full LOGS/full_wd0 --retain LOGS/retain90_wd0

``--write-excerpt FILE`` also writes the per-sample numbers the test suite reads
(``tests/fixtures/tofu_llama2_7b_excerpt.json``, rounded to 6 decimals).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
from scipy.stats import hmean, ks_2samp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's code, not an installed one's

from tasks.llm.federation_metrics import SetScores, pool_llm_metrics, set_sums  # noqa: E402
from tasks.llm.forget_quality import attach_forget_quality  # noqa: E402
from tasks.llm.metrics import mia_auc, privleak, rouge_l_recall  # noqa: E402
from tasks.metrics import pool_metrics  # noqa: E402

FILES = {"retain": "eval_log.json", "forget": "eval_log_forget.json",
         "real-authors": "eval_real_author_wo_options.json", "world-facts": "eval_real_world_wo_options.json"}
PUBLISHED = {"model_utility": 0.627, "forget_truth": 0.517, "retain_truth": 0.473}


def load_log(path: str) -> dict:
    """``{set: {field: [per-record values]}}`` of one TOFU log (a folder or its eval_log_aggregated.json)."""
    if os.path.isdir(path):
        path = os.path.join(path, "eval_log_aggregated.json")
    with open(path, encoding="utf-8") as handle:
        raw = json.load(handle)
    out = {}
    for name, file in FILES.items():
        part = raw[file]
        order = list(part["avg_gt_loss"])
        out[name] = {"gt": [part["avg_gt_loss"][i] for i in order],
                     "para": [part["avg_paraphrased_loss"][i] for i in order],
                     "pert": [part["average_perturb_loss"][i] for i in order],
                     "rouge": [part["rougeL_recall"][i] for i in order],
                     "text": [part["generated_text"][i] for i in order]}
    return out


def scores_of(part: dict, *, reference: str = "para") -> SetScores:
    """The project's per-record scores from logged losses (log P~ = -loss)."""
    return SetScores(rouge=list(part["rouge"]), answer_log_prob=[-v for v in part["gt"]],
                     reference_log_prob=[-v for v in part[reference]],
                     perturbed_log_probs=[[-v for v in row] for row in part["pert"]])


def _strided(scores: SetScores, client: int, clients: int) -> SetScores:
    return SetScores(*(values[client::clients] for values in
                       (scores.rouge, scores.answer_log_prob, scores.reference_log_prob, scores.perturbed_log_probs)))


def project_entry(log: dict, clients: int, *, synthetic_reference: bool = False) -> dict:
    """The pooled federated entry of one logged model, its records dealt to ``clients`` clients."""
    per_client = []
    for client in range(clients):
        sums = {"tofu-protocol": int(not synthetic_reference)}
        for name, part in log.items():
            reference = "gt" if synthetic_reference or name in ("real-authors", "world-facts") else "para"
            sums.update(set_sums(name, _strided(scores_of(part, reference=reference), client, clients)))
        per_client.append(sums)
    return pool_llm_metrics(per_client)


def tofu_statistics(log: dict, *, reference: str = "para") -> dict:
    """TOFU's aggregate of one log (module docstring), with numpy/scipy."""
    out, utility = {}, []
    for name, part in log.items():
        ref = "gt" if name in ("real-authors", "world-facts") else reference
        stat = np.exp(np.asarray(part["pert"]).mean(axis=-1) - np.asarray(part[ref]))
        if name == "forget":
            out["forget_truth"] = float(np.mean(np.minimum(stat, 1 / stat)))
            out["forget_stat"] = stat
            out["forget_rouge"] = float(np.mean(part["rouge"]))
            continue
        true = np.exp(-np.asarray(part["gt"]))
        if name == "retain":
            prob = float(np.mean(true))
        else:
            prob = float(np.mean(true / (true + np.exp(-np.asarray(part["pert"])).sum(axis=-1))))
        truth = float(np.mean(np.maximum(0, 1 - 1 / stat)))
        key = name.replace("-", "_")
        out.update({f"{key}_prob": prob, f"{key}_rouge": float(np.mean(part["rouge"])), f"{key}_truth": truth})
        utility += [prob, out[f"{key}_rouge"], truth]
    out["model_utility"] = float(hmean(utility)) if utility else math.nan
    return out


def _svc_efficacy_reference(shadow_train, shadow_test, target) -> float:
    """Unlearn-Sparse ``SVC_fit_predict`` with only a target-test set (forget): 1 - mean prediction."""
    from sklearn.svm import SVC

    x = np.concatenate([shadow_train, shadow_test]).reshape(-1, 1)
    y = np.concatenate([np.ones(len(shadow_train)), np.zeros(len(shadow_test))])
    clf = SVC(C=3, gamma="auto", kernel="rbf").fit(x, y)
    return float(1 - clf.predict(np.asarray(target).reshape(-1, 1)).mean())


def seeded_attack_rows(seed: int = 0) -> list[tuple[str, float, float]]:
    """MIA efficacy and privleak on seeded scores: (name, reference, project)."""
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(seed)
    members, non_members = rng.beta(8, 2, 300), rng.beta(3, 3, 300)
    forget = np.concatenate([rng.beta(8, 2, 60), rng.beta(3, 3, 140)])
    entry = pool_metrics([{"conf-retain": list(members), "conf-test": list(non_members), "conf-forget": list(forget)}],
                         seed=seed, with_trigger=False, with_forget_test=False)
    rows = [("MIA efficacy (vision SVC)", _svc_efficacy_reference(members, non_members, forget), entry["mia_efficacy"])]
    unlearned_f, retrain_f, holdout = rng.normal(1.0, 0.5, 200), rng.normal(2.0, 0.5, 200), rng.normal(2.0, 0.5, 200)
    labels = [0] * 200 + [1] * 200
    auc_u = roc_auc_score(labels, np.concatenate([unlearned_f, holdout]))
    auc_r = roc_auc_score(labels, np.concatenate([retrain_f, holdout]))
    rows.append(("min-k AUC (unlearned)", float(auc_u), mia_auc(unlearned_f, holdout)))
    rows.append(("privleak", ((1 - auc_u) - (1 - auc_r)) / ((1 - auc_r) + 1e-10) * 100,
                 privleak(mia_auc(unlearned_f, holdout), mia_auc(retrain_f, holdout))))
    return rows


def _partial_forget_quality_row(full: dict, retain: dict, clients: int, records: int = 20, share: float = 0.25):
    """Forget quality of a model a quarter of the way from retain90 to full on the first 20 forget
    records (losses interpolated record by record), where the KS p-value is far from 0 or 1."""
    def mixed(key):
        ends = (np.asarray(log["forget"][key][:records]) for log in (retain, full))
        return ((1 - share) * next(ends) + share * next(ends)).tolist()

    partial = {"forget": {**{key: mixed(key) for key in ("gt", "para", "pert")},
                          "rouge": full["forget"]["rouge"][:records]}}
    oracle = {"forget": {k: v[:records] for k, v in retain["forget"].items()}}
    entry, oracle_entry = project_entry(partial, clients), project_entry(oracle, clients)
    attach_forget_quality([entry], oracle_entry)
    reference = ks_2samp(tofu_statistics(partial)["forget_stat"], tofu_statistics(oracle)["forget_stat"]).pvalue
    return (f"forget quality, {records} records, 1/4 from retain90 to full", float(reference),
            entry["forget_quality"], None)


def write_excerpt(path: str, full: dict, retain: dict) -> None:
    """The per-sample numbers ``tests/test_tofu_reference.py`` reads: every set of the full model's
    log, and the forget set of the retrain model's (losses and ROUGE only, rounded to 6 decimals)."""
    def numbers(part):
        return {k: np.round(np.asarray(part[k], dtype=float), 6).tolist() for k in ("gt", "para", "pert", "rouge")}

    excerpt = {"full": {name: numbers(part) for name, part in full.items()},
               "retain90": {"forget": numbers(retain["forget"])}}
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(excerpt, handle, separators=(",", ":"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", required=True,
                        help="TOFU log of the fine-tuned model (folder or its eval_log_aggregated.json)")
    parser.add_argument("--retain", required=True, help="TOFU log of the retrain (retain90) model")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--write-excerpt", default="")
    args = parser.parse_args()
    full, retain = load_log(args.full), load_log(args.retain)
    entries = {"full": project_entry(full, args.clients), "retain90": project_entry(retain, args.clients)}
    reference = {"full": tofu_statistics(full), "retain90": tofu_statistics(retain)}
    attach_forget_quality([entries["full"]], entries["retain90"])
    rows = []
    for model in ("full", "retain90"):
        for key in ("forget_truth", "retain_truth", "model_utility", "retain_prob", "retain_rouge", "real_authors_prob",
                    "real_authors_truth", "world_facts_prob", "world_facts_truth", "forget_rouge"):
            published = PUBLISHED.get(key) if model == "full" else None
            rows.append((f"{model} {key}", reference[model][key], entries[model][key], published))
    rows.append(("forget quality full vs retain90", float(ks_2samp(reference["full"]["forget_stat"],
                                                                   reference["retain90"]["forget_stat"]).pvalue),
                 entries["full"]["forget_quality"], 1.1e-19))
    rows.append(_partial_forget_quality_row(full, retain, args.clients))
    synthetic = project_entry(full, args.clients, synthetic_reference=True)
    reference_synthetic = tofu_statistics(full, reference="gt")
    rows += [(f"full {key}, synthetic protocol", reference_synthetic[key], synthetic[key], None)
             for key in ("forget_truth", "retain_truth")]
    for name in ("forget", "retain"):
        texts = full[name]["text"]
        rescored = rouge_l_recall([t[1] for t in texts], [t[2] for t in texts])
        rows.append((f"full {name} ROUGE-L from logged generations", float(np.mean(full[name]["rouge"])),
                     float(np.mean(rescored)), None))
        cut = rouge_l_recall([" ".join(t[1].split()[:12]) for t in texts], [t[2] for t in texts])
        rows.append((f"full {name} ROUGE-L cut to 12 words (ref: uncut)", float(np.mean(full[name]["rouge"])),
                     float(np.mean(cut)), None))
    rows += [(name, ref, got, None) for name, ref, got in seeded_attack_rows()]
    print(f"{'metric':<48} {'reference':>12} {'project':>12} {'|diff|':>9} {'published':>9}")
    for name, ref, got, published in rows:
        shown = "" if published is None else published
        print(f"{name:<48} {ref:>12.6g} {got:>12.6g} {abs(ref - got):>9.2g} {shown:>9}")
    if args.write_excerpt:
        write_excerpt(args.write_excerpt, full, retain)


if __name__ == "__main__":
    main()
