"""LLM metrics in the federation: per-client sums, pooled on the server into a results entry.

A client scores its own forget and retain records (``LLMClientData.evaluable``) and its share of
the public evaluation sets (``LLMClientData.public``: TOFU's real authors / world facts when present,
and the never-trained holdout records of the MIA) with the functions of ``tasks.llm.metrics``, and
sends sums and counts plus per-sample lists (model outputs only), so pooled means weigh every record
equally, whichever client holds it.

Two protocols (`protocol_of`), reported as ``llm_protocol`` in every entry:

* ``"tofu"`` (``llm.data-dir`` set, or a node reading its own TOFU files from ``data-path``:
  ``tasks.llm.node_data``), TOFU's own evaluation (``aggregate_eval_stat.py`` of
  locuslab/tofu; open-unlearning's TOFU metrics): the truth-ratio reference ``y`` is the
  *paraphrased* answer on the forget and retain sets and the original answer on real authors / world
  facts; greedy answers of up to 200 new tokens (open-unlearning's generation setting; TOFU's answers
  average 26 words); model utility over nine values when both public sets are present.
* ``"synthetic"`` (the offline default): the trained answer is the truth-ratio reference (Lethe eq.
  4, "the original correct answer"; the synthetic paraphrase changes the template, not the fact) and
  16 new tokens (the answers are 1-7 words); the tiny model has no general knowledge, so no public
  sets are scored and ``model_utility`` is ``null``.

``llm.max-new-tokens`` = 0 picks the protocol's generation length (`max_new_tokens_of`).

Sums per set (``forget``, ``retain``, ``real-authors``, ``world-facts``): ``{set}-n``, ``{set}-rouge``
(sum of ROUGE-L recall of the greedy answer against the answer), ``{set}-prob`` (sum of
``P~(a) = P(a|q)^(1/|a|)`` on forget/retain, of TOFU's option-normalised ``P~(a) / (P~(a) + sum_j
P~(a~_j))`` on the public sets), ``{set}-truth`` (sum of ``max(0, 1 - TR)``, not on the forget set),
``forget-tr`` (the forget truth ratios ``TR_i``); on forget/retain also ``{set}-fact-n`` /
``{set}-fact-hits`` (records with a key fact / whose greedy answer contains it) and ``{set}-mc-n`` /
``{set}-mc-hits`` (each record asked as a multiple-choice question among its answer and perturbed
answers, order shuffled with the run's seed, scored by option log-likelihood); ``forget-mink`` /
``holdout-mink`` (per-record min-k% scores); ``tofu-protocol`` (1/0) and ``max-new-tokens``.

Pooled entry (fractions in [0, 1]; NaN -> ``null`` when a set is empty): ``forget_/retain_fact_acc``,
``forget_/retain_mc_acc``, ``forget_/retain_rouge``, ``forget_/retain_prob``, ``forget_truth = mean
min(TR, 1/TR)`` (TOFU forget truth-ratio score), ``retain_truth = mean max(0, 1 - TR)``, ``kr = 1 -
forget_truth`` (Lethe eq. 4), ``retain_utility`` = harmonic mean of retain prob, ROUGE-L and truth
score (``utility``: the same number, its former name), ``real_authors_/world_facts_{rouge,prob,
truth}`` (only when the set is scored) and ``model_utility`` = TOFU's model utility, the harmonic
mean of those nine values ({prob, ROUGE-L, truth} x {retain, real authors, world facts}; ``null``
without both public sets),
``mia_min_k`` = open-unlearning's min-k% AUC of forget vs holdout scores (1 = forget answers far
more likely than unseen ones), ``forget_acc = kr`` so the resurfacing block (KR curve, RR) is the
same as for vision tasks, ``retain_acc`` = ``retain_fact_acc``, and ``test_acc``, ``mia``,
``mia_efficacy`` = NaN (the vision SVC attack has no LLM counterpart here). ``forget_quality`` (KS
p-value of the forget truth ratios against the retrain model's) and ``privleak`` (from ``mia_min_k``
and the retrain model's) are added by :func:`tasks.llm.forget_quality.attach_forget_quality` once the
retrain model has been evaluated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from tasks.llm.data import as_multiple_choice
from tasks.llm.forget_quality import TRUTH_RATIOS_KEY
from tasks.llm.metrics import (
    answer_log_probs,
    answer_token_log_probs,
    fact_hits,
    generate_answers,
    harmonic_mean,
    mia_auc,
    min_k_score,
    multiple_choice_hits,
    ratio,
    relative_probabilities,
    rouge_l_recall,
    truth_ratios_from_log_probs,
)

MAX_NEW_TOKENS = {"synthetic": 16, "tofu": 200}
"""Greedy generation length per protocol when ``llm.max-new-tokens`` is 0 (module docstring)."""
OWN_SETS = ("forget", "retain")
PUBLIC_SETS = ("real-authors", "world-facts")
"""TOFU's retain-side general-knowledge sets, scored in the tofu protocol when their files exist."""


def protocol_of(cfg) -> str:
    """``"tofu"`` on TOFU files (``llm.data-dir`` set), else ``"synthetic"``."""
    return "tofu" if cfg["llm.data-dir"] else "synthetic"


def max_new_tokens_of(cfg, protocol: str = "") -> int:
    """``llm.max-new-tokens``, or the protocol's (by default the run's) generation length when it is 0."""
    return cfg["llm.max-new-tokens"] or MAX_NEW_TOKENS[protocol or protocol_of(cfg)]


@dataclass
class SetScores:
    """Per-record outputs of one evaluation set, what its sums are made of (see module docstring).

    Log-probabilities are length-normalised, ``log P~(x|q) = log P(x|q) / |x|``; TOFU's logs hold
    their negatives (``avg_gt_loss``, ``avg_paraphrased_loss``, ``average_perturb_loss``)."""

    rouge: list[float]
    answer_log_prob: list[float]
    reference_log_prob: list[float]
    perturbed_log_probs: list[list[float]]
    min_k: list[float] = field(default_factory=list)


def set_sums(name: str, scores: SetScores) -> dict:
    """The sums of set ``name`` (``forget``, ``retain`` or a `PUBLIC_SETS` name) from its per-record scores."""
    n = len(scores.rouge)
    out: dict = {f"{name}-n": n}
    if name == "forget":
        out["forget-mink"] = [float(v) for v in scores.min_k]
    if not n:
        return {**out, f"{name}-rouge": 0.0, f"{name}-prob": 0.0,
                **({"forget-tr": []} if name == "forget" else {f"{name}-truth": 0.0})}
    out[f"{name}-rouge"] = float(sum(scores.rouge))
    if name in PUBLIC_SETS:
        out[f"{name}-prob"] = float(sum(relative_probabilities(scores.answer_log_prob, scores.perturbed_log_probs)))
    else:
        out[f"{name}-prob"] = float(torch.exp(torch.as_tensor(scores.answer_log_prob, dtype=torch.float64)).sum())
    ratios = truth_ratios_from_log_probs(scores.reference_log_prob, scores.perturbed_log_probs)
    if name == "forget":
        out["forget-tr"] = [float(tr) for tr in ratios]
    else:
        out[f"{name}-truth"] = float((1.0 - ratios).clamp(min=0.0).sum())
    return out


def _normalised(model, tokenizer, questions, answers, batch_size) -> torch.Tensor:
    total, count = answer_log_probs(model, tokenizer, questions, answers, batch_size=batch_size)
    return total / count.clamp(min=1)


def min_k_scores(model, tokenizer, records, batch_size) -> list[float]:
    """Min-k% score of every record's answer (open-unlearning scores the answer given the question)."""
    if not records:
        return []
    rows = answer_token_log_probs(model, tokenizer, [r["question"] for r in records],
                                  [r["answer"] for r in records], batch_size=batch_size)
    return [min_k_score(row.tolist()) for row in rows]


def score_set(model, tokenizer, records: list[dict], *, reference: str, predictions: list[str],
              batch_size: int, with_min_k: bool = False) -> SetScores:
    """The `SetScores` of ``records`` given their greedy ``predictions``; ``reference`` is the record
    field the truth ratio compares with (``answer`` or ``paraphrased_answer``)."""
    if not records:
        return SetScores([], [], [], [])
    questions = [r["question"] for r in records]
    answer = _normalised(model, tokenizer, questions, [r["answer"] for r in records], batch_size)
    correct = answer if reference == "answer" else _normalised(model, tokenizer, questions,
                                                               [r[reference] for r in records], batch_size)
    flat = _normalised(model, tokenizer, [r["question"] for r in records for _ in r["perturbed_answer"]],
                       [a for r in records for a in r["perturbed_answer"]], batch_size)
    perturbed = torch.split(flat, [len(r["perturbed_answer"]) for r in records])
    return SetScores(rouge=rouge_l_recall(predictions, [r["answer"] for r in records]),
                     answer_log_prob=answer.tolist(), reference_log_prob=correct.tolist(),
                     perturbed_log_probs=[row.tolist() for row in perturbed],
                     min_k=min_k_scores(model, tokenizer, records, batch_size) if with_min_k else [])


def _own_set_sums(model, tokenizer, records: list[dict], name: str, *, reference: str, max_new_tokens: int,
                  batch_size: int, seed: int) -> dict:
    """Sums of the client's forget or retain records: `set_sums` plus fact and multiple-choice counts."""
    if not records:
        return {**set_sums(name, SetScores([], [], [], [])), f"{name}-fact-n": 0, f"{name}-fact-hits": 0,
                f"{name}-mc-n": 0, f"{name}-mc-hits": 0}
    choice_questions = as_multiple_choice(records, seed) if all(r.get("perturbed_answer") for r in records) else []
    out: dict = {f"{name}-mc-n": len(choice_questions)}
    out[f"{name}-mc-hits"] = multiple_choice_hits(model, tokenizer, choice_questions, batch_size=batch_size)
    predictions = generate_answers(model, tokenizer, [r["question"] for r in records],
                                   max_new_tokens=max_new_tokens, batch_size=batch_size)
    with_fact = [(p, r["key_fact"]) for p, r in zip(predictions, records) if r.get("key_fact")]
    out[f"{name}-fact-n"] = len(with_fact)
    out[f"{name}-fact-hits"] = int(sum(fact_hits([p for p, _ in with_fact], [f for _, f in with_fact])))
    scores = score_set(model, tokenizer, records, reference=reference, predictions=predictions,
                       batch_size=batch_size, with_min_k=name == "forget")
    return {**out, **set_sums(name, scores)}


def client_llm_metrics(model, tokenizer, data, *, cfg) -> dict:
    """One client's sums and counts (module docstring), ready for a Flower MetricRecord."""
    protocol = getattr(data, "protocol", "") or protocol_of(cfg)
    max_new_tokens, batch_size = max_new_tokens_of(cfg, protocol), cfg["llm.eval-batch-size"]
    reference = "paraphrased_answer" if protocol == "tofu" else "answer"
    out: dict = {"tofu-protocol": int(protocol == "tofu"), "max-new-tokens": max_new_tokens}
    for name in OWN_SETS:
        out.update(_own_set_sums(model, tokenizer, data.evaluable(name), name, reference=reference,
                                 max_new_tokens=max_new_tokens, batch_size=batch_size, seed=cfg["seed"]))
    for name in PUBLIC_SETS:
        records = data.public.get(name, [])
        if records:
            predictions = generate_answers(model, tokenizer, [r["question"] for r in records],
                                           max_new_tokens=max_new_tokens, batch_size=batch_size)
            out.update(set_sums(name, score_set(model, tokenizer, records, reference="answer",
                                                predictions=predictions, batch_size=batch_size)))
    out["holdout-mink"] = min_k_scores(model, tokenizer, data.public.get("holdout", []), batch_size)
    return out


def _utility(values: list[float]) -> float:
    return math.nan if any(math.isnan(v) for v in values) else harmonic_mean(values)


def pool_llm_metrics(per_client: list[dict]) -> dict:
    """The results entry of one model from every client's sums (module docstring)."""
    sets = (*OWN_SETS, *PUBLIC_SETS)
    total = {k: sum(float(c.get(k, 0)) for c in per_client)
             for k in [f"{s}-{x}" for s in sets for x in ("n", "rouge", "prob", "truth")]
             + [f"{s}-{x}" for s in OWN_SETS for x in ("fact-n", "fact-hits", "mc-n", "mc-hits")]}
    ratios = [float(v) for c in per_client for v in c.get("forget-tr", [])]
    forget_truth = sum(min(tr, 1.0 / tr) for tr in ratios) / len(ratios) if ratios else math.nan
    kr = 1.0 - forget_truth
    entry = {
        "forget_fact_acc": ratio(total["forget-fact-hits"], total["forget-fact-n"]),
        "retain_fact_acc": ratio(total["retain-fact-hits"], total["retain-fact-n"]),
        "forget_rouge": ratio(total["forget-rouge"], total["forget-n"]),
        "forget_prob": ratio(total["forget-prob"], total["forget-n"]),
        "forget_mc_acc": ratio(total["forget-mc-hits"], total["forget-mc-n"]),
        "retain_mc_acc": ratio(total["retain-mc-hits"], total["retain-mc-n"]),
        "forget_truth": forget_truth,
    }
    utility_parts = []
    for name in ("retain", *PUBLIC_SETS):
        key = name.replace("-", "_")
        measures = {f"{key}_{m}": ratio(total[f"{name}-{m}"], total[f"{name}-n"]) for m in ("prob", "rouge", "truth")}
        if name == "retain" or total[f"{name}-n"]:
            entry.update(measures)
        utility_parts.append(list(measures.values()))
    retain_utility = _utility(utility_parts[0])
    protocol = "tofu" if any(c.get("tofu-protocol") for c in per_client) else "synthetic"
    entry.update({
        "kr": kr,
        "retain_utility": retain_utility,
        "utility": retain_utility,
        "model_utility": _utility([v for part in utility_parts for v in part]),
        "mia_min_k": mia_auc([float(v) for c in per_client for v in c.get("forget-mink", [])],
                             [float(v) for c in per_client for v in c.get("holdout-mink", [])]),
        "forget_acc": kr,
        "retain_acc": ratio(total["retain-fact-hits"], total["retain-fact-n"]),
        "test_acc": math.nan,
        "mia": math.nan,
        "mia_efficacy": math.nan,
        "llm_protocol": protocol,
        "llm_max_new_tokens": max((int(c.get("max-new-tokens", 0)) for c in per_client), default=0),
        TRUTH_RATIOS_KEY: ratios,
    })
    return entry
