"""Local cross-entropy training (``tasks.training.train_local``): the gradient clip, and the
optimiser it steps with (``MomentumSGD``: torch's SGD update without the class)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from tasks.training import MomentumSGD, train_local
from tasks.vision import lenet5


def _train(max_grad_norm, monkeypatch, seen=None):
    torch.manual_seed(0)
    model = lenet5(10)
    generator = torch.Generator().manual_seed(1)
    x, y = torch.rand(64, 1, 32, 32, generator=generator), torch.randint(0, 10, (64,), generator=generator)
    with monkeypatch.context() as patch:
        if seen is not None:
            step = MomentumSGD.step

            def recording(self, *args, **kwargs):
                grads = [p.grad for p in self.params if p.grad is not None]
                seen.append(float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))))
                return step(self, *args, **kwargs)

            patch.setattr(MomentumSGD, "step", recording)
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


def _steps(make_optimiser, momentum: float) -> dict[str, torch.Tensor]:
    """Five steps on a model whose ``unused`` layer never gets a gradient and whose ``late``
    layer gets one from the third step on (a momentum buffer created mid-run)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(6, 4), "late": nn.Linear(4, 3), "unused": nn.Linear(2, 2)})
    optimiser = make_optimiser(list(model.parameters()), momentum)
    generator = torch.Generator().manual_seed(1)
    for step in range(5):
        x = torch.randn(8, 6, generator=generator)
        hidden = model["used"](x)
        out = model["late"](hidden) if step >= 2 else hidden[:, :3]
        loss = (out ** 2).mean()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_momentum_sgd_gives_torch_sgd_updates_bit_for_bit(momentum):
    """The same five steps through ``MomentumSGD`` and ``torch.optim.SGD`` end in identical
    weights, with and without momentum, a parameter that never has a gradient left as it was and
    one whose gradient first appears mid-run; and the weights did move."""
    ours = _steps(lambda params, m: MomentumSGD(params, lr=0.1, momentum=m), momentum)
    torchs = _steps(lambda params, m: torch.optim.SGD(params, lr=0.1, momentum=m), momentum)
    untouched = _steps(lambda params, m: MomentumSGD(params, lr=0.0, momentum=m), momentum)
    assert all(torch.equal(ours[k], torchs[k]) for k in ours)
    assert torch.equal(ours["unused.weight"], untouched["unused.weight"])
    assert not torch.equal(ours["used.weight"], untouched["used.weight"])
    assert not torch.equal(ours["late.weight"], untouched["late.weight"])


def test_local_training_in_a_fresh_process_does_not_import_torch_dynamo():
    """What a training message on a real SuperNode runs, in a fresh process: ``torch._dynamo``
    (about 2 CPU-seconds, imported by ``torch.optim.SGD``'s first ``zero_grad``) stays out."""
    code = ("import sys, torch\nfrom tasks.training import train_local\nfrom tasks.vision import lenet5\n"
            "x, y = torch.rand(32, 1, 32, 32), torch.randint(0, 10, (32,))\n"
            "train_local(lenet5(10), x, y, epochs=1, batch_size=16, lr=0.05, momentum=0.9, seed=0, max_grad_norm=1.0)\n"
            "print('torch._dynamo' in sys.modules)")
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
