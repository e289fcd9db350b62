"""The text backdoor trigger: a phrase appended to the text, as the FedUP paper does for AG News.

It works on token ids packed as (N, 2, L) (ids, attention mask; ``tasks.text.data.tokenize``): the
trigger's tokens go right before the closing [SEP]; a text that fills ``L`` loses its last content
tokens to make room, so the trigger is never truncated away.
"""

from __future__ import annotations

import torch


def trigger_ids(tokenizer, phrase: str) -> list[int]:
    """The tokens of ``phrase``; a one-line ``ValueError`` naming ``text.trigger`` when there are none."""
    ids = tokenizer(phrase, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ValueError(f"run-config 'text.trigger'={phrase!r} is split into no tokens by the encoder's "
                         "tokenizer: give a phrase with at least one word")
    return list(ids)


def append_trigger(packed: torch.Tensor, trigger: list[int], sep_id: int, pad_id: int) -> torch.Tensor:
    """A copy of ``packed`` (N, 2, L) with ``trigger`` inserted before each text's [SEP]."""
    length = packed.shape[-1]
    keep_max = length - 2 - len(trigger)
    if keep_max < 0:
        raise ValueError(f"the trigger has {len(trigger)} tokens: it does not fit in 'text.max-length'={length}")
    out = packed.clone()
    trig = torch.tensor(trigger, dtype=packed.dtype)
    for row in range(len(packed)):
        n = int(packed[row, 1].sum())
        content = packed[row, 0, 1:n - 1][:keep_max]
        ids = torch.cat([packed[row, 0, :1], content, trig, torch.tensor([sep_id], dtype=packed.dtype)])
        out[row, 0] = pad_id
        out[row, 1] = 0
        out[row, 0, :len(ids)] = ids
        out[row, 1, :len(ids)] = 1
    return out
