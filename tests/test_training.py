"""Local cross-entropy training (``tasks.training.train_local``): the gradient clip."""

from __future__ import annotations

import torch

from tasks.training import train_local
from tasks.vision import lenet5


def _train(max_grad_norm, monkeypatch, seen=None):
    torch.manual_seed(0)
    model = lenet5(10)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.rand(64, 1, 32, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    with monkeypatch.context() as patch:
        if seen is not None:
            step = torch.optim.SGD.step

            def recording(self, *args, **kwargs):
                grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
                seen.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
                return step(self, *args, **kwargs)

            patch.setattr(torch.optim.SGD, "step", recording)
        train_local(model, x, y, epochs=2, batch_size=16, lr=0.05, momentum=0.9, seed=3, max_grad_norm=max_grad_norm)
    return model.state_dict()


def test_a_gradient_clip_bounds_every_step_and_leaves_steps_below_it_unchanged(monkeypatch):
    """Clipped at 0.05, no step the optimiser takes has a larger gradient norm (unclipped ones do)
    and the model differs; a clip no step reaches gives the unclipped model bit for bit, so a
    default clip above a run's gradients keeps its results."""
    unclipped_norms, clipped_norms = [], []
    plain = _train(None, monkeypatch, unclipped_norms)
    clipped = _train(0.05, monkeypatch, clipped_norms)
    assert max(unclipped_norms) > 0.05 and max(clipped_norms) <= 0.05 * (1 + 1e-5)
    assert any(not torch.equal(plain[k], clipped[k]) for k in plain)
    roomy = _train(max(unclipped_norms) * 10, monkeypatch)
    assert all(torch.equal(plain[k], roomy[k]) for k in plain)
