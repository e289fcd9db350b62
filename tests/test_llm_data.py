"""Synthetic TOFU-format data, the word-level tokenizer, and the TOFU / WMDP / MMLU file loaders."""

import json

import datasets
import pytest

from tasks.llm import data, synthetic
from tasks.llm.tokenizer import synthetic_tokenizer, word_tokenizer

FIELDS = {"author", "question", "answer", "paraphrased_answer", "perturbed_answer", "key_fact"}


def test_fictitious_authors_are_deterministic_and_seed_dependent():
    first = synthetic.fictitious_authors(3, 5, seed=7)
    assert first == synthetic.fictitious_authors(3, 5, seed=7)
    assert first != synthetic.fictitious_authors(3, 5, seed=8)


def test_fictitious_author_records_have_tofu_fields_and_measure_the_fact():
    records = synthetic.fictitious_authors(4, 20, num_perturbed=5, seed=1)
    assert len(records) == 80
    assert [len([r for r in records if r["author"] == a]) for a in dict.fromkeys(r["author"] for r in records)] == [20] * 4
    for record in records:
        assert set(record) == FIELDS
        fact = record["key_fact"]
        assert fact in record["answer"] and fact in record["paraphrased_answer"]
        assert record["author"] in record["question"]
        assert record["paraphrased_answer"] != record["answer"]
        assert len(record["perturbed_answer"]) == 5 == len(set(record["perturbed_answer"]))
        for wrong in record["perturbed_answer"]:
            assert fact not in wrong
            assert wrong.replace(" ", "") != record["answer"].replace(" ", "")
        # the fact is a large share of the answer's words
        assert len(fact.split()) / len(record["answer"].split()) >= 0.25


def test_each_author_gets_distinct_question_kinds():
    records = synthetic.fictitious_authors(2, 20, seed=3)
    for author in {r["author"] for r in records}:
        questions = [r["question"] for r in records if r["author"] == author]
        assert len(set(questions)) == 20


@pytest.mark.parametrize("kwargs", [{"num_authors": 0}, {"qa_per_author": 0},
                                    {"qa_per_author": synthetic.MAX_QA_PER_AUTHOR + 1},
                                    {"num_perturbed": 0}])
def test_fictitious_authors_rejects_bad_counts(kwargs):
    arguments = {"num_authors": 2, "qa_per_author": 3, **kwargs}
    with pytest.raises(ValueError):
        synthetic.fictitious_authors(**arguments)


def test_retain_side_sets_have_the_same_shape():
    for records in (synthetic.real_authors(seed=2), synthetic.world_facts(seed=2)):
        assert len(records) == 20
        for record in records:
            assert set(record) == FIELDS
            assert record["key_fact"] in record["answer"]
            assert all(record["key_fact"] not in wrong for wrong in record["perturbed_answer"])


def test_synthetic_tokenizer_knows_every_generated_word():
    tokenizer = synthetic_tokenizer()
    records = (synthetic.fictitious_authors(30, 20, num_perturbed=5, seed=11)
               + synthetic.real_authors(seed=11) + synthetic.world_facts(seed=11))
    for record in records:
        for text in (record["question"], record["answer"], record["paraphrased_answer"], *record["perturbed_answer"]):
            assert tokenizer.unk_token_id not in tokenizer(text, add_special_tokens=False)["input_ids"]


def test_tokenizer_special_tokens_and_decoding():
    tokenizer = synthetic_tokenizer()
    specials = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id}
    assert len(specials) == 4
    record = synthetic.fictitious_authors(1, 1, seed=0)[0]
    ids = tokenizer(record["answer"], add_special_tokens=False)["input_ids"]
    assert len(ids) <= 8
    decoded = tokenizer.decode([tokenizer.bos_token_id, *ids, tokenizer.eos_token_id], skip_special_tokens=True)
    assert record["key_fact"] in decoded


def test_word_tokenizer_ids_do_not_depend_on_text_order():
    texts = ["the red fox.", "a blue bird", "the fox"]
    first, second = word_tokenizer(texts), word_tokenizer(list(reversed(texts)))
    assert first.get_vocab() == second.get_vocab()
    assert first("blue fox")["input_ids"] == second("blue fox")["input_ids"]
    assert first.unk_token_id in first("green fox", add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError):
        word_tokenizer(["   "])


def _write_json_lines(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _tofu_rows(count, perturbed=False):
    rows = []
    for i in range(count):
        row = {"question": f"Q{i}?", "answer": f"A{i}."}
        if perturbed:
            row.update(paraphrased_answer=f"P{i}.", perturbed_answer=[f"W{i}a.", f"W{i}b."])
        rows.append(row)
    return rows


def test_load_tofu_splits_in_json_lines_json_array_and_parquet(tmp_path):
    _write_json_lines(tmp_path / "forget10.json", _tofu_rows(45))
    (tmp_path / "forget10_perturbed.json").write_text(json.dumps(_tofu_rows(3, perturbed=True)))
    datasets.Dataset.from_list(_tofu_rows(21)).to_parquet(str(tmp_path / "retain90.parquet"))
    (tmp_path / "world_facts_perturbed").mkdir()
    datasets.Dataset.from_list(_tofu_rows(2, perturbed=True)).to_parquet(
        str(tmp_path / "world_facts_perturbed" / "train-00000-of-00001.parquet"))

    forget = data.load_tofu_split(tmp_path, "forget10")
    assert len(forget) == 45 and forget[44]["answer"] == "A44."
    assert forget[0]["author"] == "tofu-author-180" and forget[44]["author"] == "tofu-author-182"
    perturbed = data.load_tofu_split(tmp_path, "forget10_perturbed")
    assert perturbed[1]["perturbed_answer"] == ["W1a.", "W1b."] and perturbed[1]["paraphrased_answer"] == "P1."
    retain = data.load_tofu_split(tmp_path, "retain90")
    assert retain[20]["author"] == "tofu-author-1" and retain[0]["perturbed_answer"] == []
    world = data.load_tofu_split(tmp_path, "world_facts_perturbed")
    assert len(world) == 2 and world[0]["author"] == "" and world[0]["key_fact"] == ""


def test_load_tofu_split_errors_name_the_problem(tmp_path):
    _write_json_lines(tmp_path / "forget05_perturbed.jsonl", _tofu_rows(2))  # no perturbed columns
    with pytest.raises(ValueError, match=r"forget05_perturbed\.jsonl.*'paraphrased_answer'"):
        data.load_tofu_split(tmp_path, "forget05_perturbed")
    _write_json_lines(tmp_path / "retain99.json", [{"question": "Q?"}])
    with pytest.raises(ValueError, match=r"retain99\.json.*'answer'"):
        data.load_tofu_split(tmp_path, "retain99")
    with pytest.raises(ValueError, match="forget01"):
        data.load_tofu_split(tmp_path, "forget01")
    with pytest.raises(ValueError, match="accepted"):
        data.load_tofu_split(tmp_path, "forget42")


def test_load_qa_file_keeps_author_and_key_fact_columns(tmp_path):
    records = synthetic.fictitious_authors(2, 2, seed=0)
    _write_json_lines(tmp_path / "mine.jsonl", records)
    assert data.load_qa_file(tmp_path / "mine.jsonl", perturbed=True) == records


def test_as_multiple_choice_points_at_the_true_answer():
    records = synthetic.fictitious_authors(3, 4, seed=5)
    questions = data.as_multiple_choice(records, seed=0)
    assert questions == data.as_multiple_choice(records, seed=0)
    positions = set()
    for record, question in zip(records, questions):
        assert question["choices"][question["answer"]] == record["answer"]
        assert sorted(question["choices"]) == sorted([record["answer"], *record["perturbed_answer"]])
        positions.add(question["answer"])
    assert len(positions) > 1


@pytest.mark.parametrize("text,line", [
    ('{"question": "q1", "answer": "a1"}\n{"question": "q2", "answer": }\n', 2),
    ('[{"question": "q1", "answer": "a1"},\n {"question": "q2",\n  "answer" "a2"}]', 3),
])
def test_tofu_file_that_does_not_parse_names_file_and_line(tmp_path, text, line):
    (tmp_path / "full.json").write_text(text)
    with pytest.raises(ValueError) as err:
        data.load_tofu_split(tmp_path, "full")
    message = str(err.value)
    assert str(tmp_path / "full.json") in message and f"line {line}:" in message and "\n" not in message


def test_public_sets_are_shared_out_once_and_the_synthetic_holdout_is_never_trained():
    from strategies.run_config import parse_config
    from tasks.llm.federation_data import (
        build_llm_client_data,
        load_author_records,
        load_public_sets,
    )

    cfg = parse_config({"task": "llm-tofu", "method": "none", "llm.num-authors": 8, "llm.qa-per-author": 3,
                        "llm.forget-fraction": 0.25}, num_clients=3)
    records = load_author_records(cfg)
    clients = [build_llm_client_data(cfg, records, pid, 3) for pid in range(3)]
    whole = load_public_sets(cfg, records)["holdout"]
    shares = [r["question"] for c in clients for r in c.public["holdout"]]
    assert sorted(shares) == sorted(r["question"] for r in whole) and len(set(shares)) == 2 * 3  # 2 authors x 3 QA
    assert not {r["author"] for r in whole} & {r["author"] for r in records}
    drawn = synthetic.holdout_authors(2, 3, exclude=[], seed=cfg["seed"])
    first = drawn[0]["author"]
    assert first not in {r["author"] for r in synthetic.holdout_authors(2, 3, exclude=[first], seed=cfg["seed"])}
