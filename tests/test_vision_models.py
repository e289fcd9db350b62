"""Vision backbones: shapes, split into features/plug-ins/head, normalisation, deterministic init."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tasks.model import base_state
from tasks.vision import ARCHS, Normalize, build_vision_model, lenet5

# arch -> (in_channels, dataset whose normalisation it gets, feature_dim)
CASES = {
    "lenet5": (1, "mnist", 84),
    "resnet18": (1, "digits", 512),  # a 1-channel stem works too
    "resnet34": (3, "cifar100", 512),
    "vit": (3, "cifar10", 192),
}


def _build(arch: str, seed: int = 0, num_classes: int = 7):
    in_channels, dataset, _ = CASES[arch]
    torch.manual_seed(seed)
    return build_vision_model(arch, num_classes, in_channels, dataset=dataset).eval()


def _batch(arch: str, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(2, CASES[arch][0], 32, 32, generator=generator)


# resnet34 differs from resnet18 only in block counts: the costlier checks run on the cheaper archs.
CHEAP_ARCHS = ("lenet5", "resnet18", "vit")


@pytest.fixture(scope="module")
def models():
    assert set(CASES) == set(ARCHS)
    return {arch: _build(arch) for arch in ARCHS}


@pytest.mark.parametrize("arch", ARCHS)
def test_forward_and_embed_shapes(models, arch):
    model, x = models[arch], _batch(arch)
    feature_dim = CASES[arch][2]
    with torch.no_grad():
        logits, features = model(x), model.embed(x)
    assert logits.shape == (2, 7)
    assert features.shape == (2, feature_dim) and model.feature_dim == feature_dim
    assert isinstance(model.head, nn.Linear) and model.head.in_features == feature_dim
    assert isinstance(model.features[0] if arch != "vit" else model.features.normalize, Normalize)
    assert torch.allclose(model.head(features), logits, atol=1e-5)


@pytest.mark.parametrize("arch", CHEAP_ARCHS)
def test_plugins_change_outputs_but_not_the_base(models, arch):
    model, x = models[arch], _batch(arch)
    before = {k: v.clone() for k, v in base_state(model).items()}
    with torch.no_grad():
        clean = model(x)
        torch.manual_seed(5)
        model.plugins.append(nn.Linear(model.feature_dim, model.feature_dim))
        try:
            plugged = model(x)
        finally:
            model.plugins.pop(0)
    assert not torch.allclose(clean, plugged)
    after = base_state(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)


@pytest.mark.parametrize("arch", CHEAP_ARCHS)
def test_same_seed_same_weights_other_seed_other_weights(models, arch):
    reference = models[arch].state_dict()
    again, other = _build(arch, seed=0).state_dict(), _build(arch, seed=1).state_dict()
    assert all(torch.equal(reference[k], again[k]) for k in reference)
    assert any(not torch.equal(reference[k], other[k]) for k in reference if reference[k].is_floating_point())


def test_vit_layers_do_not_start_identical(models):
    layers = models["vit"].features.encoder.layers
    assert not torch.equal(layers[0].self_attn.in_proj_weight, layers[1].self_attn.in_proj_weight)
    assert not torch.equal(layers[0].linear1.weight, layers[1].linear1.weight)


def test_normalisation_is_fixed_and_stays_out_of_the_state_dict():
    torch.manual_seed(0)
    mnist_model = lenet5(10, dataset="mnist")
    torch.manual_seed(0)
    generic_model = lenet5(10)
    x = _batch("lenet5")
    assert not any("mean" in k or "std" in k for k in mnist_model.state_dict())
    # Same weights, different input statistics -> different features.
    assert not torch.allclose(mnist_model.embed(x), generic_model.embed(x))
    norm = Normalize((0.5, 0.25), (0.5, 0.25))
    expected = torch.tensor([1.0, 3.0]).view(1, 2, 1, 1).expand(1, 2, 3, 3)
    assert torch.allclose(norm(torch.ones(1, 2, 3, 3)), expected)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="model arch must be one of"):
        build_vision_model("vgg", 10, 3)
    with pytest.raises(ValueError, match="in_channels=1 does not match"):
        build_vision_model("lenet5", 10, 1, dataset="cifar10")
    with pytest.raises(ValueError, match="num_classes"):
        build_vision_model("lenet5", 0, 1)
    with pytest.raises(ValueError, match="dataset must be one of"):
        build_vision_model("lenet5", 10, 1, dataset="svhn")
