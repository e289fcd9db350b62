"""The LLM task's model on a node, what the server sees of it, and one local (un)learning update.

Every node (server and clients) builds the same base model from the run config with the run
seed (``tasks.llm.model.build_llm``: the tiny Llama's weights and the fresh LoRA ``A`` are
functions of the seed), so only the LoRA adapter has to cross the grid. The built model is cached
per process (Ray keeps a simulated client alive across rounds; in-process runs share it): the
frozen base never changes and each message loads its adapter before use, so sharing is safe.

The server never runs the LLM: :class:`AdapterModel` exposes the adapter's tensors under the
names that travel (``state_dict`` / ``named_parameters``), which is all FedAvg, the cache and
layer-wise server rules need (every adapter tensor is a parameter; there are no buffers).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterator

import torch

from tasks.llm.model import adapter_state, build_llm, load_adapter_state
from tasks.llm.train import ce, finetune, qa_batches


def target_modules(cfg) -> tuple[str, ...]:
    """``llm.target-modules`` as a tuple of module names."""
    return tuple(name.strip() for name in cfg["llm.target-modules"].split(",") if name.strip())


@lru_cache(maxsize=2)
def _built(model: str, rank: int, alpha: float, targets: tuple[str, ...], load_in_4bit: bool, seed: int,
           device: str):
    peft_model, tokenizer = build_llm(model, lora_rank=rank, lora_alpha=alpha, target_modules=targets,
                                      load_in_4bit=load_in_4bit, seed=seed)
    if not load_in_4bit:
        peft_model.to(torch.device(device))
    # adapter_state does not copy CPU float32 tensors: clone, or training would change the "fresh" adapter
    return peft_model, tokenizer, {k: v.clone() for k, v in adapter_state(peft_model).items()}


def base_model(cfg) -> str:
    """The run's base model: ``llm.model``, or a merged model given as ``original-model``
    (``tasks.llm.given_model``)."""
    from tasks.llm.given_model import given_base

    return given_base(cfg) or cfg["llm.model"]


def task_llm(cfg, device: torch.device | None = None):
    """(peft model, tokenizer, initial adapter state) of the run, built once per process."""
    device = device or torch.device("cpu")
    return _built(base_model(cfg), cfg["llm.lora-rank"], cfg["llm.lora-alpha"], target_modules(cfg),
                  cfg["llm.load-in-4bit"], cfg["seed"], str(device))


def full_precision_twin(cfg, model, device: torch.device | None = None):
    """The run's model loaded without 4-bit quantisation, carrying ``model``'s current adapter: where a
    4-bit client takes a Fisher on full-precision weights (a separately loaded bf16/fp32 copy).
    Built once per process like ``task_llm``; the adapter is reloaded on every call."""
    device = device or torch.device("cpu")
    twin = _built(base_model(cfg), cfg["llm.lora-rank"], cfg["llm.lora-alpha"], target_modules(cfg), False,
                  cfg["seed"], str(device))[0]
    load_adapter_state(twin, adapter_state(model))
    return twin


class AdapterModel:
    """The server's view of the LLM: the fresh LoRA adapter's tensors, under the names that travel."""

    def __init__(self, initial_adapter: dict[str, torch.Tensor]):
        self._state = initial_adapter

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self._state.items()}

    def named_parameters(self) -> Iterator[tuple[str, torch.Tensor]]:
        return iter(self.state_dict().items())


def server_adapter_model(cfg) -> AdapterModel:
    """The fresh adapter of the run (what pretraining and the retrain oracle start from)."""
    return AdapterModel(task_llm(cfg)[2])


def local_update(model, tokenizer, records: list[dict], *, cfg, epochs: int, lr: float, seed: int,
                 loss_fn=None, prepare=None) -> float:
    """Train the adapter on ``records`` with ``loss_fn`` (default: the task's answer-token
    cross-entropy ``tasks.llm.train.ce``); the mean loss of the last epoch. ``prepare(model, batches)``
    may return the batches with what the loss needs precomputed (a reference model's log-probs)."""
    loss_fn = loss_fn or ce
    batches = qa_batches(records, tokenizer, cfg["llm.batch-size"], seed)
    if prepare is not None:
        batches = prepare(model, batches)
    history = finetune(model, batches, epochs, lr, seed, loss_fn=lambda m, b: loss_fn(m, b))
    return history[-1] if history else float("nan")
