"""RMU as a method: its loss against the formula written out here, the rule that scales the WMDP
paper's values to a model, one client's update, the config checks and (slow) a run on the LLM task."""

from __future__ import annotations

import json
import math
import pathlib

import pytest
import torch
from tiny_llm import make_batch, tiny_lora

from core.config import ConfigError
from strategies.objectives.losses import RMULoss
from strategies.rmu.settings import plan, steered_layer, steering_coeff
from strategies.rmu.train import rmu_update
from strategies.run_config import parse_config

RUN = {"rmu.layer": -1, "rmu.update-layers": 3, "rmu.steering-coeff": 0.0, "rmu.alpha": 1200.0, "seed": 5}


def _perturbed(seed: int = 1):
    model = tiny_lora(0)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def test_loss_is_forget_mse_to_c_u_plus_alpha_retain_mse_to_the_frozen_model():
    model, forget, retain = _perturbed(), make_batch(3, 0), make_batch(2, 1)
    layer, c, alpha = 0, 1.7, 30.0
    g = torch.Generator().manual_seed(11)
    u = torch.rand(32, generator=g)
    u = u / u.norm()

    def hidden(batch):  # hidden_states[l + 1] is the output of decoder layer l (not the last one)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        return out.hidden_states[layer + 1]

    def masked_mean(diff, mask):
        keep = mask.bool()
        return (diff[keep] ** 2).mean()

    with torch.no_grad():
        with model.disable_adapter():
            frozen = hidden(retain)
        expected = masked_mean(hidden(forget) - c * u, forget["attention_mask"]) \
            + alpha * masked_mean(hidden(retain) - frozen, retain["attention_mask"])
        got = RMULoss(layer=layer, steering_coeff=c, alpha=alpha, seed=11)(model, forget, retain_batch=retain)
    assert got.item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() > masked_mean(hidden(forget) - c * u, forget["attention_mask"]).item()  # retain term counts


def test_paper_values_are_kept_on_the_paper_model_and_scaled_on_others():
    assert [steered_layer(n, -1) for n in (32, 24, 22, 2, 1)] == [7, 5, 5, 0, 0]
    assert steered_layer(32, 3) == 3
    with pytest.raises(ValueError, match="rmu.layer'=2: the model has 2 decoder layers"):
        steered_layer(2, 2)
    assert steering_coeff(4096, 0.0) == 6.5 and steering_coeff(128, 2.5) == 2.5
    assert steering_coeff(1024, 0.0) == pytest.approx(6.5 / 2)
    zephyr = plan(RUN, 32, 4096)
    assert (zephyr.layer, zephyr.updated_layers, zephyr.steering_coeff, zephyr.alpha) == (7, (5, 6, 7), 6.5, 1200.0)
    small = plan(RUN, 2, 128)
    assert small.updated_layers == (0,) and small.steering_coeff == pytest.approx(6.5 * math.sqrt(128 / 4096))


def test_update_trains_only_down_proj_lora_of_the_updated_layers_and_steers_forget_states():
    model, forget, retain = tiny_lora(0), [make_batch(4, 0)], [make_batch(4, 1)]
    rmu = plan({**RUN, "rmu.layer": 1, "rmu.update-layers": 1, "rmu.steering-coeff": 4.0, "rmu.alpha": 10.0}, 2, 32)
    loss = RMULoss(layer=1, steering_coeff=4.0, alpha=0.0, seed=RUN["seed"])
    before_state = {n: p.detach().clone() for n, p in model.named_parameters()}
    before_grad = {n: p.requires_grad for n, p in model.named_parameters()}
    with torch.no_grad():
        forget_before = loss(model, forget[0]).item()
    history = rmu_update(model, forget, retain, rmu, epochs=15, lr=5e-2, seed=0)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before_state[n])}
    assert changed and all(".layers.1." in n and "down_proj.lora_" in n for n in changed)
    assert {n: p.requires_grad for n, p in model.named_parameters()} == before_grad  # put back
    with torch.no_grad():
        assert loss(model, forget[0]).item() < 0.7 * forget_before
    assert len(history) == 15 and all(math.isfinite(h) for h in history)


def test_config_needs_down_proj_adapters_and_a_layer_of_the_model():
    with pytest.raises(ConfigError, match="llm.target-modules'='q_proj,v_proj': method 'rmu' trains the LoRA of "
                                          "down_proj"):
        parse_config({"task": "llm-tofu", "method": "rmu", "llm.target-modules": "q_proj,v_proj"})
    with pytest.raises(ConfigError, match="'rmu.layer'=2: model 'tiny' has 2 decoder layers"):
        parse_config({"task": "llm-tofu", "method": "rmu", "rmu.layer": 2})
    with pytest.raises(ConfigError, match="'method'='rmu' needs a task of kind llm"):
        parse_config({"task": "text-minilm", "method": "rmu"})
    assert parse_config({"task": "llm-tofu", "method": "rmu", "rmu.layer": 1})["rmu.layer"] == 1


def test_config_checks_the_layer_against_a_merged_original_model(tmp_path):
    """A merged ``original-model`` is the run's base: ``rmu.layer`` is checked against its layers, not ``llm.model``'s."""
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 4}), encoding="utf-8")
    run = {"task": "llm-tofu", "method": "rmu", "original-model": str(tmp_path), "retrain-oracle": False}
    assert parse_config({**run, "rmu.layer": 3})["rmu.layer"] == 3
    with pytest.raises(ConfigError, match=f"'rmu.layer'=4: model '{tmp_path}' has 4 decoder layers: must be -1 or "
                                          "in 0..3"):
        parse_config({**run, "rmu.layer": 4})


@pytest.mark.slow
def test_rmu_runs_on_the_llm_task_and_reports_its_plan(tmp_path):
    from server_app.inprocess import run_inprocess

    run_config = {"task": "llm-tofu", "method": "rmu", "smoke": True, "cache-dir": str(tmp_path / "cache"),
                  "outputs-dir": str(tmp_path / "out")}
    folder = run_inprocess(run_config, 3)
    results = json.loads((pathlib.Path(folder) / "results.json").read_text())
    method = results["method"]
    assert method["objective"] == "rmu" and method["forget_clients"]
    assert method["rmu.alpha"] == 1200.0 and set(method["retain_term"]) == {str(c) for c in method["forget_clients"]}
    assert results["models"]["unlearned"] != results["models"]["original"]
