"""Causal LMs with LoRA adapters (peft); only adapter weights are trained and travel.

``build_llm("tiny", ...)`` builds, offline and from a config, a small Llama whose vocabulary is the
word-level synthetic tokenizer (`tasks.llm.tokenizer.synthetic_tokenizer`); its frozen base weights
are a deterministic function of ``seed``. Any other name is a local Hugging Face model directory,
loaded with ``local_files_only=True`` (nothing is downloaded). LoRA follows FIRM / Lethe: the adapted
weight is ``W + (alpha / r) B A`` on the named linear modules (peft ``LoraConfig``).

4-bit NF4 quantisation (FIRM: Zephyr-7B in 4-bit) uses bitsandbytes and needs CUDA; the base is
quantised, the adapters stay in float32. A tiny model is quantised by saving it to a temporary
directory and reloading it with the quantisation config.
"""

from __future__ import annotations

import os
import tempfile

import torch
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict, set_peft_model_state_dict
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from tasks.llm.tokenizer import synthetic_tokenizer

TINY_MODEL = "tiny"
LLAMA_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""All seven projection modules of a Llama block (FIRM's TOFU setting: all linear layers)."""

# Tiny Llama: 2 layers, hidden 128: memorises 10 authors x 20 QA in ~15 epochs with LoRA r=16.
# Init std 0.1 instead of HF's 0.02: with 0.02 the frozen output layer caps logits near 2.6 and a
# LoRA-only model cannot make any token likely (measured: no learning at all).
TINY_LAYERS = 2
TINY_HIDDEN = 128
TINY_HEADS = 4
TINY_INTERMEDIATE = 256
TINY_MAX_POSITIONS = 128
TINY_INIT_STD = 0.1


def _tiny_llama(tokenizer, seed: int) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=TINY_HIDDEN, intermediate_size=TINY_INTERMEDIATE,
        num_hidden_layers=TINY_LAYERS, num_attention_heads=TINY_HEADS, num_key_value_heads=TINY_HEADS,
        max_position_embeddings=TINY_MAX_POSITIONS, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False, initializer_range=TINY_INIT_STD,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def _quantisation_config():
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                              bnb_4bit_compute_dtype=torch.bfloat16)


def _load_base(model_name_or_path: str, tokenizer, load_in_4bit: bool, seed: int):
    if model_name_or_path == TINY_MODEL:
        tokenizer = tokenizer if tokenizer is not None else synthetic_tokenizer()
        model = _tiny_llama(tokenizer, seed)
        if load_in_4bit:
            with tempfile.TemporaryDirectory() as folder:
                model.save_pretrained(folder)
                model = AutoModelForCausalLM.from_pretrained(
                    folder, quantization_config=_quantisation_config(), device_map={"": 0})
        return model, tokenizer
    if not os.path.isfile(os.path.join(model_name_or_path, "config.json")):
        raise ValueError(f"llm.model {model_name_or_path!r} is neither 'tiny' nor a local model "
                         "directory with a config.json (models are never downloaded)")
    try:
        if tokenizer is None:
            tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, local_files_only=True)
        extra = {"quantization_config": _quantisation_config(), "device_map": {"": 0}} if load_in_4bit else {}
        model = AutoModelForCausalLM.from_pretrained(model_name_or_path, local_files_only=True, **extra)
    except (OSError, ValueError) as error:
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ValueError(f"llm.model {model_name_or_path!r} could not be loaded locally: {first_line}") from None
    if tokenizer.pad_token is None:  # many causal LMs ship without one; padding is masked anyway
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def _linear_module_names(model: torch.nn.Module) -> list[str]:
    """Distinct last name components of the model's linear layers (what LoRA can target)."""
    names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
             if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Linear4bit"}
    return sorted(names)


def build_llm(model_name_or_path: str = TINY_MODEL, *, lora_rank: int = 16, lora_alpha: float = 32,
              lora_dropout: float = 0.0, target_modules: list[str] | tuple[str, ...] = LLAMA_TARGET_MODULES,
              load_in_4bit: bool = False, seed: int = 0, tokenizer=None):
    """A causal LM with fresh LoRA adapters, and its tokenizer: ``(peft_model, tokenizer)``.

    Only the LoRA matrices require gradients. LoRA ``A`` is initialised from ``seed`` (peft's
    Kaiming init), ``B`` at zero, so a new adapter does not change the base model's outputs.
    """
    if lora_rank <= 0:
        raise ValueError(f"llm.lora-rank must be a positive integer, got {lora_rank}")
    if not 0.0 <= lora_dropout < 1.0:
        raise ValueError(f"llm-lora-dropout must be in [0, 1), got {lora_dropout}")
    if not target_modules:
        raise ValueError("llm.target-modules must name at least one module")
    if load_in_4bit and not torch.cuda.is_available():
        raise ValueError("llm.load-in-4bit needs a CUDA GPU (bitsandbytes NF4); none is available here")
    base, tokenizer = _load_base(model_name_or_path, tokenizer, load_in_4bit, seed)
    available = _linear_module_names(base)
    missing = [name for name in target_modules if name not in available]
    if missing:
        raise ValueError(f"llm.target-modules {missing} not in the model; linear modules are {available}")
    config = LoraConfig(r=lora_rank, lora_alpha=lora_alpha, lora_dropout=lora_dropout,
                        target_modules=list(target_modules), task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        model = get_peft_model(base, config)
    return model, tokenizer


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The LoRA adapter weights only (peft key names), as float32 CPU tensors (bfloat16 cannot go
    into a Flower ``ArrayRecord``)."""
    return {key: value.detach().to(device="cpu", dtype=torch.float32)
            for key, value in get_peft_model_state_dict(model).items()}


def adapter_keys(model) -> dict[str, str]:
    """``{parameter name: adapter_state key}`` for every adapter tensor. peft drops the adapter's name
    from the keys it saves (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``); the two
    are matched by storage, not by that naming rule."""
    by_storage = {value.data_ptr(): key for key, value in get_peft_model_state_dict(model).items()}
    return {name: by_storage[p.data_ptr()] for name, p in model.named_parameters() if p.data_ptr() in by_storage}


def load_adapter_state(model, state: dict[str, torch.Tensor]) -> None:
    """Load adapter weights produced by `adapter_state` into ``model`` (cast to each parameter's
    dtype and device). Keys must match the model's adapter keys exactly."""
    own = get_peft_model_state_dict(model)
    if set(state) != set(own):
        extra = sorted(set(state) - set(own))[:3]
        absent = sorted(set(own) - set(state))[:3]
        raise ValueError(f"adapter state keys do not match the model: unexpected {extra}, missing {absent}")
    wrong_shape = [key for key, value in state.items() if tuple(value.shape) != tuple(own[key].shape)]
    if wrong_shape:
        raise ValueError(f"adapter state shapes do not match the model (another LoRA rank?): {wrong_shape[:3]}")
    cast = {key: value.to(device=own[key].device, dtype=own[key].dtype) for key, value in state.items()}
    set_peft_model_state_dict(model, cast)
