"""TOFU-style metrics, and the evidence that the tiny model learns synthetic facts and the metrics see it."""

import math

import pytest
import torch

from tasks.llm import metrics, synthetic
from tasks.llm.data import as_multiple_choice
from tasks.llm.model import build_llm
from tasks.llm.train import answer_loss, collate, finetune, qa_batches

# Defaults measured to memorise 10 authors x 4 QA pairs in a few seconds on one core.
AUTHORS, QA_PER_AUTHOR, EPOCHS, LR, BATCH = 10, 4, 12, 5e-3, 8


def _measure(model, tokenizer, records):
    answers = metrics.generate_answers(model, tokenizer, [r["question"] for r in records], max_new_tokens=8)
    ratios = metrics.truth_ratios(model, tokenizer, records)
    return {
        "fact_acc": sum(metrics.fact_hits(answers, [r["key_fact"] for r in records])) / len(records),
        "rouge": sum(metrics.rouge_l_recall(answers, [r["answer"] for r in records])) / len(records),
        "kr": metrics.knowledge_retention(ratios),
        "mc": metrics.multiple_choice_accuracy(model, tokenizer, as_multiple_choice(records, seed=0)),
        "ratios": ratios,
    }


@pytest.fixture(scope="module")
def learned():
    records = synthetic.fictitious_authors(AUTHORS, QA_PER_AUTHOR, seed=0)
    model, tokenizer = build_llm("tiny", lora_rank=16, lora_alpha=32, seed=0)
    before = _measure(model, tokenizer, records)
    finetune(model, qa_batches(records, tokenizer, BATCH, seed=0), epochs=EPOCHS, lr=LR, seed=0)
    return model, tokenizer, records, before, _measure(model, tokenizer, records)


def test_fine_tuning_teaches_the_facts_and_every_knowledge_metric_sees_it(learned):
    _, _, _, before, after = learned
    assert before["fact_acc"] <= 0.1
    assert after["fact_acc"] >= 0.8
    assert after["rouge"] > before["rouge"] + 0.4
    assert after["kr"] > before["kr"] + 0.3
    assert after["mc"] >= 0.8 > before["mc"] + 0.3
    assert float(after["ratios"].median()) < 0.5


def test_batched_generation_and_scoring_match_one_at_a_time(learned):
    model, tokenizer, records, _, _ = learned
    questions = [r["question"] for r in records[:5]]
    assert metrics.generate_answers(model, tokenizer, questions, batch_size=5) == \
        [metrics.generate_answers(model, tokenizer, [q], batch_size=1)[0] for q in questions]
    answers = [r["answer"] for r in records[:5]]
    totals, counts = metrics.answer_log_probs(model, tokenizer, questions, answers, batch_size=5)
    for question, answer, total, count in zip(questions, answers, totals, counts):
        with torch.no_grad():
            mean_nll = answer_loss(model, collate(tokenizer, [(question, answer)], 512)).item()
        assert math.isclose(-float(total) / float(count), mean_nll, rel_tol=1e-4)


def test_truth_ratio_is_the_length_normalised_geometric_mean_ratio(learned):
    model, tokenizer, records, _, _ = learned
    record = records[0]
    ratio = float(metrics.truth_ratios(model, tokenizer, [record])[0])
    total, count = metrics.answer_log_probs(model, tokenizer, [record["question"]] * (1 + len(record["perturbed_answer"])),
                                            [record["answer"], *record["perturbed_answer"]])
    normalised = total / count
    assert math.isclose(ratio, math.exp(float(normalised[1:].mean() - normalised[0])), rel_tol=1e-6)
    paraphrased = float(metrics.truth_ratios(model, tokenizer, [record], reference="paraphrased")[0])
    assert paraphrased != ratio
    with pytest.raises(ValueError, match="truth-ratio reference must be one of") as err:
        metrics.truth_ratios(model, tokenizer, [record], reference="gold")
    assert "llm-" not in str(err.value)  # no such setting: the reference is chosen by the data source
    with pytest.raises(ValueError, match="perturbed_answer"):
        metrics.truth_ratios(model, tokenizer, [{**record, "perturbed_answer": []}])


def test_evaluate_llm_bundles_forget_retain_and_utility(learned):
    model, tokenizer, records, _, _ = learned
    forget, retain = records[:8], records[8:]
    extra = {"world_facts": synthetic.world_facts(seed=0)[:6]}
    result = metrics.evaluate_llm(model, tokenizer, forget, retain, extra_retain=extra, max_new_tokens=8)
    for prefix in ("forget", "retain", "world_facts"):
        for measure in ("rouge_l", "fact_acc", "prob", "truth_ratio"):
            assert 0.0 <= result[f"{prefix}_{measure}"] <= 1.0
    assert len(result["forget_truth_ratios"]) == 8
    assert math.isclose(result["kr"], 1 - result["forget_truth_ratio"])
    parts = [result[f"{p}_{m}"] for p in ("retain", "world_facts") for m in ("prob", "rouge_l", "truth_ratio")]
    assert math.isclose(result["model_utility"], metrics.harmonic_mean(parts))
    assert result["retain_fact_acc"] > result["world_facts_fact_acc"]  # only the authors were trained
    # TOFU's per-split reference: the paraphrase on forget/retain, the original answer on world facts
    tofu = metrics.evaluate_llm(model, tokenizer, forget, retain, extra_retain=extra, reference="paraphrased",
                                max_new_tokens=8)
    assert tofu["world_facts_truth_ratio"] == result["world_facts_truth_ratio"]
    assert tofu["retain_truth_ratio"] != result["retain_truth_ratio"]


def test_truth_ratio_scores_and_kr_formulas():
    ratios = torch.tensor([0.25, 1.0, 4.0], dtype=torch.float64)
    assert math.isclose(metrics.forget_truth_score(ratios), (0.25 + 1.0 + 0.25) / 3)
    assert math.isclose(metrics.knowledge_retention(ratios), 1 - 0.5)
    assert math.isclose(metrics.retain_truth_score(ratios), 0.75 / 3)


def test_forget_quality_is_a_ks_p_value():
    same = [0.1 * i for i in range(1, 30)]
    assert metrics.forget_quality(same, same) == pytest.approx(1.0)
    shifted = [value + 10 for value in same]
    assert metrics.forget_quality(same, shifted) < 1e-6
    with pytest.raises(ValueError):
        metrics.forget_quality([], same)


def test_harmonic_mean():
    assert metrics.harmonic_mean([0.5, 0.5]) == pytest.approx(0.5)
    assert metrics.harmonic_mean([1.0, 0.25]) == pytest.approx(0.4)
    assert metrics.harmonic_mean([0.9, 0.0]) == 0.0
    with pytest.raises(ValueError):
        metrics.harmonic_mean([-1.0, 1.0])


def test_rouge_and_fact_hits_tell_a_wrong_fact_apart():
    record = synthetic.fictitious_authors(1, 1, seed=4)[0]
    right, wrong = record["answer"], record["perturbed_answer"][0]
    assert metrics.rouge_l_recall([right, wrong], [right, right])[0] == 1.0
    assert metrics.rouge_l_recall([wrong], [right])[0] < 1.0
    assert metrics.fact_hits([right, wrong], [record["key_fact"]] * 2) == [True, False]
    assert metrics.fact_hits(["Born in Kalo Vale ."], ["kalo vale"]) == [True]
    assert metrics.fact_hits(["Born in Kalomi Vale"], ["Kalo"]) == [False]
    with pytest.raises(ValueError, match="key_fact"):
        metrics.fact_hits(["x"], [""])
