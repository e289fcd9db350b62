"""Tests for strategies/objectives/losses.py on a tiny randomly initialised Llama + LoRA (no download)."""

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from strategies.objectives import losses as obj
from tiny_llm import make_batch, tiny_lora


def tiny_lora_model(seed: int = 0):
    return tiny_lora(seed)



def perturb_adapter(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def train(model, loss_fn, batch, steps=5, lr=1e-2, **ctx):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss_fn(model, batch, **ctx).backward()
        opt.step()


class FixedLogits(nn.Module):
    """A 'model' whose next-token logits are the same row at every position."""

    def __init__(self, row):
        super().__init__()
        self.row = torch.tensor(row)

    def forward(self, input_ids, attention_mask):
        return SimpleNamespace(logits=self.row.expand(*input_ids.shape, -1).clone())


def hand_batch():
    # probs [0.1, 0.2, 0.3, 0.4]; seq 0 answers [3]; seq 1 answers [1, 2, 3] (then one pad)
    ids = torch.tensor([[0, 0, 3, 0, 0], [0, 1, 2, 3, 0]])
    labels = torch.tensor([[-100, -100, 3, -100, -100], [-100, 1, 2, 3, -100]])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0]])
    return FixedLogits([math.log(p) for p in (0.1, 0.2, 0.3, 0.4)]), {"input_ids": ids, "attention_mask": mask, "labels": labels}


def test_sequence_logprob_hand_case():
    model, batch = hand_batch()
    logp, n = obj.sequence_logprob(model, batch)
    assert n.tolist() == [1, 3]
    assert torch.allclose(logp, torch.tensor([math.log(0.4), math.log(0.2 * 0.3 * 0.4)]))


def test_ce_matches_huggingface_loss_and_rejects_empty_labels():
    model, batch = tiny_lora_model(), make_batch(3, 0)
    assert torch.allclose(obj.ce(model, batch), model(**batch).loss, atol=1e-6)
    empty = dict(batch, labels=torch.full_like(batch["labels"], -100))
    with pytest.raises(ValueError, match="no answer tokens"):
        obj.ce(model, empty)


def test_gradient_ascent_raises_forget_ce():
    model, batch = tiny_lora_model(), make_batch(4, 0)
    before = obj.ce(model, batch).item()
    train(model, obj.make_objective("ascent"), batch, lr=5e-2)
    assert obj.ce(model, batch).item() > before + 0.1


def test_npo_at_init_is_two_over_beta_log_two():
    model, batch = tiny_lora_model(), make_batch(4, 0)
    for beta in (0.1, 0.5):
        loss = obj.make_objective("npo", beta=beta)(model, batch)
        assert loss.item() == pytest.approx(2 / beta * math.log(2), rel=1e-5)


def test_npo_reference_for_an_adapter_that_already_learned():
    model, batch = tiny_lora_model(), make_batch(4, 0)
    perturb_adapter(model)
    npo = obj.NPOLoss(beta=0.1)
    # adapter-disabled reference differs from the current (original) model -> ratio != 0
    assert npo(model, batch).item() != pytest.approx(2 / 0.1 * math.log(2), rel=1e-3)
    [with_ref] = obj.attach_reference_logprobs(model, [batch], disable_adapter=False)
    assert npo(model, with_ref).item() == pytest.approx(2 / 0.1 * math.log(2), rel=1e-5)


def test_npo_lowers_forget_likelihood():
    model, batch = tiny_lora_model(), make_batch(4, 0)
    before = obj.sequence_logprob(model, batch)[0].detach()
    train(model, obj.NPOLoss(beta=0.1), batch)
    assert (obj.sequence_logprob(model, batch)[0] < before).all()


def test_simnpo_formula_on_hand_case():
    model, batch = hand_batch()
    beta, gamma = 2.0, 0.5
    means = [math.log(0.4), math.log(0.2 * 0.3 * 0.4) / 3]
    expected = -2 / beta * sum(math.log(1 / (1 + math.exp(beta * m + gamma))) for m in means) / 2
    assert obj.make_objective("simnpo", beta=beta, gamma=gamma)(model, batch).item() == pytest.approx(expected, rel=1e-5)


def test_simnpo_is_length_normalised_npo_is_not():
    row = [0.0, 0.0, 0.0, 0.0]
    model = FixedLogits(row)
    short = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "labels": torch.tensor([[-100, 1, -100]])}
    long = {"input_ids": torch.zeros(1, 5, dtype=torch.long), "attention_mask": torch.ones(1, 5, dtype=torch.long),
            "labels": torch.tensor([[-100, 1, 2, 3, -100]])}
    simnpo = obj.SimNPOLoss()
    assert simnpo(model, short).item() == pytest.approx(simnpo(model, long).item(), rel=1e-6)
    npo = obj.NPOLoss()
    zero = {"ref_logprob": torch.zeros(1)}
    assert npo(model, dict(short, **zero)).item() != pytest.approx(npo(model, dict(long, **zero)).item(), rel=1e-3)


def test_rmu_moves_hidden_state_towards_control_vector():
    model, forget = tiny_lora_model(), make_batch(4, 0)
    trainable = obj.restrict_trainable_lora(model, layers=[0, 1], modules=["down_proj"])
    assert trainable and all("down_proj" in n and "lora_" in n for n in trainable)
    rmu = obj.make_objective("rmu", layer=1, steering_coeff=4.0, alpha=10.0, seed=3)
    target = rmu.control_vector(32)

    def distance():
        with torch.no_grad():
            h = obj._layer_output(model, forget, 1)
        return (h - target).norm(dim=-1)[forget["attention_mask"].bool()].mean().item()

    before = distance()
    train(model, rmu, forget, steps=15, lr=5e-2, retain_batch=make_batch(2, 9))
    assert distance() < 0.5 * before


def test_rmu_retain_term_is_zero_for_a_fresh_adapter_and_layer_checked():
    model, forget, retain = tiny_lora_model(), make_batch(2, 0), make_batch(2, 1)
    rmu = obj.RMULoss(layer=0, steering_coeff=2.0, alpha=100.0)
    assert torch.allclose(rmu(model, forget, retain_batch=retain), rmu(model, forget))
    with pytest.raises(ValueError, match="rmu layer"):
        obj.RMULoss(layer=5)(model, forget)


def test_rmu_precomputed_frozen_hidden_keeps_retain_term_at_zero_for_a_learned_adapter():
    model, forget, retain = tiny_lora_model(), make_batch(2, 0), make_batch(2, 1)
    perturb_adapter(model)
    rmu = obj.RMULoss(layer=1, steering_coeff=2.0, alpha=100.0)
    [frozen] = obj.attach_reference_hidden(model, [retain], layer=1, disable_adapter=False)
    assert torch.allclose(rmu(model, forget, retain_batch=frozen), rmu(model, forget))
    assert rmu(model, forget, retain_batch=retain) > rmu(model, forget)  # base-model reference differs


def test_rmu_control_vector_is_seeded():
    a, b, c = obj.RMULoss(seed=0, steering_coeff=6.5), obj.RMULoss(seed=0, steering_coeff=6.5), obj.RMULoss(seed=1)
    assert torch.equal(a.control_vector(16), b.control_vector(16))
    assert not torch.equal(a.control_vector(16), c.control_vector(16))
    assert a.control_vector(16).norm().item() == pytest.approx(6.5, rel=1e-6)


def test_training_is_deterministic():
    states = []
    for _ in range(2):
        model = tiny_lora_model(seed=4)
        train(model, obj.make_objective("simnpo"), make_batch(3, 2), steps=3)
        states.append({n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n})
    assert all(torch.equal(states[0][n], states[1][n]) for n in states[0])


def test_restrict_trainable_lora_selects_layers_and_modules():
    model = tiny_lora_model()
    names = obj.restrict_trainable_lora(model, layers=[1], modules=["down_proj", "q_proj"])
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(names) and len(names) == 4
    assert all(".layers.1." in n for n in names)
    with pytest.raises(ValueError, match="no LoRA parameters"):
        obj.restrict_trainable_lora(model, layers=[7])


def test_make_objective_rejects_unknown_names_and_parameters():
    assert set(obj.OBJECTIVES) == {"ce", "ascent", "npo", "simnpo", "rmu"}
    with pytest.raises(ValueError, match="objective must be one of"):
        obj.make_objective("dpo")
    with pytest.raises(ValueError, match="does not take parameters"):
        obj.make_objective("npo", gamma=1.0)
    with pytest.raises(ValueError, match="beta"):
        obj.make_objective("npo", beta=0.0)
