"""Shared by the LLM objective and Fisher tests: a tiny random Llama + LoRA and padded QA batches."""

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, PROMPT = 64, 3
CONFIG = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
LORA = dict(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])


def tiny_base(seed: int = 0):
    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**CONFIG))


def tiny_lora(seed: int = 0):
    """The tiny base with a fresh LoRA adapter (B = 0) on q/v/down_proj."""
    return get_peft_model(tiny_base(seed), LoraConfig(**LORA))


def make_batch(n: int, seed: int, answer_lens=(2, 6)) -> dict:
    """Right-padded batch; labels = input ids on answer tokens, -100 on prompt and padding."""
    g = torch.Generator().manual_seed(seed)
    lengths = [PROMPT + int(torch.randint(answer_lens[0], answer_lens[1] + 1, (1,), generator=g)) for _ in range(n)]
    width = max(lengths)
    ids = torch.zeros(n, width, dtype=torch.long)
    mask = torch.zeros(n, width, dtype=torch.long)
    labels = torch.full((n, width), -100)
    for i, length in enumerate(lengths):
        ids[i, :length] = torch.randint(1, VOCAB, (length,), generator=g)
        mask[i, :length] = 1
        labels[i, PROMPT:length] = ids[i, PROMPT:length]
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}
