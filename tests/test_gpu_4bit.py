"""4-bit NF4 LLM clients on a CUDA GPU (bitsandbytes): loading, LoRA training, and FIRM's Fisher on the
full-precision twin. Skipped without bitsandbytes or without CUDA, so the CPU suite stays green;
``scripts/device_check.sh`` runs it on a GPU machine.

What must hold (docs/llm.md, docs/firm.md):

* ``build_llm(..., load_in_4bit=True)`` quantises every adapted projection to a bitsandbytes
  ``Linear4bit`` (NF4), keeps the LoRA tensors as trainable floating tensors, gives finite logits near
  the full-precision model's, and its adapter state has the full-precision model's keys and shapes.
* LoRA fine-tuning (``local_update``) lowers the answer loss and leaves the packed base untouched.
* A 4-bit client's FIRM upload (``adapter_release`` with the twin of ``full_precision_twin``, as
  ``strategies.firm.client.fisher_query`` builds it) has a full-precision client's keys, is finite, its
  Fisher is nonnegative and not all zero, and that Fisher equals the Fisher of a full-precision model
  loaded with the same adapter.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="4-bit NF4 needs a CUDA GPU")
bnb = pytest.importorskip("bitsandbytes")

from peft.tuners.lora import LoraLayer  # noqa: E402

from strategies.firm.client import adapter_release  # noqa: E402
from strategies.firm.fisher import fisher_reference_model, is_quantised  # noqa: E402
from strategies.run_config import parse_config  # noqa: E402
from tasks.llm.federation_model import (  # noqa: E402
    full_precision_twin,
    local_update,
    target_modules,
    task_llm,
)
from tasks.llm.model import (  # noqa: E402
    LLAMA_TARGET_MODULES,
    TINY_LAYERS,
    adapter_state,
    build_llm,
    load_adapter_state,
)
from tasks.llm.synthetic import fictitious_authors  # noqa: E402
from tasks.llm.train import mean_answer_loss, qa_batches  # noqa: E402

DEVICE = torch.device("cuda")
RANK, ALPHA = 8, 16.0
RUN_CONFIG = {"task": "llm-tofu", "method": "firm", "llm.load-in-4bit": True, "llm.lora-rank": RANK,
              "llm.lora-alpha": ALPHA, "llm.batch-size": 8, "seed": 0}


@pytest.fixture(scope="module")
def cfg():
    return parse_config(RUN_CONFIG)


@pytest.fixture(scope="module")
def records():
    """Two synthetic authors, 10 QA pairs each: the first is 'retained', the second 'forgotten'."""
    data = fictitious_authors(2, 10, seed=0)
    return {"retain": data[:10], "forget": data[10:], "all": data}


def _build(load_in_4bit: bool, seed: int = 0):
    model, tokenizer = build_llm("tiny", lora_rank=RANK, lora_alpha=ALPHA, load_in_4bit=load_in_4bit, seed=seed)
    if not load_in_4bit:
        model.to(DEVICE)
    return model, tokenizer


def _lora_layers(model) -> dict[str, LoraLayer]:
    return {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}


def _on(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in batch.items()}


def _relative_gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


# --------------------------------------------------------------------------- loading
def test_four_bit_model_quantises_every_adapted_projection_and_keeps_float_lora():
    model, _ = _build(load_in_4bit=True)
    layers = _lora_layers(model)
    assert len(layers) == TINY_LAYERS * len(LLAMA_TARGET_MODULES)
    for name, layer in layers.items():
        base = layer.get_base_layer()
        assert isinstance(base, bnb.nn.Linear4bit), f"{name}: base is {type(base).__name__}"
        assert isinstance(base.weight, bnb.nn.Params4bit) and base.weight.dtype == torch.uint8
        assert base.weight.device.type == DEVICE.type
        assert base.weight.quant_state is not None and base.weight.quant_state.quant_type == "nf4"
    assert is_quantised(model)
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert len(trainable) == 2 * len(layers)  # lora_A and lora_B of each adapted projection
    for name, param in trainable.items():
        assert "lora_" in name
        assert param.dtype.is_floating_point and param.device.type == DEVICE.type, (name, param.dtype, param.device)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


def test_four_bit_forward_is_finite_and_near_the_full_precision_model(records):
    four, tokenizer = _build(load_in_4bit=True)
    full, _ = _build(load_in_4bit=False)
    assert not is_quantised(full)
    batch = _on(qa_batches(records["all"], tokenizer, 8, seed=0)[0], DEVICE)
    with torch.no_grad():
        logits4 = four(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
        logits = full(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    assert logits4.shape == logits.shape == (*batch["input_ids"].shape, len(tokenizer))
    assert torch.isfinite(logits4).all()
    real = batch["attention_mask"].bool()
    cosine = float(F.cosine_similarity(logits4[real].flatten(), logits[real].flatten(), dim=0))
    print(f"logits cosine, 4-bit vs full precision: {cosine:.4f}")
    assert cosine > 0.8, f"4-bit logits far from full precision: cosine {cosine:.3f}"


def test_four_bit_adapter_state_has_the_full_precision_keys_and_shapes():
    four, _ = _build(load_in_4bit=True)
    full, _ = _build(load_in_4bit=False)
    state4, state = adapter_state(four), adapter_state(full)
    assert state4 and set(state4) == set(state)
    assert all(state4[k].shape == state[k].shape for k in state)
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in state4.values())
    load_adapter_state(full, state4)  # and it travels both ways
    load_adapter_state(four, state)


def test_fresh_four_bit_adapter_is_the_full_precision_one_rounded_to_bfloat16():
    """The fresh LoRA ``A`` is drawn from the seed like the full-precision model's; peft then casts the
    adapter to the 4-bit layer's compute dtype (bfloat16) and back to float32, so every node of a 4-bit
    run starts from the same adapter, the full-precision one rounded to bfloat16."""
    state4, state = adapter_state(_build(load_in_4bit=True)[0]), adapter_state(_build(load_in_4bit=False)[0])
    assert any(bool(v.any()) for k, v in state.items() if "lora_A" in k)
    assert all(torch.equal(state4[k], state[k].to(torch.bfloat16).float()) for k in state)


# --------------------------------------------------------------------------- training
def test_lora_finetuning_of_the_four_bit_model_lowers_the_loss(cfg, records):
    model, tokenizer = _build(load_in_4bit=True)
    batches = qa_batches(records["all"], tokenizer, cfg["llm.batch-size"], seed=0)
    packed = {name: layer.get_base_layer().weight.detach().clone() for name, layer in _lora_layers(model).items()}
    before = mean_answer_loss(model, batches)
    last = local_update(model, tokenizer, records["all"], cfg=cfg, epochs=8, lr=5e-3, seed=0)
    after = mean_answer_loss(model, batches)
    print(f"4-bit LoRA fine-tuning: answer loss {before:.3f} -> {after:.3f} (last epoch mean {last:.3f})")
    assert math.isfinite(before) and math.isfinite(last) and math.isfinite(after)
    assert after < 0.7 * before, f"loss {before:.3f} -> {after:.3f}"
    for name, layer in _lora_layers(model).items():  # only the adapter trained
        assert torch.equal(layer.get_base_layer().weight.detach(), packed[name]), name
    assert any(bool(v.any()) for k, v in adapter_state(model).items() if "lora_B" in k)


# --------------------------------------------------------------------------- FIRM on a 4-bit client
def test_firm_upload_of_a_four_bit_client_matches_a_full_precision_clients(cfg, records):
    # The client's model as tasks.llm.task.LLMTask.client_model builds it (cached 4-bit model), with a trained
    # "original" adapter (B != 0), as the server broadcasts it in FIRM's query.fisher.
    model, tokenizer, fresh = task_llm(cfg, DEVICE)
    assert is_quantised(model)
    load_adapter_state(model, fresh)
    local_update(model, tokenizer, records["all"], cfg=cfg, epochs=3, lr=5e-3, seed=1)
    original = {k: v.clone() for k, v in adapter_state(model).items()}  # no alias of the live adapter
    settings = {"role": "forget", "objective": "ascent", "epochs": cfg["llm.unlearn-epochs"],
                "lr": cfg["llm.unlearn-lr"], "seed": 7, "fisher_batches": cfg["firm.fisher-batches"]}
    batches = qa_batches(records["forget"], tokenizer, cfg["llm.batch-size"], settings["seed"])

    # 4-bit client: Fisher on the full-precision twin carrying the received adapter (strategies.firm.client.fisher_query)
    load_adapter_state(model, original)
    twin = fisher_reference_model(model, load_full_precision=lambda: full_precision_twin(cfg, model, DEVICE))
    assert twin is not model and not is_quantised(twin)
    assert next(twin.parameters()).device.type == DEVICE.type
    assert all(torch.equal(v, original[k]) for k, v in adapter_state(twin).items())
    upload4 = adapter_release(model, batches, fisher_model=twin, **settings)

    # full-precision client: the same run without 4-bit, loaded with the same adapter
    full, _ = build_llm("tiny", lora_rank=RANK, lora_alpha=ALPHA, target_modules=target_modules(cfg), seed=cfg["seed"])
    full.to(DEVICE)
    load_adapter_state(full, original)
    upload = adapter_release(full, batches, **settings)

    assert upload4["num_examples"] == upload["num_examples"] == len(records["forget"])
    keys = set(original)
    for part in ("task_vector", "fisher"):
        assert set(upload4[part]) == set(upload[part]) == keys, part
        for key, value in upload4[part].items():
            assert value.shape == upload[part][key].shape == original[key].shape, (part, key)
            assert value.dtype == torch.float32 and value.device.type == "cpu", (part, key)
            assert torch.isfinite(value).all(), (part, key)
    fisher4, fisher = upload4["fisher"], upload["fisher"]
    assert all(bool((v >= 0).all()) for v in fisher4.values())
    assert sum(float(v.sum()) for v in fisher4.values()) > 0
    assert all(bool(v.any()) for k, v in fisher4.items() if "lora_A" in k)  # B != 0: lora_A has a Fisher too
    gaps = {key: _relative_gap(fisher4[key], fisher[key]) for key in fisher}
    worst = max(gaps, key=gaps.get)
    print(f"Fisher twin vs full-precision client: worst relative gap {gaps[worst]:.2e} ({worst})")
    assert gaps[worst] < 1e-4, f"{worst}: relative gap {gaps[worst]:.2e}"

    # the 4-bit client's update is a real ascent step on the same data, like the full-precision one's
    assert any(bool(v.any()) for v in upload4["task_vector"].values())
    flat4 = torch.cat([upload4["task_vector"][k].flatten() for k in sorted(keys)])
    flat = torch.cat([upload["task_vector"][k].flatten() for k in sorted(keys)])
    cosine = float(F.cosine_similarity(flat4, flat, dim=0))
    print(f"task vector cosine, 4-bit vs full-precision client: {cosine:.3f}")
    assert cosine > 0.5, f"task vectors disagree: cosine {cosine:.3f}"
