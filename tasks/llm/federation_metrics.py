"""LLM metrics in the federation: per-client sums, pooled on the server into a results entry.

A client scores its own forget and retain records (``LLMClientData.evaluable``) with the
functions of ``tasks.llm.metrics`` and sends sums and counts (plus the per-sample forget truth
ratios, model outputs only), so pooled means weigh every record equally, whichever client holds it:

* ``{set}-n``, ``{set}-rouge`` (sum of ROUGE-L recall of the greedy answer), ``{set}-fact-n`` /
  ``{set}-fact-hits`` (records with a key fact / whose greedy answer contains it), ``{set}-prob``
  (sum of ``P(a|q)^(1/|a|)``), ``retain-truth`` (sum of ``max(0, 1 - TR)``), ``forget-tr`` (the list
  of forget truth ratios ``TR_i``), ``{set}-mc-n`` / ``{set}-mc-hits`` (the records asked as
  multiple-choice questions — the answer among its perturbed answers, order shuffled with the run's
  seed — and how many the model's option log-likelihood gets right).

Pooled entry (fractions in [0, 1]; NaN -> ``null`` when a set is empty):
``forget_fact_acc, retain_fact_acc, forget_rouge, retain_rouge, forget_prob, retain_prob,
forget_truth = mean min(TR, 1/TR)`` (TOFU forget truth-ratio score), ``retain_truth = mean max(0,
1 - TR)``, ``kr = 1 - forget_truth`` (Lethe eq. 4), ``utility`` = harmonic mean of retain prob,
ROUGE-L and truth score (TOFU model utility on the retain set; the tiny offline model has no
general knowledge, so TOFU's Real Authors / World Facts sets are not part of it), and
``forget_acc = kr`` so the resurfacing block (KR curve, RR) is the same as for vision tasks. The other
keys of the vision contract: ``retain_acc`` = ``retain_fact_acc``; ``test_acc`` and ``mia`` are NaN
(``null``: TOFU has no held-out split, and no MIA is defined here).
``forget_quality`` (KS p-value of the forget truth ratios against the retrain model's) is added by
:func:`tasks.llm.forget_quality.attach_forget_quality` once the retrain model has been evaluated.
"""

from __future__ import annotations

import math

import torch

from tasks.llm.forget_quality import TRUTH_RATIOS_KEY
from tasks.llm.data import as_multiple_choice
from tasks.llm.metrics import (answer_log_probs, fact_hits, generate_answers, harmonic_mean,
                               multiple_choice_accuracy, rouge_l_recall, truth_ratios)


def _set_sums(model, tokenizer, records: list[dict], name: str, *, max_new_tokens: int, batch_size: int,
              seed: int) -> dict:
    out: dict = {f"{name}-n": len(records)}
    if not records:
        return {**out, f"{name}-rouge": 0.0, f"{name}-fact-n": 0, f"{name}-fact-hits": 0, f"{name}-prob": 0.0,
                f"{name}-mc-n": 0, f"{name}-mc-hits": 0,
                **({"forget-tr": []} if name == "forget" else {"retain-truth": 0.0})}
    choice_questions = as_multiple_choice(records, seed) if all(r.get("perturbed_answer") for r in records) else []
    out[f"{name}-mc-n"] = len(choice_questions)
    out[f"{name}-mc-hits"] = round(multiple_choice_accuracy(model, tokenizer, choice_questions, batch_size=batch_size)
                                   * len(choice_questions)) if choice_questions else 0
    questions = [r["question"] for r in records]
    predictions = generate_answers(model, tokenizer, questions, max_new_tokens=max_new_tokens, batch_size=batch_size)
    out[f"{name}-rouge"] = float(sum(rouge_l_recall(predictions, [r["answer"] for r in records])))
    with_fact = [(p, r["key_fact"]) for p, r in zip(predictions, records) if r.get("key_fact")]
    out[f"{name}-fact-n"] = len(with_fact)
    out[f"{name}-fact-hits"] = int(sum(fact_hits([p for p, _ in with_fact], [f for _, f in with_fact])))
    total, count = answer_log_probs(model, tokenizer, questions, [r["answer"] for r in records], batch_size=batch_size)
    out[f"{name}-prob"] = float(torch.exp(total / count.clamp(min=1)).sum())
    ratios = truth_ratios(model, tokenizer, records, batch_size=batch_size)
    if name == "forget":
        out["forget-tr"] = [float(tr) for tr in ratios]
    else:
        out["retain-truth"] = float((1.0 - ratios).clamp(min=0.0).sum())
    return out


def client_llm_metrics(model, tokenizer, data, *, max_new_tokens: int, batch_size: int, seed: int) -> dict:
    """One client's sums and counts (module docstring), ready for a Flower MetricRecord."""
    out: dict = {}
    for name in ("forget", "retain"):
        out.update(_set_sums(model, tokenizer, data.evaluable(name), name,
                             max_new_tokens=max_new_tokens, batch_size=batch_size, seed=seed))
    return out


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else math.nan


def pool_llm_metrics(per_client: list[dict]) -> dict:
    """The results entry of one model from every client's sums (module docstring)."""
    total = {k: sum(float(c.get(k, 0)) for c in per_client)
             for k in [f"{s}-{x}" for s in ("forget", "retain") for x in ("n", "rouge", "fact-n", "fact-hits", "prob", "mc-n", "mc-hits")]
             + ["retain-truth"]}
    ratios = [float(v) for c in per_client for v in c.get("forget-tr", [])]
    forget_truth = sum(min(tr, 1.0 / tr) for tr in ratios) / len(ratios) if ratios else math.nan
    retain = [_ratio(total["retain-prob"], total["retain-n"]), _ratio(total["retain-rouge"], total["retain-n"]),
              _ratio(total["retain-truth"], total["retain-n"])]
    kr = 1.0 - forget_truth
    return {
        "forget_fact_acc": _ratio(total["forget-fact-hits"], total["forget-fact-n"]),
        "retain_fact_acc": _ratio(total["retain-fact-hits"], total["retain-fact-n"]),
        "forget_rouge": _ratio(total["forget-rouge"], total["forget-n"]),
        "retain_rouge": retain[1],
        "forget_prob": _ratio(total["forget-prob"], total["forget-n"]),
        "forget_mc_acc": _ratio(total["forget-mc-hits"], total["forget-mc-n"]),
        "retain_mc_acc": _ratio(total["retain-mc-hits"], total["retain-mc-n"]),
        "retain_prob": retain[0],
        "forget_truth": forget_truth,
        "retain_truth": retain[2],
        "kr": kr,
        "utility": math.nan if any(math.isnan(v) for v in retain) else harmonic_mean(retain),
        "forget_acc": kr,
        "retain_acc": _ratio(total["retain-fact-hits"], total["retain-fact-n"]),
        "test_acc": math.nan,
        "mia": math.nan,
        TRUTH_RATIOS_KEY: ratios,
    }
