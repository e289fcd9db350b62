"""NoT (weight negation): the chosen layers per model, the negation, and the one-line errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.config import ConfigError
from strategies.negation.maths import first_layer, negate, parameter_keys
from strategies.run_config import parse_config
from tasks.registry import task_for


def test_first_layer_of_each_vision_model():
    expected = {"digits-lenet5": ["features.1.weight", "features.1.bias"],
                "cifar10-resnet18": ["features.1.weight"],  # the ResNet stem has no bias
                "cifar10-vit": ["features.patch_embed.weight", "features.patch_embed.bias"]}
    for task, keys in expected.items():
        with torch.device("meta"):
            model = task_for(task).build_model([], seed=0)
        assert parameter_keys(model, "first") == keys, task


def test_named_layers_take_every_parameter_in_model_order():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)))
    assert first_layer(model) == "0"
    assert parameter_keys(model, "2, 0") == ["0.weight", "0.bias", "2.0.weight", "2.0.bias", "2.1.weight",
                                             "2.1.bias"]
    with pytest.raises(ValueError, match=r"names '1', which is not a layer with parameters"):
        parameter_keys(model, "1")  # the ReLU owns no parameters
    with pytest.raises(ValueError, match="is empty"):
        parameter_keys(model, " , ")


def test_negate_flips_only_the_chosen_tensors():
    state = {"a.weight": torch.tensor([1.0, -2.0]), "a.bias": torch.tensor([0.5]), "b.weight": torch.tensor([3.0])}
    out = negate(state, ["a.weight", "a.bias"])
    assert torch.equal(out["a.weight"], torch.tensor([-1.0, 2.0])) and torch.equal(out["a.bias"], torch.tensor([-0.5]))
    assert torch.equal(out["b.weight"], state["b.weight"]) and out["b.weight"] is not state["b.weight"]
    assert torch.equal(state["a.weight"], torch.tensor([1.0, -2.0]))  # the input is left alone
    with pytest.raises(ValueError, match="'c.weight' is not in the model state"):
        negate(state, ["c.weight"])


def test_negation_changes_what_a_lenet_predicts():
    """Negating LeNet-5's first convolution flips its feature maps before the ReLU: the outputs change."""
    task = task_for("digits-lenet5")
    model = task.build_model([], seed=3)
    x = torch.rand(8, 1, 32, 32)
    before = model(x)
    model.load_state_dict(negate(model.state_dict(), parameter_keys(model, "first")))
    assert (model(x) - before).abs().max() > 1e-3


def test_config_rejects_a_layer_the_model_lacks_before_any_work():
    with pytest.raises(ConfigError, match=r"'not.layers' names 'features.99'.*task 'digits-lenet5'"):
        parse_config({"method": "not", "scenario": "class", "not.layers": "features.99"})
    cfg = parse_config({"method": "not", "scenario": "sample", "not.layers": "features.1,features.4"})
    assert cfg["not.layers"] == "features.1,features.4"
    with pytest.raises(ConfigError, match="'not.rounds'"):
        parse_config({"method": "not", "not.rounds": -1})


@pytest.mark.parametrize("not_lr, sent", [(0.0, 0.05), (0.01, 0.01)])
def test_refinement_rounds_train_at_not_lr_or_the_runs_lr(monkeypatch, not_lr, sent):
    """``not.lr`` 0 (the default) refines at the run's ``lr``; a positive one replaces it for the
    refinement rounds only (the config the rounds send is what the clients train with)."""
    from flwr.app import ArrayRecord

    from strategies.common.base import ModelState, UnlearnContext
    from strategies.negation import strategy

    task = task_for("digits-lenet5")
    seen = {}

    def fake_rounds(fed, strat, arrays, *, rounds, config, label, method):
        seen.update(config=dict(config), rounds=rounds)
        return arrays

    monkeypatch.setattr(strategy, "RoleFedAvg", lambda *args, **kwargs: None)
    monkeypatch.setattr(strategy, "run_rounds", fake_rounds)
    cfg = parse_config({"method": "not", "scenario": "class", "lr": 0.05, "not.lr": not_lr})
    original = ModelState(ArrayRecord(task.build_model([], seed=0).state_dict()), [])
    ctx = UnlearnContext(fed=None, cfg=cfg, original=original,
                         model_factory=lambda plugins: task.build_model(plugins, seed=0), retrain=lambda: None)
    strategy.NoT().unlearn(ctx)
    assert seen["config"]["lr"] == pytest.approx(sent) and seen["rounds"] == cfg["not.rounds"]
