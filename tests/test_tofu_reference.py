"""The project's metrics against the field's reference formulas, on TOFU-shaped per-sample values.

Reference formulas, written out here independently of the project's code:

* TOFU (``aggregate_eval_stat.py`` of locuslab/tofu): per record ``s = exp(mean_j loss(a~_j) -
  loss(y))`` with ``loss = -log P~`` (average answer-token loss) and ``y`` the paraphrased answer on
  the forget / retain sets, the answer on real authors / world facts; forget truth ratio ``mean
  min(s, 1/s)``, retain-side ``mean max(0, 1 - 1/s)``; probability ``mean exp(-loss(a))`` on retain,
  ``mean P~(a) / (P~(a) + sum_j P~(a~_j))`` on real authors / world facts; model utility
  ``scipy.stats.hmean`` of the nine non-forget values; forget quality ``ks_2samp(s_model,
  s_retrain).pvalue`` on the forget set.
* open-unlearning (``src/evals/metrics/mia``): min-k% score ``-mean`` of the ``max(1, int(T k))``
  lowest token log-probs (k = 0.4); AUC = ``roc_auc_score`` with forget labelled 0, holdout 1;
  ``privleak = ((1 - AUC) - (1 - AUC_retrain)) / ((1 - AUC_retrain) + 1e-10) * 100``.
* Unlearn-Sparse (``evaluation/SVC_MIA.py``, ``SVC_fit_predict``): ``SVC(C=3, gamma='auto',
  kernel='rbf')`` fitted on shadow-train (retain, label 1) and shadow-test (test, label 0)
  confidences; MIA-efficacy ``1 - mean(predict(forget))``.
* ROUGE-L recall (Lin 2004): LCS of the token sequences over the reference's length.

``fixtures/tofu_llama2_7b_excerpt.json``: per-record losses and ROUGE-L recall of TOFU's published
Llama-2-7B evaluation logs (``full`` model: every set; ``retain90`` model: the forget set), rounded
to 6 decimals by ``benchmarks/tofu_reference.py --write-excerpt``.
"""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import hmean, ks_2samp

from core.config import ConfigError
from strategies.run_config import parse_config
from tasks.llm import federation_metrics as fm
from tasks.llm import metrics, synthetic
from tasks.llm.federation_data import build_llm_client_data, load_author_records
from tasks.llm.forget_quality import TRUTH_RATIOS_KEY, attach_forget_quality
from tasks.metrics import pool_metrics

EXCERPT = json.loads((Path(__file__).parent / "fixtures" / "tofu_llama2_7b_excerpt.json").read_text())
PUBLIC = ("real-authors", "world-facts")


def _scores(part, reference):
    return fm.SetScores(rouge=part["rouge"], answer_log_prob=[-v for v in part["gt"]],
                        reference_log_prob=[-v for v in part[reference]],
                        perturbed_log_probs=[[-v for v in row] for row in part["pert"]])


def _pooled(log, clients, *, tofu=True):
    """The federated entry of a logged model: its records dealt over ``clients`` clients, summed, pooled."""
    per_client = []
    for client in range(clients):
        sums = {}
        for name, part in log.items():
            reference = "para" if tofu and name not in PUBLIC else "gt"
            scores = _scores(part, reference)
            sums.update(fm.set_sums(name, fm.SetScores(*(v[client::clients] for v in (
                scores.rouge, scores.answer_log_prob, scores.reference_log_prob, scores.perturbed_log_probs)))))
        per_client.append(sums)
    return fm.pool_llm_metrics(per_client)


def _tofu_stat(part, reference):
    return np.exp(np.mean(part["pert"], axis=-1) - np.asarray(part[reference]))


def _tofu_reference(log):
    """TOFU's aggregate (module docstring) of a logged model."""
    out, utility = {}, []
    for name, part in log.items():
        stat = _tofu_stat(part, "gt" if name in PUBLIC else "para")
        if name == "forget":
            out["forget_truth"] = np.mean(np.minimum(stat, 1 / stat))
            continue
        true = np.exp(-np.asarray(part["gt"]))
        prob = np.mean(true) if name == "retain" else np.mean(true / (true + np.exp(-np.asarray(part["pert"])).sum(-1)))
        values = [prob, np.mean(part["rouge"]), np.mean(np.maximum(0, 1 - 1 / stat))]
        out[name] = values
        utility += values
    out["model_utility"] = hmean(utility)
    return out


@pytest.mark.parametrize("clients", [1, 3, 7])
def test_federated_pooling_of_logged_llama2_values_equals_tofu_aggregate(clients):
    full = EXCERPT["full"]
    entry, reference = _pooled(full, clients), _tofu_reference(full)
    assert entry["forget_truth"] == pytest.approx(reference["forget_truth"], abs=1e-12)
    for name in ("retain", *PUBLIC):
        key = name.replace("-", "_")
        got = [entry[f"{key}_prob"], entry[f"{key}_rouge"], entry[f"{key}_truth"]]
        assert got == pytest.approx(reference[name], abs=1e-12), name
    assert entry["model_utility"] == pytest.approx(reference["model_utility"], abs=1e-12)
    assert entry["retain_utility"] == pytest.approx(hmean(reference["retain"]), abs=1e-12)
    assert entry["retain_utility"] != pytest.approx(entry["model_utility"], abs=1e-3)  # two quantities, two names


def test_forget_quality_is_tofus_ks_p_value_against_the_retrain_model():
    full, retrain = _pooled(EXCERPT["full"], 4), _pooled(EXCERPT["retain90"], 4)
    attach_forget_quality([full], retrain)
    expected = ks_2samp(_tofu_stat(EXCERPT["full"]["forget"], "para"),
                        _tofu_stat(EXCERPT["retain90"]["forget"], "para")).pvalue
    assert full["forget_quality"] == pytest.approx(expected, rel=1e-9) and full["forget_quality"] < 1e-10
    assert retrain["forget_quality"] == 1.0 and TRUTH_RATIOS_KEY not in full


def test_forget_quality_away_from_the_extremes():
    """20 forget records of a model a quarter of the way from retain90 to full (losses interpolated)."""
    ends = [{k: np.asarray(log["forget"][k][:20]) for k in ("gt", "para", "pert", "rouge")}
            for log in (EXCERPT["retain90"], EXCERPT["full"])]
    partial = {k: (0.75 * ends[0][k] + 0.25 * ends[1][k]).tolist() for k in ("gt", "para", "pert", "rouge")}
    oracle = {k: v.tolist() for k, v in ends[0].items()}
    entry, oracle_entry = _pooled({"forget": partial}, 3), _pooled({"forget": oracle}, 3)
    attach_forget_quality([entry], oracle_entry)
    expected = ks_2samp(_tofu_stat(partial, "para"), _tofu_stat(oracle, "para")).pvalue
    assert entry["forget_quality"] == pytest.approx(expected, rel=1e-9) and 1e-3 < expected < 0.5


def test_the_truth_ratio_reference_changes_the_figures_as_the_issue_measured():
    """Scored against the trained answer (the synthetic protocol) the same losses read differently."""
    full = EXCERPT["full"]
    answer_ref = _pooled(full, 2, tofu=False)
    stat = _tofu_stat(full["forget"], "gt")
    assert answer_ref["forget_truth"] == pytest.approx(np.mean(np.minimum(stat, 1 / stat)), abs=1e-12)
    assert abs(answer_ref["forget_truth"] - _pooled(full, 2)["forget_truth"]) > 0.3


def _lcs(a, b):
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def test_rouge_l_recall_is_lcs_over_reference_length():
    references = ["The author's full name is Hsiao Yun-Hwa.", "Paris, France.", "She was born in 1991 in Taipei.",
                  "Her father was a civil engineer and her mother a dancer."]
    generations = ["The full name of the author is Hsiao Yun-Hwa.", "It is in London.", "Born in Taipei in 1991.",
                   "Her father was a civil"]
    words = [re.sub(r"[^a-z0-9]+", " ", text.lower()).split() for text in references + generations]
    expected = [_lcs(g, r) / len(r) for r, g in zip(words[:4], words[4:])]
    assert metrics.rouge_l_recall(generations, references) == pytest.approx(expected)
    assert len(set(expected)) == 4


def test_min_k_auc_and_privleak_follow_open_unlearning():
    from sklearn.metrics import roc_auc_score

    rng = np.random.default_rng(3)
    token_lps = [rng.normal(-1.0, 1.0, size=int(n)) for n in rng.integers(1, 30, size=40)]
    expected = [-np.mean(np.sort(lp)[:max(1, int(len(lp) * 0.4))]) for lp in token_lps]
    scores = [metrics.min_k_score(lp) for lp in token_lps]
    assert scores == pytest.approx(expected)
    forget, holdout = scores[:25], [round(s, 1) for s in scores[25:]] + [round(scores[0], 1)]  # ties too
    forget = [round(s, 1) for s in forget]
    auc = roc_auc_score([0] * len(forget) + [1] * len(holdout), forget + holdout)
    assert metrics.mia_auc(forget, holdout) == pytest.approx(auc)
    assert metrics.privleak(0.9, 0.55) == pytest.approx(((1 - 0.9) - (1 - 0.55)) / ((1 - 0.55) + 1e-10) * 100)
    assert metrics.privleak(0.55, 0.55) == 0.0 and metrics.privleak(1.0, 0.5) < -99  # memorised: negative
    assert math.isnan(metrics.mia_auc([], holdout))
    with pytest.raises(ValueError, match="min-k"):
        metrics.min_k_score([-1.0], k=0.0)


def test_privleak_is_attached_against_the_retrain_model():
    entries = [{TRUTH_RATIOS_KEY: [0.5], "mia_min_k": 0.95}, {TRUTH_RATIOS_KEY: [0.5], "mia_min_k": math.nan}]
    retrain = {TRUTH_RATIOS_KEY: [0.9], "mia_min_k": 0.6}
    attach_forget_quality(entries, retrain)
    assert entries[0]["privleak"] == pytest.approx(((1 - 0.95) - (1 - 0.6)) / (1 - 0.6) * 100)
    assert math.isnan(entries[1]["privleak"]) and retrain["privleak"] == 0.0


def test_vision_mia_efficacy_equals_unlearn_sparse_svc():
    from sklearn.svm import SVC

    rng = np.random.default_rng(5)
    retain, test = rng.beta(9, 1.5, 120), rng.beta(3, 2, 120)
    forget = np.concatenate([rng.beta(9, 1.5, 30), rng.beta(3, 2, 50)])
    clf = SVC(C=3, gamma="auto", kernel="rbf").fit(np.concatenate([retain, test]).reshape(-1, 1),
                                                   np.concatenate([np.ones(120), np.zeros(120)]))
    expected = 1 - clf.predict(forget.reshape(-1, 1)).mean()
    clients = [{"conf-retain": list(retain[i::2]), "conf-test": list(test[i::2]), "conf-forget": list(forget[i::2])}
               for i in range(2)]
    entry = pool_metrics(clients, seed=0, with_trigger=False, with_forget_test=False)
    assert entry["mia_efficacy"] == pytest.approx(expected) and 0.2 < expected < 0.9
    assert entry["mia"] == pytest.approx(1 - entry["mia_efficacy"])


def _tiny_tofu_dir(folder):
    """TOFU layout from synthetic words: full, perturbed splits, real authors / world facts, holdout10."""
    records = synthetic.fictitious_authors(4, 20, seed=3)
    folder.mkdir()
    keep = ("question", "answer", "paraphrased_answer", "perturbed_answer")
    (folder / "full.json").write_text(json.dumps([{"question": r["question"], "answer": r["answer"]} for r in records]))
    (folder / "retain_perturbed.json").write_text(json.dumps([{k: r[k] for k in keep} for r in records[:60:4]]))
    (folder / "forget10_perturbed.json").write_text(json.dumps([{k: r[k] for k in keep} for r in records[60::2]]))
    public = {"real_authors_perturbed": synthetic.real_authors(seed=1)[:6],
              "world_facts_perturbed": synthetic.world_facts(seed=1)[:6],
              "holdout10": synthetic.holdout_authors(1, 8, exclude=[], seed=3)}
    for split, rows in public.items():
        lines = [json.dumps({k: r[k] for k in ("question", "answer", "perturbed_answer")}) for r in rows]
        (folder / f"{split}.jsonl").write_text("\n".join(lines) + "\n")


def test_tofu_files_are_scored_with_tofus_protocol_in_the_federated_path(tmp_path, monkeypatch):
    from tasks.llm.model import build_llm

    _tiny_tofu_dir(tmp_path / "tofu")
    cfg = parse_config({"task": "llm-tofu", "method": "none", "llm.data-dir": str(tmp_path / "tofu"),
                        "llm.forget-fraction": 0.25}, num_clients=2)
    records = load_author_records(cfg)
    clients = [build_llm_client_data(cfg, records, pid, 2) for pid in range(2)]
    model, tokenizer = build_llm("tiny", lora_rank=4, seed=0)
    lengths = []

    def perfect_answers(model, tokenizer, questions, *, max_new_tokens, batch_size):
        lengths.append(max_new_tokens)  # record the generation length and answer like a perfect model
        return [by_question[q] for q in questions]

    by_question = {r["question"]: r["answer"]
                   for c in clients for rows in (c.retain, c.forget, *c.public.values()) for r in rows}
    monkeypatch.setattr(fm, "generate_answers", perfect_answers)
    sums = [fm.client_llm_metrics(model, tokenizer, c, cfg=cfg) for c in clients]
    assert set(lengths) == {200} and all(s["tofu-protocol"] == 1 for s in sums)
    forget = [r for c in clients for r in c.evaluable("forget")]
    retain = [r for c in clients for r in c.evaluable("retain")]
    facts = [r for c in clients for r in c.public["world-facts"]]
    assert len(forget) == 10 and len(retain) == 15 and len(facts) == 6
    paraphrased = metrics.truth_ratios(model, tokenizer, retain, reference="paraphrased")
    assert sum(s["retain-truth"] for s in sums) == pytest.approx(float((1 - paraphrased).clamp(min=0).sum()))
    assert sorted(v for s in sums for v in s["forget-tr"]) == pytest.approx(
        sorted(metrics.truth_ratios(model, tokenizer, forget, reference="paraphrased").tolist()))
    original = metrics.truth_ratios(model, tokenizer, facts, reference="answer")
    assert sum(s["world-facts-truth"] for s in sums) == pytest.approx(float((1 - original).clamp(min=0).sum()))
    entry = fm.pool_llm_metrics(sums)
    nine = [entry[f"{k}_{m}"] for k in ("retain", "real_authors", "world_facts") for m in ("prob", "rouge", "truth")]
    assert entry["model_utility"] == pytest.approx(metrics.harmonic_mean(nine))
    assert entry["llm_protocol"] == "tofu" and entry["llm_max_new_tokens"] == 200
    assert len([v for s in sums for v in s["holdout-mink"]]) == 8 and 0.0 <= entry["mia_min_k"] <= 1.0


def test_generation_length_is_chosen_by_the_data_source(tmp_path):
    synthetic_cfg = parse_config({"task": "llm-tofu", "method": "none"})
    tofu_cfg = parse_config({"task": "llm-tofu", "method": "none", "llm.data-dir": str(tmp_path)})
    assert (fm.protocol_of(synthetic_cfg), fm.max_new_tokens_of(synthetic_cfg)) == ("synthetic", 16)
    assert (fm.protocol_of(tofu_cfg), fm.max_new_tokens_of(tofu_cfg)) == ("tofu", 200)
    assert fm.max_new_tokens_of(parse_config({"task": "llm-tofu", "method": "none", "llm.max-new-tokens": 40})) == 40
    with pytest.raises(ConfigError, match="llm.max-new-tokens"):
        parse_config({"task": "llm-tofu", "method": "none", "llm.max-new-tokens": -1})
