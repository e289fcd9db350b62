"""FedOSD's pure math on flat gradient vectors ("Federated Unlearning with Gradient Descent and
Conflict Mitigation", Pan et al., AAAI 2025).

- :func:`unlearning_cross_entropy`: the forget clients' loss ``-log(1 - p_y / 2)`` (it falls as the
  probability of the true label falls, bounded, unlike the negated cross-entropy of gradient ascent).
- :func:`orthogonal_direction`: the orthogonal steepest descent direction: the forget clients' mean
  gradient ``g_u`` projected onto the orthogonal complement of the retained clients' gradients
  (the rows of ``A``), ``d = g_u - Aᵀ (A Aᵀ)⁺ A g_u``, rescaled to ``||g_u||``. The pseudo-inverse
  keeps the singular values ``>= 1e-6`` of ``A Aᵀ`` (the code's SVD threshold).
- :func:`without_component`: the post-training rule: a retained client's gradient minus its
  component along ``w - w_start`` (so recovery does not walk the model back to where unlearning
  began), rescaled to its own norm, as the code does.

The public code leaves singular values below the threshold in place (un-inverted, so about 0);
``torch.linalg.pinv`` sets them to 0, which differs by less than 1e-6 relative. A zero direction
(``g_u`` in the span of ``A``, or a zero gradient) stays zero instead of the code's 0/0. The
projection is computed in float64: in float32 the Gram matrix of nearly dependent gradients has
rounding noise above the absolute 1e-6 floor, which the pseudo-inverse would then amplify.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SINGULAR_VALUE_FLOOR = 1e-6


def unlearning_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``-log(1 - softmax(logits)[y] / 2)``."""
    p_true = F.softmax(logits, dim=-1).gather(1, labels.view(-1, 1)).squeeze(1)
    return -torch.log1p(-p_true / 2).mean()


def rescaled(vector: torch.Tensor, norm: float | torch.Tensor) -> torch.Tensor:
    """``vector`` scaled to L2 norm ``norm``; a zero vector stays zero."""
    length = torch.linalg.vector_norm(vector)
    return vector if length == 0 else vector * (norm / length)


def orthogonal_direction(g_u: torch.Tensor, retained: torch.Tensor) -> torch.Tensor:
    """``g_u - Aᵀ (A Aᵀ)⁺ A g_u`` rescaled to ``||g_u||``; ``retained`` is ``A`` (one gradient per
    row, shape ``(k, n)``, ``k`` may be 0)."""
    if g_u.dim() != 1 or retained.dim() != 2 or retained.shape[1] != g_u.shape[0]:
        raise ValueError(f"g_u must be a vector (n,) and the retained gradients a (k, n) matrix, got "
                         f"{tuple(g_u.shape)} and {tuple(retained.shape)}")
    if retained.shape[0] == 0:
        return g_u.clone()
    a, g = retained.double(), g_u.double()
    inverse = torch.linalg.pinv(a @ a.T, atol=SINGULAR_VALUE_FLOOR, rtol=0.0, hermitian=True)
    d = g - a.T @ (inverse @ (a @ g))
    return rescaled(d, torch.linalg.vector_norm(g)).to(g_u.dtype)


def without_component(gradient: torch.Tensor, direction: torch.Tensor) -> torch.Tensor:
    """``g - (g·a / ||a||²) a`` rescaled to ``||g||`` (``a`` = ``direction``); ``g`` when ``a`` is 0."""
    squared = direction @ direction
    if squared == 0:
        return gradient.clone()
    return rescaled(gradient - (gradient @ direction) / squared * direction, torch.linalg.vector_norm(gradient))


def flatten(tensors: dict[str, torch.Tensor], keys: list[str]) -> torch.Tensor:
    """The tensors under ``keys`` as one float32 vector, in ``keys`` order."""
    return torch.cat([tensors[k].detach().reshape(-1).float() for k in keys])


def unflatten(vector: torch.Tensor, like: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`flatten`: ``vector`` cut into the shapes and dtypes of ``like[keys]``."""
    sizes = [like[k].numel() for k in keys]
    if sum(sizes) != vector.numel():
        raise ValueError(f"vector has {vector.numel()} entries, the tensors {sum(sizes)}")
    return {k: part.reshape(like[k].shape).to(like[k].dtype) for k, part in zip(keys, vector.split(sizes))}
