"""TOFU-style evaluation of a causal LM on QA records: generation, ROUGE-L, facts, truth ratio, KR.

Formulas (``P(a|q)`` is the model's probability of the answer tokens and the EOS after the prompt,
``|a|`` their number):

* **ROUGE-L recall** of the greedy answer against the reference answer (``rouge-score``, stemming
  on, as TOFU).
* **Fact accuracy**: fraction of records whose greedy answer contains ``key_fact`` as whole words
  (case-insensitive, punctuation ignored).
* **Probability**: mean over records of the length-normalised ``P(a|q)^(1/|a|)`` (TOFU "Prob." on the
  forget/retain sets); on other retain-side sets (real authors, world facts) TOFU's relative form
  ``P~(a) / (P~(a) + sum_j P~(a~_j))`` with ``P~(x) = P(x|q)^(1/|x|)`` over the perturbed answers.
* **Truth ratio** of record i (TOFU's length-normalised form; Lethe eq. 4 without epsilon because it
  is computed in log space):
  ``TR_i = (prod_j P~(a~_ij))^(1/m) / P~(y_i)``, the geometric mean over the m perturbed answers
  divided by the reference answer's normalised probability. The reference ``y_i`` is the trained
  answer by default (Lethe: "the original correct answer"); ``reference="paraphrased"`` uses the
  paraphrased answer on the forget and retain sets as TOFU does (TOFU's ``aggregate_eval_stat.py``:
  ``exp(mean_j loss(a~_ij) - loss(paraphrase_i))`` = ``1 / TR_i``); the other retain-side sets (real
  authors, world facts) always use the original answer, as TOFU does.
* Forget truth-ratio score ``mean_i min(TR_i, 1/TR_i)``; retain truth-ratio score
  ``mean_i max(0, 1 - TR_i)`` (TOFU).
* **KR** (Lethe eq. 4): ``1 - mean_i min(TR_i, 1/TR_i)`` on the forget set; high = still known.
* **Forget quality** (TOFU): p-value of the two-sample Kolmogorov-Smirnov test between the forget-set
  truth ratios of the evaluated model and of the retrained model (``scipy.stats.ks_2samp``).
* **Model utility**: harmonic mean of the retain-side measures (probability, ROUGE-L recall, retain
  truth-ratio score) over the retain set and every extra retain-side set (TOFU: retain, real
  authors, world facts); 0 if any of them is 0.
* **Multiple-choice accuracy**: the chosen option is the one with the highest summed log-likelihood
  ``log P(" " + choice | prompt)`` (no EOS), as lm-evaluation-harness's ``acc`` for WMDP/MMLU.
* **Min-k% probability MIA** (open-unlearning's ``mia_min_k``, Shi et al. 2024): the score of a
  record is ``-mean`` of the ``max(1, floor(k * T))`` lowest token log-probabilities of its answer
  (T tokens; k = ``MIN_K_FRACTION`` = 0.4, open-unlearning's TOFU setting); ``mia_auc`` is the ROC AUC
  of these scores with the forget set labelled 0 and the holdout set 1, so 1 = the forget answers
  are far more likely than never-seen ones (still memorised), 0.5 = indistinguishable.
* **PrivLeak** (MUSE, as open-unlearning's ``privleak``):
  ``((1 - AUC) - (1 - AUC_retrain)) / (1 - AUC_retrain) * 100``; 0 for the retrained model,
  negative when the forget set still looks like training data (-100 at AUC 1 vs a retrain AUC 0.5).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

import torch
from rouge_score import rouge_scorer
from scipy import stats

from tasks.llm.train import IGNORE_INDEX, collate, encode_qa

TRUTH_RATIO_REFERENCES = ("answer", "paraphrased")
MIN_K_FRACTION = 0.4
"""Share k of an answer's least likely tokens that min-k% scores (open-unlearning's TOFU ``mia_min_k``)."""


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def generate_answers(model, tokenizer, questions: Sequence[str], *, max_new_tokens: int = 16,
                     batch_size: int = 32) -> list[str]:
    """Greedy answers to ``questions`` (left-padded batches), decoded without special tokens."""
    model.eval()
    device = _device_of(model)
    answers: list[str] = []
    for start in range(0, len(questions), batch_size):
        prompts = [encode_qa(tokenizer, question, None)[0] for question in questions[start:start + batch_size]]
        width = max(len(ids) for ids in prompts)
        input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(prompts):
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        output = model.generate(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                                max_new_tokens=max_new_tokens, do_sample=False,
                                pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
        answers += [tokenizer.decode(row, skip_special_tokens=True).strip() for row in output[:, width:]]
    return answers


def rouge_l_recall(predictions: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L recall of each prediction against its reference."""
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    return [scorer.score(reference, prediction)["rougeL"].recall
            for prediction, reference in zip(predictions, references, strict=True)]


def _words(text: str) -> str:
    return " " + " ".join(re.sub(r"[^0-9a-z]+", " ", text.lower()).split()) + " "


def fact_hits(predictions: Sequence[str], key_facts: Sequence[str]) -> list[bool]:
    """Whether each prediction contains its key fact as whole words (case and punctuation ignored)."""
    if any(not fact.strip() for fact in key_facts):
        raise ValueError("every record needs a non-empty key_fact for fact accuracy")
    return [_words(fact) in _words(prediction) for prediction, fact in zip(predictions, key_facts, strict=True)]


@torch.no_grad()
def _token_log_probs(model, tokenizer, questions, answers, *, batch_size, include_eos, max_len):
    """Per batch: the log-probability of every target token and the mask of the answer's tokens."""
    if len(questions) != len(answers):
        raise ValueError(f"got {len(questions)} questions but {len(answers)} answers")
    model.eval()
    device = _device_of(model)
    for start in range(0, len(answers), batch_size):
        pairs = list(zip(questions[start:start + batch_size], answers[start:start + batch_size]))
        batch = collate(tokenizer, pairs, max_len)
        labels = batch["labels"]
        if not include_eos:
            labels = labels.masked_fill(batch["input_ids"] == tokenizer.eos_token_id, IGNORE_INDEX)
        logits = model(input_ids=batch["input_ids"].to(device),
                       attention_mask=batch["attention_mask"].to(device)).logits.float().cpu()
        targets = labels[:, 1:]
        mask = targets != IGNORE_INDEX
        log_probs = torch.log_softmax(logits[:, :-1], dim=-1)
        yield log_probs.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1), mask


def answer_log_probs(model, tokenizer, questions: Sequence[str], answers: Sequence[str], *,
                     batch_size: int = 32, include_eos: bool = True, max_len: int = 512
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed log-probability of each answer given its question, and its number of tokens.

    Returns two float64 CPU tensors of shape (len(answers),). With ``include_eos`` the EOS that ends
    every training answer is scored too."""
    sums, counts = [], []
    for picked, mask in _token_log_probs(model, tokenizer, questions, answers, batch_size=batch_size,
                                         include_eos=include_eos, max_len=max_len):
        sums.append((picked * mask).sum(dim=1).double())
        counts.append(mask.sum(dim=1).double())
    return torch.cat(sums), torch.cat(counts)


def answer_token_log_probs(model, tokenizer, questions: Sequence[str], answers: Sequence[str], *,
                           batch_size: int = 32, max_len: int = 512) -> list[torch.Tensor]:
    """Per answer, the log-probabilities of its tokens and EOS given the question (what min-k% reads)."""
    rows: list[torch.Tensor] = []
    for picked, mask in _token_log_probs(model, tokenizer, questions, answers, batch_size=batch_size,
                                         include_eos=True, max_len=max_len):
        rows += [row[keep].double() for row, keep in zip(picked, mask)]
    return rows


def min_k_score(token_log_probs: Sequence[float], k: float = MIN_K_FRACTION) -> float:
    """Min-k% score ``-mean`` of the ``max(1, floor(k T))`` lowest of T token log-probabilities
    (open-unlearning ``MinKProbAttack``; 0 for an empty answer, as there). High = unlikely text."""
    if not 0 < k <= 1:
        raise ValueError(f"min-k fraction must be in (0, 1], got {k}")
    values = sorted(float(v) for v in token_log_probs)
    if not values:
        return 0.0
    lowest = values[:max(1, int(len(values) * k))]
    return -sum(lowest) / len(lowest)


def mia_auc(forget_scores: Sequence[float], holdout_scores: Sequence[float]) -> float:
    """ROC AUC of MIA scores with forget labelled 0 and holdout 1 (open-unlearning ``mia_auc``):
    the probability that a holdout record scores above a forget record, ties counting one half
    (Mann-Whitney U / (n_forget n_holdout)); NaN when either set is empty."""
    if len(forget_scores) == 0 or len(holdout_scores) == 0:
        return math.nan
    ranks = stats.rankdata([*map(float, forget_scores), *map(float, holdout_scores)])
    n_forget, n_holdout = len(forget_scores), len(holdout_scores)
    u_holdout = float(ranks[n_forget:].sum()) - n_holdout * (n_holdout + 1) / 2
    return u_holdout / (n_forget * n_holdout)


def privleak(auc: float, auc_retrain: float) -> float:
    """MUSE's PrivLeak in percent, as open-unlearning's ``privleak`` computes it from two
    ``mia_auc`` values: ``((1 - auc) - (1 - auc_retrain)) / ((1 - auc_retrain) + 1e-10) * 100``."""
    return ((1.0 - auc) - (1.0 - auc_retrain)) / ((1.0 - auc_retrain) + 1e-10) * 100.0


def _normalised_log_prob(model, tokenizer, questions, answers, batch_size) -> torch.Tensor:
    """``log P~(a|q) = log P(a|q) / |a|`` per pair."""
    total, count = answer_log_probs(model, tokenizer, questions, answers, batch_size=batch_size)
    return total / count.clamp(min=1)


def _require_perturbed(records: Sequence[dict]) -> None:
    if any(not record.get("perturbed_answer") for record in records):
        raise ValueError("truth ratios need a non-empty perturbed_answer list in every record "
                         "(load TOFU's *_perturbed splits)")


def _perturbed_log_probs(model, tokenizer, records, batch_size) -> list[torch.Tensor]:
    """Per record, the normalised log-probabilities of its perturbed answers."""
    questions = [r["question"] for r in records for _ in r["perturbed_answer"]]
    answers = [a for r in records for a in r["perturbed_answer"]]
    flat = _normalised_log_prob(model, tokenizer, questions, answers, batch_size)
    return list(torch.split(flat, [len(r["perturbed_answer"]) for r in records]))


def truth_ratios_from_log_probs(reference: Sequence[float], perturbed: Sequence[Sequence[float]]) -> torch.Tensor:
    """``TR_i = exp(mean_j log P~(a~_ij) - log P~(y_i))`` from normalised log-probabilities (float64);
    with TOFU's logged average losses (``-log P~``) this is ``1 / exp(mean perturb loss - reference loss)``."""
    if len(reference) != len(perturbed):
        raise ValueError(f"got {len(reference)} reference answers but {len(perturbed)} perturbed lists")
    if any(len(row) == 0 for row in perturbed):
        raise ValueError("truth ratios need at least one perturbed answer per record")
    wrong = torch.stack([torch.as_tensor(row, dtype=torch.float64).mean() for row in perturbed])
    return torch.exp(wrong - torch.as_tensor(reference, dtype=torch.float64))


def relative_probabilities(answer: Sequence[float], perturbed: Sequence[Sequence[float]]) -> list[float]:
    """TOFU's option-normalised probability ``P~(a) / (P~(a) + sum_j P~(a~_j))`` per record, from the
    normalised log-probabilities of the answer and of its perturbed answers."""
    if len(answer) != len(perturbed):
        raise ValueError(f"got {len(answer)} answers but {len(perturbed)} perturbed lists")
    return [1.0 / (1.0 + float(torch.exp(torch.as_tensor(row, dtype=torch.float64) - float(c)).sum()))
            for c, row in zip(answer, perturbed)]


def truth_ratios(model, tokenizer, records: Sequence[dict], *, reference: str = "answer",
                 batch_size: int = 32) -> torch.Tensor:
    """``TR_i`` per record (float64, see module docstring); < 1 means the true answer is preferred."""
    if reference not in TRUTH_RATIO_REFERENCES:
        raise ValueError(f"truth-ratio reference must be one of {TRUTH_RATIO_REFERENCES}, got {reference!r}")
    _require_perturbed(records)
    field = "answer" if reference == "answer" else "paraphrased_answer"
    correct = _normalised_log_prob(model, tokenizer, [r["question"] for r in records],
                                   [r[field] for r in records], batch_size)
    return truth_ratios_from_log_probs(correct, _perturbed_log_probs(model, tokenizer, records, batch_size))


def forget_truth_score(ratios: torch.Tensor) -> float:
    """TOFU's forget-set truth-ratio score ``mean min(TR, 1/TR)`` (1 = cannot tell true from false)."""
    return float(torch.minimum(ratios, 1.0 / ratios).mean())


def retain_truth_score(ratios: torch.Tensor) -> float:
    """TOFU's retain-set truth-ratio score ``mean max(0, 1 - TR)`` (1 = always prefers the truth)."""
    return float((1.0 - ratios).clamp(min=0.0).mean())


def knowledge_retention(ratios: torch.Tensor) -> float:
    """KR of Lethe eq. 4: ``1 - mean min(TR, 1/TR)`` over the forget set."""
    return 1.0 - forget_truth_score(ratios)


def forget_quality(ratios: Sequence[float], retrain_ratios: Sequence[float]) -> float:
    """TOFU forget quality: KS two-sample p-value of truth ratios vs the retrained model's."""
    if len(ratios) == 0 or len(retrain_ratios) == 0:
        raise ValueError("forget quality needs non-empty truth-ratio lists for both models")
    return float(stats.ks_2samp(list(ratios), list(retrain_ratios)).pvalue)


def harmonic_mean(values: Sequence[float]) -> float:
    """Harmonic mean of non-negative values; 0 if any value is 0 (TOFU model utility)."""
    if not values:
        raise ValueError("harmonic mean of no values")
    if any(v < 0 for v in values):
        raise ValueError(f"harmonic mean needs non-negative values, got {list(values)}")
    if any(v == 0 for v in values):
        return 0.0
    return len(values) / sum(1.0 / v for v in values)


@torch.no_grad()
def multiple_choice_accuracy(model, tokenizer, records: Sequence[dict], *, batch_size: int = 32) -> float:
    """Fraction of {question, choices, answer} records whose highest-likelihood choice is ``answer``."""
    if not records:
        raise ValueError("multiple-choice accuracy needs at least one record")
    questions = [r["question"] for r in records for _ in r["choices"]]
    options = [choice for r in records for choice in r["choices"]]
    scores, _ = answer_log_probs(model, tokenizer, questions, options, batch_size=batch_size, include_eos=False)
    per_question = torch.split(scores, [len(r["choices"]) for r in records])
    return sum(int(s.argmax()) == int(r["answer"]) for s, r in zip(per_question, records)) / len(records)


def multiple_choice_hits(model, tokenizer, records: Sequence[dict], *, batch_size: int = 32) -> int:
    """How many of ``records`` the model answers right (`multiple_choice_accuracy`); 0 for none."""
    if not records:
        return 0
    return round(multiple_choice_accuracy(model, tokenizer, records, batch_size=batch_size) * len(records))


def ratio(part: float, whole: float) -> float:
    """``part / whole``, NaN when ``whole`` is 0 (a pooled fraction of an empty set)."""
    return float(part) / float(whole) if whole else math.nan


def _set_measures(model, tokenizer, records, prefix, *, relative_probability, reference,
                  max_new_tokens, batch_size) -> tuple[dict, torch.Tensor]:
    """ROUGE-L recall, fact accuracy (if facts are known), probability and truth ratios of one set."""
    questions = [r["question"] for r in records]
    predictions = generate_answers(model, tokenizer, questions, max_new_tokens=max_new_tokens,
                                   batch_size=batch_size)
    result = {f"{prefix}_rouge_l": sum(rouge_l_recall(predictions, [r["answer"] for r in records])) / len(records)}
    if all(r.get("key_fact") for r in records):
        result[f"{prefix}_fact_acc"] = sum(fact_hits(predictions, [r["key_fact"] for r in records])) / len(records)
    ratios = truth_ratios(model, tokenizer, records, reference=reference, batch_size=batch_size)
    correct = _normalised_log_prob(model, tokenizer, questions, [r["answer"] for r in records], batch_size)
    if relative_probability:
        share = relative_probabilities(correct, _perturbed_log_probs(model, tokenizer, records, batch_size))
        result[f"{prefix}_prob"] = sum(share) / len(share)
    else:
        result[f"{prefix}_prob"] = float(torch.exp(correct).mean())
    return result, ratios


def evaluate_llm(model, tokenizer, forget_records: Sequence[dict], retain_records: Sequence[dict], *,
                 extra_retain: dict[str, Sequence[dict]] | None = None, reference: str = "answer",
                 max_new_tokens: int = 16, batch_size: int = 32) -> dict:
    """All forget/retain measures of the module docstring in one dict.

    Keys: ``forget_{rouge_l,fact_acc,prob,truth_ratio}``, ``kr``, ``forget_truth_ratios`` (list, for
    `forget_quality` against the retrained model), ``retain_{rouge_l,fact_acc,prob,truth_ratio}``,
    the same four for each ``extra_retain`` name (e.g. ``real_authors``, ``world_facts``), and
    ``model_utility``. ``*_fact_acc`` is present only when every record of the set has a key fact.
    """
    if not forget_records or not retain_records:
        raise ValueError("evaluate_llm needs non-empty forget and retain records")
    options = {"reference": reference, "max_new_tokens": max_new_tokens, "batch_size": batch_size}
    result, forget_ratios = _set_measures(model, tokenizer, forget_records, "forget",
                                          relative_probability=False, **options)
    result["forget_truth_ratio"] = forget_truth_score(forget_ratios)
    result["kr"] = knowledge_retention(forget_ratios)
    result["forget_truth_ratios"] = [float(tr) for tr in forget_ratios]
    utility_parts = []
    sets = {"retain": retain_records, **(extra_retain or {})}
    for name, records in sets.items():
        if not records:
            raise ValueError(f"retain-side set {name!r} is empty")
        measures, ratios = _set_measures(model, tokenizer, records, name, relative_probability=name != "retain",
                                         **{**options, "reference": reference if name == "retain" else "answer"})
        measures[f"{name}_truth_ratio"] = retain_truth_score(ratios)
        result.update(measures)
        utility_parts += [measures[f"{name}_prob"], measures[f"{name}_rouge_l"], measures[f"{name}_truth_ratio"]]
    result["model_utility"] = harmonic_mean(utility_parts)
    return result
