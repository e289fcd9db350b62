"""QA batches with the question masked, and a plain AdamW fine-tuning loop over LoRA parameters.

Sequence layout (one per QA record), question and answer tokenised separately so the boundary is
exact for any tokenizer:

    [BOS] tokens(format_prompt(question)) tokens(" " + answer) [EOS]

``labels`` copy ``input_ids`` except -100 on the BOS/prompt tokens and on padding, so the loss is the
answer's (and its EOS, which teaches the model to stop). Sequences are right-padded and truncated to
``max_len`` from the right.

``loss_fn(model, batch) -> scalar`` is pluggable: the default is causal-LM cross-entropy on the
answer tokens; unlearning objectives (gradient ascent, NPO, SimNPO, RMU) plug in with the same
signature.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100


def format_prompt(question: str) -> str:
    """The prompt a question is shown as, for training and for generation alike."""
    return f"Question: {question}\nAnswer:"


def encode_qa(tokenizer, question: str, answer: str | None) -> tuple[list[int], int]:
    """Token ids of one (question, answer) sequence and the length of its prompt part.

    With ``answer=None`` only ``[BOS] prompt`` is returned (for generation)."""
    prompt = tokenizer(format_prompt(question), add_special_tokens=False)["input_ids"]
    if tokenizer.bos_token_id is not None:
        prompt = [tokenizer.bos_token_id] + prompt
    if answer is None:
        return prompt, len(prompt)
    reply = tokenizer(" " + answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return prompt + reply, len(prompt)


def collate(tokenizer, pairs: Sequence[tuple[str, str]], max_len: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and answer-only ``labels`` for (question, answer) pairs."""
    encoded = []
    for question, answer in pairs:
        ids, prompt_len = encode_qa(tokenizer, question, answer)
        ids = ids[:max_len]
        labels = [IGNORE_INDEX] * min(prompt_len, len(ids)) + ids[prompt_len:]
        encoded.append((ids, labels))
    width = max(len(ids) for ids, _ in encoded)
    input_ids = torch.full((len(encoded), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(encoded), width), dtype=torch.long)
    labels = torch.full((len(encoded), width), IGNORE_INDEX, dtype=torch.long)
    for row, (ids, target) in enumerate(encoded):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        labels[row, : len(target)] = torch.tensor(target)
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def qa_batches(records: Sequence[dict], tokenizer, batch_size: int, seed: int,
               max_len: int = 64) -> list[dict[str, torch.Tensor]]:
    """The records, shuffled with ``seed``, as training batches of question->answer sequences."""
    if batch_size < 1:
        raise ValueError(f"llm.batch-size must be >= 1, got {batch_size}")
    if max_len < 2:
        raise ValueError(f"llm-max-len must be >= 2, got {max_len}")
    if not records:
        raise ValueError("records must not be empty")
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    pairs = [(records[i]["question"], records[i]["answer"]) for i in order]
    return [collate(tokenizer, pairs[start:start + batch_size], max_len)
            for start in range(0, len(pairs), batch_size)]


def answer_loss(model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean causal-LM cross-entropy over the answer tokens of the batch (HF's shifted loss)."""
    return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                 labels=batch["labels"]).loss


@torch.no_grad()
def mean_answer_loss(model, batches: Sequence[dict[str, torch.Tensor]]) -> float:
    """Mean of :func:`answer_loss` over ``batches`` in eval mode (no dropout, no gradients)."""
    if not batches:
        raise ValueError("mean_answer_loss needs at least one batch")
    was_training = model.training
    model.eval()
    device = _device_of(model)
    try:
        losses = [float(answer_loss(model, {k: v.to(device) for k, v in b.items()})) for b in batches]
    finally:
        model.train(was_training)
    return sum(losses) / len(losses)


def _device_of(model) -> torch.device:
    return next(model.parameters()).device


def finetune(model, batches: Sequence[dict[str, torch.Tensor]], epochs: int, lr: float, seed: int,
             loss_fn: Callable | None = None, weight_decay: float = 0.0) -> list[float]:
    """Train the trainable (LoRA) parameters with AdamW for ``epochs`` passes; return the mean loss
    of each epoch.

    Batches are visited in an order reshuffled every epoch from ``seed``; LoRA dropout draws from a
    torch generator seeded with ``seed`` (the global RNG state is restored afterwards).
    """
    if epochs < 0:
        raise ValueError(f"llm-epochs must be >= 0, got {epochs}")
    if lr <= 0:
        raise ValueError(f"llm.lr must be > 0, got {lr}")
    loss_fn = loss_fn or answer_loss
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("model has no trainable parameters (expected LoRA adapters)")
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    device = _device_of(model)
    order_rng = random.Random(seed)
    history = []
    model.train()
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        for _ in range(epochs):
            order = list(range(len(batches)))
            order_rng.shuffle(order)
            total = 0.0
            for index in order:
                batch = {key: value.to(device) if isinstance(value, torch.Tensor) else value
                         for key, value in batches[index].items()}
                loss = loss_fn(model, batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
            history.append(total / max(len(batches), 1))
    model.eval()
    return history


def sequence_logprob(model: nn.Module, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed answer-token log-probability per sequence and the number of answer tokens.

    Returns ``(logp, n_tokens)``, both of shape (B,); ``logp`` is float32 and differentiable.
    """
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    token_nll = F.cross_entropy(
        logits[:, :-1].float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none"
    )
    return -token_nll.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1)


def _require_answer_tokens(n_tokens: torch.Tensor) -> None:
    if int(n_tokens.sum()) == 0:
        raise ValueError("batch['labels'] has no answer tokens (all -100); need at least one label")


def ce(model: nn.Module, batch: dict, **ctx) -> torch.Tensor:
    """Answer-token cross entropy averaged over all answer tokens of the batch."""
    logp, n_tokens = sequence_logprob(model, batch)
    _require_answer_tokens(n_tokens)
    return -logp.sum() / n_tokens.sum()
