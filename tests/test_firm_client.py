"""FIRM client release on the offline tiny model: task vector + Fisher on the same coordinates."""

import pytest
import torch

from strategies.firm.client import firm_release
from strategies.firm.fisher import adapted_weight_names, diagonal_fisher, lora_state
from tasks.llm.model import build_llm
from tasks.llm.synthetic import fictitious_authors
from tasks.llm.train import qa_batches


@pytest.fixture(scope="module")
def data():
    _, tokenizer = build_llm("tiny", seed=0, lora_rank=4, target_modules=["q_proj", "down_proj"])
    records = fictitious_authors(2, 6, seed=0)
    return tokenizer, qa_batches(records, tokenizer, batch_size=4, seed=0), len(records)


def release(data, **kwargs):
    tokenizer, batches, _ = data
    model, _ = build_llm("tiny", seed=0, lora_rank=4, target_modules=["q_proj", "down_proj"], tokenizer=tokenizer)
    settings = dict(role="forget", objective="ascent", epochs=1, lr=1e-3, seed=3, fisher_batches=4) | kwargs
    return model, firm_release(model, lora_state(model), batches, **settings)


@pytest.mark.parametrize("role, objective", [("forget", "ascent"), ("forget", "rmu"), ("retain", "ce")])
def test_release_has_matching_task_vector_and_fisher(data, role, objective):
    model, upload = release(data, role=role, objective=objective)
    assert upload["num_examples"] == data[2]
    tv, fisher = upload["task_vector"], upload["fisher"]
    assert set(tv) == set(fisher) and len(tv) == 2 * 2  # q_proj and down_proj in both layers
    assert all(k.endswith(".weight") and "lora" not in k for k in tv)
    for name in tv:
        assert tv[name].shape == fisher[name].shape and tv[name].dtype == torch.float32
        assert bool(torch.isfinite(fisher[name]).all()) and bool((fisher[name] >= 0).all())
        assert not fisher[name].requires_grad
    assert sum(float(t.abs().sum()) for t in tv.values()) > 0
    assert sum(float(f.sum()) for f in fisher.values()) > 0


def test_release_is_deterministic_and_fisher_is_taken_at_the_reference(data):
    _, first = release(data)
    _, again = release(data)
    _, longer = release(data, epochs=2)
    for name in first["task_vector"]:
        assert torch.equal(first["task_vector"][name], again["task_vector"][name])
        assert torch.equal(first["fisher"][name], longer["fisher"][name])  # training does not move it
        assert not torch.equal(first["task_vector"][name], longer["task_vector"][name])


def test_bad_arguments_raise_value_errors(data):
    tokenizer, batches, _ = data
    for kwargs, key in (({"role": "retain", "objective": "ascent"}, "objective"),
                        ({"role": "helper"}, "role"), ({"epochs": 0}, "epochs"), ({"space": "x"}, "space")):
        with pytest.raises(ValueError, match=key):
            release(data, **kwargs)
    model, _ = build_llm("tiny", seed=0, lora_rank=4, target_modules=["q_proj"], tokenizer=tokenizer)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(0.1)
    with pytest.raises(ValueError, match="not fresh"):
        firm_release(model, None, batches, role="forget", objective="ascent", epochs=1, lr=1e-3, seed=0)


@pytest.mark.parametrize("space", ["weight", "lora"])
def test_fisher_can_be_taken_on_a_separate_full_precision_copy(data, space):
    """What a 4-bit client does: the Fisher from the copy, the task vector from its own training."""
    tokenizer, batches, _ = data
    copy, _ = build_llm("tiny", seed=0, lora_rank=4, target_modules=["q_proj", "down_proj"], tokenizer=tokenizer)
    with torch.no_grad():
        for name, p in copy.named_parameters():
            if "lora" not in name and p.dim() == 2:
                p.mul_(1.5)  # a different backbone, so its Fisher differs from the model's own
    model, own = release(data, space=space)
    _, via_copy = release(data, space=space, fisher_model=copy)
    names = adapted_weight_names(model) if space == "weight" else None
    copy_fisher = diagonal_fisher(copy, batches, num_batches=4, space=space, names=names)
    for name in own["fisher"]:
        assert torch.equal(via_copy["task_vector"][name], own["task_vector"][name])
        assert torch.equal(via_copy["fisher"][name], copy_fisher[name])
    assert any(not torch.allclose(via_copy["fisher"][n], own["fisher"][n]) for n in own["fisher"])
