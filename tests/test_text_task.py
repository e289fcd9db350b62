"""The text tasks: AG News files in their real layouts, the synthetic corpus, the encoder split, the trigger
phrase, bad input, and one client's view trained and evaluated through the Task interface."""

import datasets
import pytest
import torch

from core.config import ConfigError
from strategies.run_config import parse_config
from tasks.text import corpus
from tasks.text.data import load_agnews
from tasks.text.encoder import (
    build_text_model,
    encode_prefix,
    encoder_path,
    load_encoder,
)
from tasks.text.triggers import append_trigger, trigger_ids

MINILM = encoder_path("minilm")
ROWS = [("Troops sent to the border after the vote", 0), ("Striker scores twice in the cup final", 1),
        ("Central bank raises interest rates again", 2), ("Chip maker unveils a faster processor", 3)] * 10


def _parquet_layout(root, columns=("text", "label")):
    (root / "data").mkdir(parents=True)
    for split in ("train", "test"):
        rows = {"text": [t for t, _ in ROWS], "label": [l for _, l in ROWS]}
        datasets.Dataset.from_dict({c: rows[c] for c in columns}).to_parquet(
            str(root / "data" / f"{split}-00000-of-00001.parquet"))
    return str(root)


def test_agnews_loads_the_hf_parquet_layout_and_the_csv_form(tmp_path):
    pool = load_agnews(_parquet_layout(tmp_path / "hf"), max_samples=6)
    assert pool.texts[:2] == (ROWS[0][0], ROWS[1][0]) and pool.labels == (0, 1, 2, 3, 0, 1)
    csv = tmp_path / "csv"
    csv.mkdir()
    (csv / "train.csv").write_text('Class Index,Title,Description\n3,"Wall St. rallies","Stocks rose."\n'
                                   '4,"New chip","It is fast."\n')
    pool = load_agnews(str(csv))
    assert pool.texts == ("Wall St. rallies Stocks rose.", "New chip It is fast.") and pool.labels == (2, 3)


def test_agnews_without_a_label_column_or_files_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="no label column") as error:
        load_agnews(_parquet_layout(tmp_path, columns=("text",)))
    assert "\n" not in str(error.value)
    with pytest.raises(FileNotFoundError, match="data-dir"):
        load_agnews(str(tmp_path / "empty"))


def test_synthetic_corpus_is_deterministic_and_not_solved_by_keywords():
    texts, labels = corpus.synthetic_news(50, seed=3)
    assert (texts, labels) == corpus.synthetic_news(50, seed=3) and texts != corpus.synthetic_news(50, seed=4)[0]
    assert sorted(set(labels)) == [0, 1, 2, 3] and len(set(texts)) > 190
    assert corpus.keyword_vote_accuracy(texts, labels) < 0.85


def test_frozen_prefix_plus_trained_top_is_the_whole_encoder():
    tokenizer, encoder = load_encoder(MINILM)
    batch = tokenizer(["the striker scored twice", "shares fell sharply on wall street today"], padding="max_length",
                      max_length=16, truncation=True, return_tensors="pt")
    ids = torch.stack([batch["input_ids"], batch["attention_mask"]], 1)
    with torch.no_grad():
        full = encoder(**batch).last_hidden_state
        mask = batch["attention_mask"][..., None].float()
        expected = (full * mask).sum(1) / mask.sum(1)
        for layers in (1, 6, -1):
            model = build_text_model(encoder, layers, 4, seed=0).eval()
            assert torch.allclose(model.embed(encode_prefix(encoder, ids, layers)), expected, atol=1e-5)
    trained = {name.split(".")[2] for name, _ in build_text_model(encoder, 2, 4, 0).named_parameters()
               if name.startswith("features.layers.")}
    assert trained == {"0", "1"}  # two copied top layers, nothing below travels


def test_trigger_phrase_is_appended_before_sep_and_survives_truncation():
    tokenizer, _ = load_encoder(MINILM)
    phrase = trigger_ids(tokenizer, "cf")
    batch = tokenizer(["short text", "a much longer text that fills every position"], padding="max_length",
                      max_length=8, truncation=True, return_tensors="pt")
    ids = torch.stack([batch["input_ids"], batch["attention_mask"]], 1)
    out = append_trigger(ids, phrase, tokenizer.sep_token_id, tokenizer.pad_token_id)
    for row in range(2):
        n = int(out[row, 1].sum())
        assert out[row, 0, n - 1] == tokenizer.sep_token_id and out[row, 0, n - 2] == phrase[-1]
    assert int(out[0, 1].sum()) == int(ids[0, 1].sum()) + 1 and int(out[1, 1].sum()) == 8
    with pytest.raises(ValueError, match="text.trigger"):
        trigger_ids(tokenizer, " \u200b ")


def test_bad_text_settings_are_one_line_errors_before_training(tmp_path):
    with pytest.raises(ConfigError, match="text.max-length"):
        parse_config({"task": "text-minilm", "text.max-length": 0})
    cfg = parse_config({"task": "text-minilm", "text.encoder": str(tmp_path / "no-such-encoder")})
    with pytest.raises(ValueError, match="text.encoder.*does not exist"):
        cfg.task.check_setup(cfg, 3)
    cfg = parse_config({"task": "agnews-bert", "text.encoder": "no-such-org/no-such-encoder"})
    with pytest.raises(ValueError, match="'no-such-org/no-such-encoder' could not be loaded") as error:
        cfg.task.check_setup(cfg, 3)  # a Hub name absent from the local cache: nothing is downloaded
    assert "\n" not in str(error.value)
    for bad, key in (({"text.trigger": "  "}, "text.trigger"), ({"text.train-layers": 7}, "text.train-layers")):
        cfg = parse_config({"task": "text-minilm", **bad})
        with pytest.raises(ValueError, match=key):
            cfg.task.check_setup(cfg, 3)
    with pytest.raises(ConfigError, match="'method'='rmu' needs a task of kind llm") as error:
        parse_config({"task": "text-minilm", "method": "rmu", "scenario": "client"})  # a method without text
    assert "\n" not in str(error.value)


def test_agnews_client_view_with_a_local_encoder_trains_and_evaluates(tmp_path):
    cfg = parse_config({"task": "agnews-bert", "data-dir": _parquet_layout(tmp_path), "text.encoder": MINILM,
                        "scenario": "sample", "forget-client": 0, "text.max-length": 16, "sample-fraction": 0.3,
                        "dirichlet-alpha": 100.0}, num_clients=2)
    task = cfg.task
    task.check_setup(cfg, 2)
    data = task.build_view(cfg, 0, 2)
    assert data.retain_x.shape[1:] == (16, 385) and len(data.forget_y) > 0 and (data.forget_y == 0).all()
    assert len(data.triggered_test_y) > 0 and not torch.equal(data.triggered_test_x, data.test_x[:0])
    model = task.client_model(cfg, task.server_model(cfg, []).state_dict(), [])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state, metrics = task.train_role(cfg, data, model, "all", {"epochs": 1}, seed=1, objective=None)
    assert metrics["num-examples"] == len(data.retain_y) + len(data.forget_y)
    assert set(state) == set(before) and any(not torch.equal(state[k], before[k]) for k in state)
    assert not any(k.startswith("features.embeddings") for k in state)  # frozen layers never travel
    scores, _ = task.evaluate(cfg, data, model, {})
    assert scores["retain-n"] == len(data.retain_y) and scores["triggered-n"] == len(data.triggered_test_y)
    assert 0 <= scores["test-correct"] <= scores["test-n"] == len(data.test_y)


def test_text_task_presets_fill_defaults_and_give_way_to_given_values():
    cfg = parse_config({"task": "text-minilm"})
    assert (cfg["pretrain-rounds"], cfg["local-epochs"], cfg["continue-rounds"]) == (10, 1, 5)
    assert parse_config({"task": "text-minilm", "pretrain-rounds": 3})["pretrain-rounds"] == 3
    assert parse_config({"task": "mnist-lenet5"})["pretrain-rounds"] == 20  # mnist keeps the global default
