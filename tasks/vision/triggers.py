"""The backdoor trigger that makes client and sample unlearning measurable.

FedUP (sample scenario) and Lethe (client and sample scenarios) inject "fixed triggers into the
bottom-right pixels of images" and relabel the triggered samples with a target class; a model that
still maps triggered images to the target has not forgotten them. The papers do not give the patch
size, so it is an argument here (the run config chooses it).

The trigger is a white square: the bottom-right ``size x size`` pixels set to 1.0 in every channel.
Images are kept in [0, 1] pixel space (normalisation lives inside the model), so 1.0 is the brightest
possible pixel whatever dataset the images come from.
"""

from __future__ import annotations

import torch

TRIGGER_VALUE = 1.0


def apply_trigger(x: torch.Tensor, size: int) -> torch.Tensor:
    """Return a copy of ``x`` (N, C, H, W) with its bottom-right ``size x size`` square set to 1.0."""
    if x.dim() != 4:
        raise ValueError(f"apply_trigger: x must have shape (N, C, H, W), got {tuple(x.shape)}")
    height, width = x.shape[-2:]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= min(height, width):
        raise ValueError(
            f"trigger size must be an integer in [1, {min(height, width)}] for {height}x{width} images, "
            f"got {size!r}"
        )
    triggered = x.clone()
    triggered[..., height - size :, width - size :] = TRIGGER_VALUE
    return triggered
