"""Client-side FIRM summaries: empirical diagonal Fisher and LoRA task vectors.

FIRM (Appendix C, "Fisher Computation"): one sequence per Fisher batch, ``num_batches = 20``
batches in data order (cycling when fewer sequences exist), the causal-LM loss averaged over the
sequence's target tokens, its gradient squared element-wise, then averaged over batches:

    F(j) = 1/N * sum_b ( d L_b(theta_F) / d theta_j )^2,   L_b = -1/|y_b| sum_t log p(y_bt | ...)

Target tokens are the answer tokens (``labels != -100``); sequences without any are skipped;
padding is dropped and sequences are cut to ``max_length = 512`` tokens (the paper's truncation).
Squares are accumulated in float32 and the result is float32 on the CPU. Dropout is off (eval
mode) while the Fisher is computed — the paper is silent; this makes it deterministic.

Coordinate spaces (``space``):

- ``"weight"`` (default, the paper's): FIRM's task vector is ``vec(s B A)`` per adapted weight and
  its Fisher is taken on the pretrained weights theta_F, restricted to the task-vector support.
  So keys are the adapted base weights, e.g. ``model.layers.0.self_attn.q_proj.weight``, the
  Fisher is computed with the adapter disabled, and ``task_vector`` returns ``s (B A)_after -
  s (B A)_before`` per adapted weight. Only modules with trainable LoRA tensors are included.
- ``"lora"``: the trainable LoRA tensors themselves (peft parameter names), Fisher at the current
  weights with the adapter on, task vector ``after - before``. Note that at a fresh adapter
  (B = 0) the Fisher of every ``lora_A`` is exactly zero, which is why the paper's space is the
  default.

Two ways to get the per-sequence gradients, equal up to float rounding:
``per_sample_fisher_loop`` (one forward/backward per sequence — the plain baseline) and
``diagonal_fisher`` (sequences right-padded into chunks; one forward/backward per chunk; forward
hooks keep each adapted Linear's input ``a`` and output ``z``, and the per-sequence weight gradient
is ``sum_t dL_b/dz_bt  a_bt^T`` — exact because sequences in a batch do not interact, and right
padding leaves a causal LM's outputs on real tokens unchanged).

4-bit models: the paper computes the Fisher on a separately loaded bfloat16 copy. Use
``fisher_reference_model(model, load_full_precision=...)`` and pass the copy to ``diagonal_fisher``
together with ``names=adapted_weight_names(model)``.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
SPACES = ("weight", "lora")
_PEFT_PREFIX = "base_model.model."

__all__ = [
    "SPACES",
    "adapted_weight_names",
    "diagonal_fisher",
    "fisher_reference_model",
    "is_quantised",
    "lora_state",
    "per_sample_fisher_loop",
    "task_vector",
]


# --------------------------------------------------------------------------- naming
def _lora_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Adapted modules with at least one trainable LoRA tensor, keyed by their clean weight name."""
    from peft.tuners.lora import LoraLayer

    found = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer) and any(
            p.requires_grad for n, p in module.named_parameters() if "lora_" in n
        ):
            found[name.removeprefix(_PEFT_PREFIX) + ".weight"] = module
    return found


def adapted_weight_names(model: nn.Module) -> list[str]:
    """Clean names (``model.layers.0.mlp.down_proj.weight``) of the weights whose adapter trains."""
    return list(_lora_layers(model))


def _check_space(space: str) -> None:
    if space not in SPACES:
        raise ValueError(f"space must be one of {list(SPACES)}, got {space!r}")


def _targets(model: nn.Module, space: str, names: Iterable[str] | None) -> dict[str, nn.Linear]:
    """The Linear modules whose ``.weight`` the Fisher is taken over, keyed by output name."""
    _check_space(space)
    if space == "weight" and is_quantised(model):
        raise ValueError("model is quantised: compute the weight-space Fisher on fisher_reference_model(model, ...)")
    if space == "lora":
        targets = {}
        for name, module in model.named_modules():
            if isinstance(module, nn.Linear) and ".lora_" in name and module.weight.requires_grad:
                targets[name + ".weight"] = module
    elif names is None:
        targets = {key: layer.get_base_layer() for key, layer in _lora_layers(model).items()}
    else:
        root = model.get_base_model() if hasattr(model, "get_base_model") else model
        targets = {}
        for key in names:
            module = root.get_submodule(key.removesuffix(".weight"))
            targets[key] = module.get_base_layer() if hasattr(module, "get_base_layer") else module
    if not targets:
        raise ValueError(f"no trainable adapted tensors found for space={space!r}")
    return targets


# --------------------------------------------------------------------------- data
def _sequences(batches: Iterable[dict], num_batches: int, max_length: int) -> list[dict]:
    """The first ``num_batches`` single sequences (padding dropped, cut to ``max_length`` tokens),
    cycling through ``batches`` when there are fewer."""
    if not isinstance(num_batches, int) or num_batches < 1:
        raise ValueError(f"num_batches must be an int >= 1, got {num_batches!r}")
    if not isinstance(max_length, int) or max_length < 2:
        raise ValueError(f"max_length must be an int >= 2, got {max_length!r}")
    pool = []
    for batch in batches:
        for i in range(batch["input_ids"].shape[0]):
            keep = batch["attention_mask"][i].bool()
            seq = {k: batch[k][i][keep][:max_length] for k in ("input_ids", "attention_mask", "labels")}
            if (seq["labels"][1:] != IGNORE_INDEX).any():
                pool.append(seq)
            if len(pool) == num_batches:
                return pool
    if not pool:
        raise ValueError("batches contain no sequence with answer tokens (labels != -100)")
    return [pool[i % len(pool)] for i in range(num_batches)]


def _right_pad(seqs: list[dict]) -> dict:
    length = max(s["input_ids"].shape[0] for s in seqs)
    fill = {"input_ids": 0, "attention_mask": 0, "labels": IGNORE_INDEX}
    return {
        k: torch.stack([F.pad(s[k], (0, length - s[k].shape[0]), value=v) for s in seqs])
        for k, v in fill.items()
    }


def _per_sequence_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    """Token-averaged answer cross entropy of each sequence, shape (B,)."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    return nll.sum(1) / (labels != IGNORE_INDEX).sum(1)


# --------------------------------------------------------------------------- model state
@contextlib.contextmanager
def _fisher_mode(model: nn.Module, space: str, weights: list[torch.Tensor]) -> Iterator[None]:
    """Eval mode, adapter off for the weight space, and the target weights temporarily require grad."""
    was_training = model.training
    flags = [w.requires_grad for w in weights]
    adapter_off = (
        model.disable_adapter() if space == "weight" and hasattr(model, "disable_adapter") else contextlib.nullcontext()
    )
    model.eval()
    try:
        for w in weights:
            w.requires_grad_(True)
        with adapter_off:
            yield
    finally:
        for w, flag in zip(weights, flags):
            w.requires_grad_(flag)
        model.train(was_training)


def _to_device(seq: dict, device: torch.device) -> dict:
    return {k: v.to(device) for k, v in seq.items()}


# --------------------------------------------------------------------------- Fisher
def per_sample_fisher_loop(
    model: nn.Module,
    batches: Iterable[dict],
    *,
    num_batches: int = 20,
    space: str = "weight",
    names: Iterable[str] | None = None,
    max_length: int = 512,
) -> dict[str, torch.Tensor]:
    """Diagonal Fisher with one forward/backward per sequence (the plain benchmark baseline)."""
    targets = _targets(model, space, names)
    seqs = _sequences(batches, num_batches, max_length)
    weights = [m.weight for m in targets.values()]
    device = weights[0].device
    total = {k: torch.zeros(m.weight.shape, dtype=torch.float32, device=device) for k, m in targets.items()}
    with _fisher_mode(model, space, weights):
        for seq in seqs:
            batch = {k: v.unsqueeze(0) for k, v in _to_device(seq, device).items()}
            grads = torch.autograd.grad(_per_sequence_loss(model, batch)[0], weights)
            for key, g in zip(targets, grads):
                total[key] += g.detach().float() ** 2
    return {k: (v / len(seqs)).detach().cpu() for k, v in total.items()}


def diagonal_fisher(
    model: nn.Module,
    batches: Iterable[dict],
    *,
    num_batches: int = 20,
    space: str = "weight",
    names: Iterable[str] | None = None,
    max_length: int = 512,
    chunk_size: int = 8,
) -> dict[str, torch.Tensor]:
    """Empirical diagonal Fisher (FIRM App. C) via per-sequence gradients from chunked batches.

    Same result as ``per_sample_fisher_loop``; ``chunk_size`` sequences share one forward/backward.
    """
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be an int >= 1, got {chunk_size!r}")
    targets = _targets(model, space, names)
    seqs = _sequences(batches, num_batches, max_length)
    weights = [m.weight for m in targets.values()]
    device = weights[0].device
    total = {k: torch.zeros(m.weight.shape, dtype=torch.float32, device=device) for k, m in targets.items()}
    io: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def capture(key: str):
        def hook(_module, inputs, output):
            if key in io:
                raise ValueError(f"{key}: module is called twice per forward; use per_sample_fisher_loop")
            io[key] = (inputs[0], output)

        return hook

    with _fisher_mode(model, space, weights):
        handles = [m.register_forward_hook(capture(k)) for k, m in targets.items()]
        try:
            for start in range(0, len(seqs), chunk_size):
                io.clear()
                batch = _to_device(_right_pad(seqs[start : start + chunk_size]), device)
                losses = _per_sequence_loss(model, batch)
                keys = list(io)
                output_grads = torch.autograd.grad(losses.sum(), [io[k][1] for k in keys])
                for key, dz in zip(keys, output_grads):
                    a = io[key][0]
                    for b in range(dz.shape[0]):
                        g = dz[b].reshape(-1, dz.shape[-1]).float().T @ a[b].reshape(-1, a.shape[-1]).float()
                        total[key] += g**2
        finally:
            for h in handles:
                h.remove()
            io.clear()
    return {k: (v / len(seqs)).detach().cpu() for k, v in total.items()}


# --------------------------------------------------------------------------- task vectors
def lora_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """A detached copy of every LoRA tensor (take it before local training; ``task_vector``'s baseline)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def task_vector(model_after: nn.Module, reference_state: dict[str, torch.Tensor], *, space: str = "weight") -> dict[str, torch.Tensor]:
    """The client's update, float32 on the CPU, keyed like ``diagonal_fisher`` in the same ``space``.

    ``"weight"``: ``s (B A)_after - s (B A)_before`` per adapted weight (``s = alpha / r``);
    ``"lora"``: ``after - before`` for each trainable LoRA tensor.
    """
    _check_space(space)
    params = dict(model_after.named_parameters())
    if space == "lora":
        names = [n for n, p in params.items() if "lora_" in n and p.requires_grad]
        missing = [n for n in names if n not in reference_state]
        if missing:
            raise ValueError(f"reference_state lacks LoRA tensors, e.g. {missing[0]!r}; take it with lora_state()")
        return {n: (params[n].detach().float() - reference_state[n].float()).cpu() for n in names}
    name_of = {id(p): n for n, p in params.items()}
    out = {}
    for key, layer in _lora_layers(model_after).items():
        delta = 0.0
        for adapter in layer.active_adapters:
            a_name, b_name = name_of[id(layer.lora_A[adapter].weight)], name_of[id(layer.lora_B[adapter].weight)]
            if a_name not in reference_state or b_name not in reference_state:
                raise ValueError(f"reference_state lacks {a_name!r}; take it with lora_state()")
            after = layer.lora_B[adapter].weight.detach().float() @ layer.lora_A[adapter].weight.detach().float()
            before = reference_state[b_name].float() @ reference_state[a_name].float()
            delta = delta + layer.scaling[adapter] * (after - before.to(after.device))
        out[key] = (delta.T if getattr(layer, "fan_in_fan_out", False) else delta).cpu()
    return out


# --------------------------------------------------------------------------- 4-bit models
def is_quantised(model: nn.Module) -> bool:
    """True for a bitsandbytes 4/8-bit model (its packed weights cannot take gradients)."""
    config = getattr(model, "config", None)
    if config is not None and getattr(config, "quantization_config", None) is not None:
        return True
    return any(type(p).__name__ in ("Params4bit", "Int8Params") for p in model.parameters())


def fisher_reference_model(model: nn.Module, load_full_precision: Callable[[], nn.Module] | None = None) -> nn.Module:
    """The model to compute the Fisher on: ``model`` itself, or for a quantised one a full-precision copy.

    As in FIRM, the copy is loaded separately (``load_full_precision()`` must return the same
    backbone in bfloat16/float32 on the device). Pass it to ``diagonal_fisher`` with
    ``names=adapted_weight_names(model)`` so the keys match the 4-bit model's task vector.
    Not exercised in the CPU tests (needs CUDA + bitsandbytes).
    """
    if not is_quantised(model):
        return model
    if load_full_precision is None:
        raise ValueError("model is quantised: pass load_full_precision=<callable returning a bf16/fp32 copy>")
    return load_full_precision()
