"""Tiny Llama + LoRA construction, adapter-only state, QA batches and the fine-tuning loop."""

import pytest
import torch

from tasks.llm import synthetic
from tasks.llm.model import adapter_state, build_llm, load_adapter_state
from tasks.llm.train import (
    IGNORE_INDEX,
    answer_loss,
    finetune,
    mean_answer_loss,
    qa_batches,
)


@pytest.fixture(scope="module")
def tiny():
    return build_llm("tiny", lora_rank=4, lora_alpha=8, seed=0)


def _logits(model, tokenizer, text="Question: Where was Kalo Mi born?\nAnswer:"):
    ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_only_lora_parameters_train_and_a_fresh_adapter_changes_nothing(tiny):
    model, tokenizer = tiny
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    with model.disable_adapter():
        base = _logits(model, tokenizer)
    assert torch.allclose(_logits(model, tokenizer), base)


def test_build_is_deterministic_in_the_seed():
    first, tokenizer = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=3)
    second, _ = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=3)
    other, _ = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=4)
    assert torch.equal(_logits(first, tokenizer), _logits(second, tokenizer))
    assert not torch.equal(_logits(first, tokenizer), _logits(other, tokenizer))
    for key, value in adapter_state(first).items():
        assert torch.equal(value, adapter_state(second)[key])


def test_bad_settings_raise_one_line_value_errors(tmp_path):
    with pytest.raises(ValueError, match="llm.lora-rank"):
        build_llm("tiny", lora_rank=0, lora_alpha=8, seed=0)
    with pytest.raises(ValueError, match=r"not in the model.*q_proj") as error:
        build_llm("tiny", lora_rank=2, lora_alpha=4, target_modules=["c_attn"], seed=0)
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match="llm.model"):
        build_llm(str(tmp_path / "no-such-model"), lora_rank=2, lora_alpha=4, seed=0)
    with pytest.raises(ValueError, match="llm.model") as error:
        build_llm(str(tmp_path), lora_rank=2, lora_alpha=4, seed=0)  # a folder without a model
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a model folder without weights
    with pytest.raises(ValueError, match="could not be loaded") as error:
        build_llm(str(tmp_path), lora_rank=2, lora_alpha=4, seed=0)
    assert "\n" not in str(error.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA refusal")
def test_four_bit_without_cuda_is_refused_before_loading():
    with pytest.raises(ValueError, match="llm.load-in-4bit"):
        build_llm("does-not-matter", lora_rank=2, lora_alpha=4, load_in_4bit=True, seed=0)


def test_adapter_state_holds_only_float32_cpu_lora_weights_and_round_trips(tiny):
    model, tokenizer = tiny
    state = adapter_state(model)
    assert state and all("lora_" in key for key in state)
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in state.values())
    trained = {key: torch.randn_like(value) * 0.1 for key, value in state.items()}
    load_adapter_state(model, trained)
    other, _ = build_llm("tiny", lora_rank=4, lora_alpha=8, seed=0)
    assert not torch.allclose(_logits(other, tokenizer), _logits(model, tokenizer))
    load_adapter_state(other, adapter_state(model))
    assert torch.allclose(_logits(other, tokenizer), _logits(model, tokenizer))
    load_adapter_state(model, state)  # leave the shared fixture untouched


def test_adapter_state_casts_bfloat16():
    model, _ = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=0)
    model.to(torch.bfloat16)
    assert all(v.dtype == torch.float32 for v in adapter_state(model).values())
    load_adapter_state(model, adapter_state(model))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())


def test_load_adapter_state_rejects_foreign_keys(tiny):
    model, _ = tiny
    state = adapter_state(model)
    state.pop(next(iter(state)))
    with pytest.raises(ValueError, match="missing"):
        load_adapter_state(model, state)
    other_rank, _ = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=0)
    with pytest.raises(ValueError, match="shapes"):
        load_adapter_state(model, adapter_state(other_rank))


def test_qa_batches_mask_the_question_and_keep_the_answer(tiny):
    _, tokenizer = tiny
    records = synthetic.fictitious_authors(2, 3, seed=0)
    batches = qa_batches(records, tokenizer, batch_size=4, seed=1)
    assert [b["input_ids"].shape[0] for b in batches] == [4, 2]
    assert [b["input_ids"].tolist() for b in batches] == [b["input_ids"].tolist() for b in qa_batches(records, tokenizer, 4, seed=1)]
    answers = {r["answer"].replace(" ", "") for r in records}
    for batch in batches:
        for ids, mask, labels in zip(batch["input_ids"], batch["attention_mask"], batch["labels"]):
            kept = labels[labels != IGNORE_INDEX]
            assert kept[-1] == tokenizer.eos_token_id
            assert tokenizer.decode(kept, skip_special_tokens=True).replace(" ", "") in answers
            assert torch.equal(ids[labels != IGNORE_INDEX], kept)
            assert (labels[mask == 0] == IGNORE_INDEX).all()
            assert "?" in tokenizer.decode(ids[: int(mask.sum())][labels[: int(mask.sum())] == IGNORE_INDEX])
    with pytest.raises(ValueError, match="llm.batch-size"):
        qa_batches(records, tokenizer, batch_size=0, seed=0)


def test_finetune_trains_only_adapters_and_lowers_the_loss():
    model, tokenizer = build_llm("tiny", lora_rank=4, lora_alpha=8, seed=1)
    base_before = {k: v.clone() for k, v in model.state_dict().items() if "lora_" not in k}
    batches = qa_batches(synthetic.fictitious_authors(2, 4, seed=2), tokenizer, batch_size=4, seed=0)
    history = finetune(model, batches, epochs=6, lr=5e-3, seed=0)
    assert len(history) == 6 and history[-1] < history[0]
    for key, value in model.state_dict().items():
        if key in base_before:
            assert torch.equal(value, base_before[key]), key
    assert any(v.abs().sum() > 0 for k, v in adapter_state(model).items() if "lora_B" in k)


def test_finetune_uses_a_plugged_in_loss():
    model, tokenizer = build_llm("tiny", lora_rank=2, lora_alpha=4, seed=1)
    batches = qa_batches(synthetic.fictitious_authors(1, 2, seed=2), tokenizer, batch_size=2, seed=0)
    before = answer_loss(model, batches[0]).item()
    calls = []

    def ascent(m, batch):
        calls.append(batch["input_ids"].shape)
        return -answer_loss(m, batch)

    finetune(model, batches, epochs=3, lr=5e-3, seed=0, loss_fn=ascent)
    assert len(calls) == 3 and answer_loss(model, batches[0]).item() > before


def test_mean_answer_loss_is_the_eval_mean_of_the_batch_losses(tiny):
    model, tokenizer = tiny
    batches = qa_batches(synthetic.fictitious_authors(1, 6, seed=2), tokenizer, batch_size=4, seed=0)
    model.train()
    with torch.no_grad():
        model.eval()
        expected = sum(float(answer_loss(model, b)) for b in batches) / len(batches)
        model.train()
    assert mean_answer_loss(model, batches) == pytest.approx(expected, rel=1e-6)
    assert model.training  # flag restored
    with pytest.raises(ValueError, match="at least one batch"):
        mean_answer_loss(model, [])


def test_full_precision_twin_carries_the_clients_adapter():
    from strategies.run_config import parse_config
    from tasks.llm.federation_model import full_precision_twin

    cfg = parse_config({"task": "llm-tofu", "method": "firm", "llm.lora-rank": 4}, num_clients=2)
    model, _ = build_llm("tiny", lora_rank=4, lora_alpha=cfg["llm.lora-alpha"], seed=5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.25)
    twin = full_precision_twin(cfg, model)
    assert twin is not model
    theirs, ours = adapter_state(twin), adapter_state(model)
    assert set(theirs) == set(ours) and all(torch.equal(theirs[k], ours[k]) for k in ours)
