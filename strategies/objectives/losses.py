"""Client-side LLM (un)learning objectives: ``loss_fn(model, batch, **ctx) -> scalar`` to minimise.

A batch is a dict ``{input_ids, attention_mask, labels}`` of shape (B, T); ``labels`` is -100 on
prompt and padding tokens, so "answer tokens" are the positions whose label is not -100. Labels
are aligned with ``input_ids`` (Hugging Face convention): token t+1 is predicted from logits at t.

Objectives (the model is a peft LoRA model; only the adapter trains):

- ``ce``      answer-token cross entropy averaged over every answer token of the batch
              (the retain / preservation objective; equals Hugging Face's ``outputs.loss``).
- ``ascent``  gradient ascent (GA): ``-ce`` on forget answers (Lethe sec. V, FIRM TOFU/MUSE).
- ``npo``     Negative Preference Optimisation, beta = 0.1 (Lethe's NPO baseline):
              ``L = -(2/beta) * mean_b log sigmoid(-beta * (log p_theta(y_b|x_b) - log p_ref(y_b|x_b)))``
              with summed answer-token log-probs. At the start of unlearning the ratio is 0, so
              ``L = (2/beta) log 2``.
- ``simnpo``  SimNPO (reference-free, length-normalised):
              ``L = -(2/beta) * mean_b log sigmoid(-(beta/|y_b|) log p_theta(y_b|x_b) - gamma)``.
              Defaults beta = 2.5, gamma = 0.0: the SimNPO authors' TOFU forget05 setting (their
              released config has gamma = 0.0 and the README's forget05 command sets beta = 2.5;
              forget10 uses beta = 4.5). Lethe gives no SimNPO values.
- ``rmu``     Representation Misdirection for Unlearning (WMDP, Li et al. 2024), used by FIRM's
              WMDP forget clients: on forget data push the residual stream at decoder layer ``layer``
              towards ``steering_coeff * u`` (u a fixed random unit vector), on retain data keep it at
              the frozen model's value:
              ``L = mean ||h_l(x_f) - c u||^2 + alpha * mean ||h_l(x_r) - h_l^frozen(x_r)||^2``.
              The hidden state is read by a forward hook on the decoder layer. Defaults follow the
              WMDP Zephyr-7B run (layer 7, c = 6.5, alpha = 1200); u is drawn like WMDP's, uniform in
              [0, 1)^d then normalised, from ``torch.Generator().manual_seed(seed)``. FIRM's forget
              clients use the forget term only (call without ``retain_batch``).

Reference model without a second copy: NPO's reference log-probs and RMU's frozen hidden states
are computed by the same model inside peft's ``disable_adapter()`` context (no gradients, eval
mode). That is the original model exactly when the unlearning adapter is the only change on top
of the original weights (a fresh adapter, or one whose B is still zero). When the adapter already
carries knowledge (e.g. it was fine-tuned in pretraining and continues to be trained), compute the
reference once *before* the first unlearning step with ``disable_adapter=False``. Either way,
``attach_reference_logprobs`` / ``attach_reference_hidden`` precompute it once per batch and store
it in the batch (``ref_logprob`` (B,), ``ref_hidden`` (B, T, d)); the losses use it when present and
otherwise recompute it with the adapter disabled at every step (one extra no-grad forward).
The objectives call ``model(input_ids=..., attention_mask=...)``, so these extra keys are harmless.
"""

from __future__ import annotations

import contextlib
import math
import re
from typing import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from tasks.llm.train import IGNORE_INDEX, _require_answer_tokens, ce, sequence_logprob


__all__ = [
    "IGNORE_INDEX",
    "OBJECTIVES",
    "NPOLoss",
    "RMULoss",
    "SimNPOLoss",
    "attach_reference_hidden",
    "attach_reference_logprobs",
    "ce",
    "decoder_layers",
    "gradient_ascent",
    "make_objective",
    "reference_hidden",
    "reference_logprob",
    "restrict_trainable_lora",
    "sequence_logprob",
]


@contextlib.contextmanager
def _frozen_reference(model: nn.Module, disable_adapter: bool) -> Iterator[None]:
    """No grad, eval mode (no dropout) and, if asked, the LoRA adapter switched off."""
    if disable_adapter and not hasattr(model, "disable_adapter"):
        raise ValueError("model has no adapter to disable: pass disable_adapter=False or a precomputed reference")
    was_training = model.training
    model.eval()
    adapter_off = model.disable_adapter() if disable_adapter else contextlib.nullcontext()
    try:
        with torch.no_grad(), adapter_off:
            yield
    finally:
        model.train(was_training)


def reference_logprob(model: nn.Module, batch: dict, *, disable_adapter: bool = True) -> torch.Tensor:
    """Reference-model summed answer log-probs (B,) for NPO, without a second model copy."""
    with _frozen_reference(model, disable_adapter):
        return sequence_logprob(model, batch)[0]


def attach_reference_logprobs(model: nn.Module, batches: Iterable[dict], *, disable_adapter: bool = True) -> list[dict]:
    """Copies of ``batches`` carrying ``ref_logprob`` — compute once, before the first NPO step."""
    return [dict(b, ref_logprob=reference_logprob(model, b, disable_adapter=disable_adapter)) for b in batches]


# --------------------------------------------------------------------------- simple objectives
def gradient_ascent(model: nn.Module, batch: dict, **ctx) -> torch.Tensor:
    """Gradient ascent on forget answers: minimise the negative answer-token cross entropy."""
    return -ce(model, batch)


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


class NPOLoss:
    """NPO: ``-(2/beta) mean log sigmoid(-beta (log p_theta - log p_ref))`` on summed answer log-probs.

    The reference log-probs come from ``batch["ref_logprob"]`` (or ``ctx["ref_logprob"]``) when
    given, otherwise from the same model with the adapter disabled (see the module docstring).
    """

    def __init__(self, beta: float = 0.1):
        self.beta = _positive("npo beta", beta)

    def __call__(self, model: nn.Module, batch: dict, **ctx) -> torch.Tensor:
        ref = batch.get("ref_logprob", ctx.get("ref_logprob"))
        if ref is None:
            ref = reference_logprob(model, batch)
        logp, n_tokens = sequence_logprob(model, batch)
        _require_answer_tokens(n_tokens)
        log_ratio = logp - ref.to(logp)
        return -(2.0 / self.beta) * F.logsigmoid(-self.beta * log_ratio).mean()


class SimNPOLoss:
    """SimNPO: ``-(2/beta) mean log sigmoid(-(beta/|y|) log p_theta(y|x) - gamma)``, no reference model.

    Sequences without answer tokens count as length 1 (their log-prob is 0).
    """

    def __init__(self, beta: float = 2.5, gamma: float = 0.0):
        self.beta = _positive("simnpo beta", beta)
        if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma >= 0):
            raise ValueError(f"simnpo gamma must be a finite number >= 0, got {gamma!r}")
        self.gamma = float(gamma)

    def __call__(self, model: nn.Module, batch: dict, **ctx) -> torch.Tensor:
        logp, n_tokens = sequence_logprob(model, batch)
        _require_answer_tokens(n_tokens)
        mean_logp = logp / n_tokens.clamp_min(1)
        return -(2.0 / self.beta) * F.logsigmoid(-self.beta * mean_logp - self.gamma).mean()


# --------------------------------------------------------------------------- RMU
def decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of a (peft-wrapped) causal LM: the first ModuleList named ``*layers``/``*h``."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and re.search(r"(^|\.)(layers|h)$", name):
            return module
    raise ValueError("model has no decoder-layer list (a ModuleList named 'layers' or 'h')")


def _layer_output(model: nn.Module, batch: dict, layer: int) -> torch.Tensor:
    """Forward the batch and return the residual stream after decoder layer ``layer`` (B, T, d)."""
    layers = decoder_layers(model)
    if not 0 <= layer < len(layers):
        raise ValueError(f"rmu layer must be in [0, {len(layers) - 1}] for this model, got {layer}")
    captured: list[torch.Tensor] = []

    def hook(_module, _inputs, output):
        captured.append(output[0] if isinstance(output, tuple) else output)

    handle = layers[layer].register_forward_hook(hook)
    try:
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    finally:
        handle.remove()
    return captured[0]


def reference_hidden(model: nn.Module, batch: dict, layer: int, *, disable_adapter: bool = True) -> torch.Tensor:
    """Frozen-model hidden state at ``layer`` (B, T, d) for RMU's retain term, without a model copy."""
    with _frozen_reference(model, disable_adapter):
        return _layer_output(model, batch, layer)


def attach_reference_hidden(
    model: nn.Module, batches: Iterable[dict], layer: int, *, disable_adapter: bool = True
) -> list[dict]:
    """Copies of retain ``batches`` carrying ``ref_hidden`` (B, T, d) — compute once, before RMU starts."""
    return [dict(b, ref_hidden=reference_hidden(model, b, layer, disable_adapter=disable_adapter)) for b in batches]


def _masked_mse(hidden: torch.Tensor, target: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean over real (attention_mask = 1) tokens and hidden units of the squared difference."""
    mask = attention_mask.to(torch.float32).unsqueeze(-1)
    sq = (hidden.float() - target.float()) ** 2 * mask
    return sq.sum() / (mask.sum() * hidden.shape[-1]).clamp_min(1.0)


class RMULoss:
    """RMU: forget term ``mean ||h_l - c u||^2`` plus ``alpha * mean ||h_l - h_l^frozen||^2`` on retain data.

    Means run over real tokens (attention_mask = 1; WMDP averages over all positions, padding
    included — we leave padding out) and hidden units. The forget term is computed on ``batch``;
    the retain term only when ``retain_batch`` is passed (FIRM's forget clients omit it).
    """

    def __init__(self, layer: int = 7, steering_coeff: float = 6.5, alpha: float = 1200.0, seed: int = 0):
        if not isinstance(layer, int) or layer < 0:
            raise ValueError(f"rmu layer must be an int >= 0, got {layer!r}")
        self.layer = layer
        self.steering_coeff = _positive("rmu steering_coeff", steering_coeff)
        if not (isinstance(alpha, (int, float)) and math.isfinite(alpha) and alpha >= 0):
            raise ValueError(f"rmu alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        self.seed = int(seed)

    def control_vector(self, hidden_size: int) -> torch.Tensor:
        """``c * u`` with u uniform in [0, 1)^d normalised to unit length, drawn from ``seed``."""
        generator = torch.Generator().manual_seed(self.seed)
        u = torch.rand(hidden_size, generator=generator)
        return self.steering_coeff * u / u.norm()

    def __call__(self, model: nn.Module, batch: dict, retain_batch: dict | None = None, **ctx) -> torch.Tensor:
        hidden = _layer_output(model, batch, self.layer)
        target = self.control_vector(hidden.shape[-1]).to(hidden.device)
        loss = _masked_mse(hidden, target.expand_as(hidden), batch["attention_mask"])
        if retain_batch is not None and self.alpha > 0:
            frozen = retain_batch.get("ref_hidden")
            if frozen is None:
                frozen = reference_hidden(model, retain_batch, self.layer)
            retained = _layer_output(model, retain_batch, self.layer)
            loss = loss + self.alpha * _masked_mse(retained, frozen.to(retained), retain_batch["attention_mask"])
        return loss


def restrict_trainable_lora(
    model: nn.Module, layers: Iterable[int], modules: Iterable[str] = ("down_proj",)
) -> list[str]:
    """Train only the LoRA tensors of ``modules`` in decoder ``layers`` (FIRM WMDP: down_proj, layers 5-7).

    Every other parameter gets ``requires_grad = False``. Returns the names left trainable.
    """
    layer_set, module_set = {int(i) for i in layers}, set(modules)
    trainable = []
    for name, param in model.named_parameters():
        match = re.search(r"\.(?:layers|h)\.(\d+)\.", name)
        keep = (
            "lora_" in name
            and match is not None
            and int(match.group(1)) in layer_set
            and any(f".{m}." in name for m in module_set)
        )
        param.requires_grad_(keep)
        if keep:
            trainable.append(name)
    if not trainable:
        raise ValueError(f"no LoRA parameters in layers {sorted(layer_set)} and modules {sorted(module_set)}")
    return trainable


# --------------------------------------------------------------------------- registry
OBJECTIVES: dict[str, Callable[..., Callable]] = {
    "ce": lambda: ce,  # the task's own loss, listed so a release can name it
    "ascent": lambda: gradient_ascent,
    "npo": NPOLoss,
    "simnpo": SimNPOLoss,
    "rmu": RMULoss,
}


def make_objective(name: str, **params) -> Callable[..., torch.Tensor]:
    """The loss function registered as ``name``, configured with ``params``."""
    if name not in OBJECTIVES:
        raise ValueError(f"objective must be one of {sorted(OBJECTIVES)}, got {name!r}")
    try:
        return OBJECTIVES[name](**params)
    except TypeError as err:
        raise ValueError(f"objective {name!r} does not take parameters {sorted(params)}: {err}") from None
