"""Tests for strategies/firm/fisher.py on a tiny randomly initialised Llama + LoRA (no download)."""

import pytest
import torch

from strategies.firm import fisher as fi
from tiny_llm import make_batch, tiny_base, tiny_lora

def tiny_lora_model(seed: int = 0, trained_adapter: bool = True):
    """LoRA on q/v/down_proj; with ``trained_adapter`` B is random so adapter on/off differ."""
    model = tiny_lora(seed)
    if trained_adapter:
        g = torch.Generator().manual_seed(seed + 1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model



def hand_squared_grads(model, batch, space):
    """Squared gradient of Hugging Face's own token-averaged loss, by plain autograd."""
    model.zero_grad()
    if space == "weight":
        weights = {name: layer.get_base_layer().weight for name, layer in fi._lora_layers(model).items()}
        for w in weights.values():
            w.requires_grad_(True)
        with model.disable_adapter():
            model(**batch).loss.backward()
        out = {k: w.grad ** 2 for k, w in weights.items()}
        for w in weights.values():
            w.requires_grad_(False)
            w.grad = None
        return out
    model(**batch).loss.backward()
    return {n: p.grad ** 2 for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("space", ["weight", "lora"])
def test_fisher_is_nonnegative_finite_and_keyed_by_adapted_tensors(space):
    model = tiny_lora_model()
    fisher = fi.diagonal_fisher(model, [make_batch(3, 0)], num_batches=3, space=space)
    if space == "weight":
        assert sorted(fisher) == sorted(fi.adapted_weight_names(model))
        assert all(k.startswith("model.layers.") and k.endswith("_proj.weight") for k in fisher)
    else:
        trainable = {n for n, p in model.named_parameters() if p.requires_grad}
        assert set(fisher) == trainable and all("lora_" in k for k in fisher)
    for value in fisher.values():
        assert value.dtype == torch.float32 and value.device.type == "cpu"
        assert torch.isfinite(value).all() and (value >= 0).all()
    assert any(v.sum() > 0 for v in fisher.values())


@pytest.mark.parametrize("space", ["weight", "lora"])
def test_single_sequence_fisher_equals_hand_squared_gradient(space):
    model, batch = tiny_lora_model(), make_batch(1, 3)
    expected = hand_squared_grads(model, batch, space)
    for fisher_fn in (fi.diagonal_fisher, fi.per_sample_fisher_loop):
        fisher = fisher_fn(model, [batch], num_batches=1, space=space)
        assert set(fisher) == set(expected)
        for key in fisher:
            torch.testing.assert_close(fisher[key], expected[key], rtol=1e-4, atol=1e-9)
    assert not any(p.requires_grad for n, p in model.named_parameters() if "lora_" not in n)


@pytest.mark.parametrize("space", ["weight", "lora"])
def test_batched_fisher_matches_per_sample_loop(space):
    model = tiny_lora_model()
    batches = [make_batch(4, 0), make_batch(3, 1)]
    loop = fi.per_sample_fisher_loop(model, batches, num_batches=7, space=space)
    batched = fi.diagonal_fisher(model, batches, num_batches=7, space=space, chunk_size=3)
    for key in loop:
        torch.testing.assert_close(batched[key], loop[key], rtol=1e-5, atol=1e-8)


def test_fisher_cycles_through_too_few_sequences_and_skips_answerless_ones():
    model = tiny_lora_model()
    batch = make_batch(2, 0)
    empty = dict(make_batch(1, 5), labels=torch.full((1, make_batch(1, 5)["labels"].shape[1]), -100))
    two = fi.diagonal_fisher(model, [batch], num_batches=2)
    six = fi.diagonal_fisher(model, [empty, batch], num_batches=6)
    for key in two:
        torch.testing.assert_close(six[key], two[key], rtol=1e-5, atol=1e-8)
    with pytest.raises(ValueError, match="no sequence with answer tokens"):
        fi.diagonal_fisher(model, [empty])


def test_weight_space_fisher_is_taken_at_reference_weights_and_on_a_separate_copy():
    adapted = tiny_lora_model(trained_adapter=True)
    fresh = tiny_lora_model(trained_adapter=False)
    batches = [make_batch(3, 2)]
    on_adapted = fi.diagonal_fisher(adapted, batches, num_batches=3)
    on_fresh = fi.diagonal_fisher(fresh, batches, num_batches=3)
    on_copy = fi.diagonal_fisher(tiny_base(), batches, num_batches=3, names=fi.adapted_weight_names(adapted))
    for key in on_adapted:
        torch.testing.assert_close(on_adapted[key], on_fresh[key], rtol=1e-5, atol=1e-8)
        torch.testing.assert_close(on_adapted[key], on_copy[key], rtol=1e-5, atol=1e-8)


def perturb_lora(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=g))


def test_task_vector_weight_space_is_the_scaled_BA_change():
    model = tiny_lora_model(trained_adapter=False)  # B = 0: the adapter starts as a no-op
    start = fi.lora_state(model)
    perturb_lora(model, 1)
    first = fi.task_vector(model, start)
    assert sorted(first) == sorted(fi.adapted_weight_names(model))
    for key, layer in fi._lora_layers(model).items():
        torch.testing.assert_close(first[key], layer.get_delta_weight("default"))
        assert first[key].shape == layer.get_base_layer().weight.shape
    middle = fi.lora_state(model)
    perturb_lora(model, 2)
    second, total = fi.task_vector(model, middle), fi.task_vector(model, start)
    for key in total:
        torch.testing.assert_close(total[key], first[key] + second[key], rtol=1e-5, atol=1e-6)


def test_task_vector_lora_space_is_the_tensor_difference():
    model = tiny_lora_model()
    start = fi.lora_state(model)
    perturb_lora(model, 3)
    params = dict(model.named_parameters())
    delta = fi.task_vector(model, start, space="lora")
    assert set(delta) == {n for n, p in params.items() if p.requires_grad}
    for name, value in delta.items():
        torch.testing.assert_close(value, params[name].detach() - start[name])
    with pytest.raises(ValueError, match="reference_state lacks"):
        fi.task_vector(model, {}, space="lora")


def test_fisher_reference_model_guards_quantised_models():
    model = tiny_lora_model()
    assert fi.fisher_reference_model(model) is model
    model.config.quantization_config = {"load_in_4bit": True}  # stands in for a bitsandbytes model
    assert fi.is_quantised(model)
    with pytest.raises(ValueError, match="quantised"):
        fi.fisher_reference_model(model)
    with pytest.raises(ValueError, match="quantised"):
        fi.diagonal_fisher(model, [make_batch(1, 0)])
    copy = tiny_base()
    assert fi.fisher_reference_model(model, load_full_precision=lambda: copy) is copy


def test_bad_arguments_raise_value_errors():
    model, batches = tiny_lora_model(), [make_batch(2, 0)]
    with pytest.raises(ValueError, match="space must be one of"):
        fi.diagonal_fisher(model, batches, space="full")
    with pytest.raises(ValueError, match="num_batches"):
        fi.diagonal_fisher(model, batches, num_batches=0)
    with pytest.raises(ValueError, match="max_length"):
        fi.per_sample_fisher_loop(model, batches, max_length=1)
    with pytest.raises(ValueError, match="chunk_size"):
        fi.diagonal_fisher(model, batches, chunk_size=0)
