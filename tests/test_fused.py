"""FUSED: the LoRA plug-in on every vision model, the pure rules, the relabelling, restore, errors.

The phases themselves run in the contract cells (``tests/test_contract_vision.py -k fused`` and the text one)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ArrayRecord

from core.config import ConfigError
from strategies.common.base import ModelState
from strategies.fused.adapter import AdaptedLayer, check_targets
from strategies.fused.client import overwrite
from strategies.fused.maths import (
    DEFAULT_LAYERS,
    critical_layers,
    layer_sensitivity,
    merge_adapter,
    relabel_forgotten,
    remove_adapter,
    target_layers,
)
from strategies.fused.strategy import FUSED
from strategies.run_config import parse_config
from tasks.registry import task_for
from tasks.training import set_trainable

VISION = ("digits-lenet5", "cifar10-resnet18", "cifar100-resnet34", "cifar10-vit")


def _spec(targets, seed=1):
    return {"kind": "fused-lora", "targets": list(targets), "r": 16, "alpha": 32.0, "dropout": 0.1, "seed": seed}


@pytest.mark.parametrize("name", VISION)
def test_only_the_table_layers_get_lora_the_base_keeps_its_names_and_a_fresh_adapter_is_the_identity(name):
    task = task_for(name)
    base = task.build_model(seed=0).eval()
    targets = target_layers(task.arch, "auto", base)
    model = task.build_model([_spec(targets)], seed=0)
    adapted = sorted(n for n, m in model.named_modules() if isinstance(m, AdaptedLayer))
    assert adapted == sorted(targets)
    extra = set(model.state_dict()) - set(base.state_dict())
    assert extra and all(k.startswith("plugins.0.adapters.") for k in extra)
    assert {k.split(".")[3] for k in extra} == {t.replace(".", "_") for t in targets}
    assert {k.split(".")[4] for k in extra} == {"lora_A", "lora_B"}
    # the base is frozen under scope "plugins": only LoRA factors train
    ids = {id(p) for p in set_trainable(model, "plugins")}
    assert {n for n, p in model.named_parameters() if id(p) in ids} == extra
    set_trainable(model, "all")

    model.load_state_dict({**base.state_dict(), **{k: model.state_dict()[k] for k in extra}})
    model.eval()
    x = torch.rand(2, task.in_channels, 32, 32)
    with torch.no_grad():
        assert torch.equal(model(x), base(x))
        for key in extra:
            if ".lora_B." in key:
                model.state_dict()[key].fill_(0.05)
        # in eval mode under no_grad too: no fused fast path skips an adapted layer
        assert not torch.allclose(model(x), base(x))


def test_moving_the_model_moves_the_layers_peft_runs():
    """``model.to(...)`` (a client's device) reaches the base and the factors peft's forward uses."""
    model = task_for("digits-lenet5").build_model([_spec(["features.1", "head"])]).to(torch.float64)
    assert model(torch.rand(2, 1, 32, 32, dtype=torch.float64)).dtype == torch.float64


def test_adapter_init_is_seeded():
    task = task_for("digits-lenet5")
    a = task.build_model([_spec(["head"], seed=3)]).state_dict()
    b = task.build_model([_spec(["head"], seed=3)]).state_dict()
    c = task.build_model([_spec(["head"], seed=4)]).state_dict()
    key = "plugins.0.adapters.head.lora_A.default.weight"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])


def test_local_overwrite_trains_only_the_adapter_and_relabels_the_forgotten_class():
    cfg = parse_config({"method": "fused", "scenario": "class", "forget-class": 3})
    model = task_for("digits-lenet5").build_model([_spec(["features.1", "head"])], seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x, y = torch.rand(16, 1, 32, 32), torch.tensor([3, 1] * 8)
    overwrite(model, x, y, cfg=cfg, conf={"epochs": 2, "lr": 0.1, "relabel": True}, seed=5,
              device=torch.device("cpu"))
    after = model.state_dict()
    changed = {k for k in after if not torch.equal(after[k], before[k])}
    assert changed and all(k.startswith("plugins.0.") for k in changed)
    # the same training without relabelling ends elsewhere: the labels of class 3 were changed
    plain = task_for("digits-lenet5").build_model([_spec(["features.1", "head"])], seed=0)
    plain.load_state_dict(before)
    overwrite(plain, x, y, cfg=cfg, conf={"epochs": 2, "lr": 0.1, "relabel": False}, seed=5,
              device=torch.device("cpu"))
    assert any(not torch.equal(plain.state_dict()[k], after[k]) for k in changed)


def test_relabel_moves_every_forgotten_label_to_another_class_and_keeps_the_rest():
    y = torch.tensor([3] * 2000 + [0, 1, 2, 4, 9])
    out = relabel_forgotten(y, 3, 10, torch.Generator().manual_seed(0))
    assert torch.equal(out[2000:], y[2000:])
    assert not (out[:2000] == 3).any()
    counts = torch.bincount(out[:2000], minlength=10)
    assert counts[3] == 0 and (counts[[0, 1, 2, 4, 5, 6, 7, 8, 9]] > 150).all()  # ~222 each: uniform
    again = relabel_forgotten(y, 3, 10, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    with pytest.raises(ValueError, match="outside 0..9"):
        relabel_forgotten(y, 10, 10, torch.Generator())


def test_layer_sensitivity_is_the_data_weighted_manhattan_distance_and_picks_the_top_layers():
    start = {"a.weight": torch.zeros(2, 2), "a.bias": torch.zeros(2), "b.weight": torch.zeros(3),
             "c.weight": torch.zeros(1)}
    one = {"a.weight": torch.ones(2, 2), "a.bias": torch.tensor([1.0, -1.0]), "b.weight": torch.zeros(3),
           "c.weight": torch.tensor([-10.0])}
    two = {"a.weight": torch.zeros(2, 2), "a.bias": torch.zeros(2), "b.weight": torch.tensor([3.0, 0.0, -3.0]),
           "c.weight": torch.zeros(1)}
    diff = layer_sensitivity(start, [one, two], [3, 1], ["a", "b", "c"])
    assert diff == pytest.approx({"a": 0.75 * 6, "b": 0.25 * 6, "c": 0.75 * 10})
    assert critical_layers(diff, 2) == ["a", "c"]  # the most sensitive, in model order
    with pytest.raises(ValueError, match="fused.cli-layers'=4 .* must be in 1..3"):
        critical_layers(diff, 4)
    with pytest.raises(ValueError, match="no parameters"):
        layer_sensitivity(start, [one], [1], ["d"])


def test_merge_replaces_only_the_adapter_and_remove_restores_the_base():
    base = {"features.1.weight": torch.randn(3, 3), "head.bias": torch.randn(2)}
    old = {"plugins.0.adapters.head.lora_A.default.weight": torch.zeros(4, 2)}
    new = {"plugins.0.adapters.head.lora_A.default.weight": torch.ones(4, 2)}
    merged = merge_adapter({**base, **old}, new, 0)
    assert torch.equal(merged["plugins.0.adapters.head.lora_A.default.weight"], torch.ones(4, 2))
    assert all(merged[k] is base[k] for k in base)
    assert remove_adapter(merged, 0).keys() == base.keys()
    with pytest.raises(ValueError, match="outside plug-in 0"):
        merge_adapter({**base, **old}, {**new, "head.bias": torch.zeros(2)}, 0)
    with pytest.raises(ValueError, match="lacks 1 tensor"):
        merge_adapter({**base, **old}, {}, 0)


def test_restore_is_bit_exact_after_the_adapter_trained():
    task = task_for("digits-lenet5")
    original = task.build_model(seed=0).state_dict()
    plugins = [_spec(DEFAULT_LAYERS["lenet5"])]
    unlearned = task.build_model(plugins, seed=0)
    unlearned.load_state_dict({**original, **{k: v for k, v in unlearned.state_dict().items()
                                              if k.startswith("plugins.")}})
    x, y = torch.rand(32, 1, 32, 32), torch.randint(0, 10, (32,))
    cfg = parse_config({"method": "fused", "scenario": "client"})
    overwrite(unlearned, x, y, cfg=cfg, conf={"epochs": 1, "lr": 0.1}, seed=1, device=torch.device("cpu"))
    restored = FUSED().restore(ModelState(ArrayRecord(unlearned.state_dict()), plugins), ctx=None)
    state = restored.arrays.to_torch_state_dict()
    assert restored.plugins == [] and state.keys() == original.keys()
    assert all(torch.equal(state[k], original[k]) for k in original)


def test_layer_errors_are_one_line_and_name_the_setting():
    model = task_for("digits-lenet5").build_model()
    for targets, needle in ((["features.99"], "has no layer 'features.99'"),
                            (["features.2"], "is a ReLU"), (["head", "head"], "names a layer twice"), ([], "no layer")):
        with pytest.raises(ValueError, match=needle) as err:
            check_targets(model, targets)
        assert "fused.layers" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="run-config 'fused.layers': the model has no layer 'conv1'"):
        parse_config({"method": "fused", "fused.layers": "conv1,head"})
    assert target_layers("lenet5", " features.4 , head", model) == ["features.4", "head"]
    with pytest.raises(ConfigError, match="fused.dropout"):
        parse_config({"method": "fused", "fused.dropout": 1.5})
    with pytest.raises(ConfigError, match="fused.cli-layers'=6 is not allowed: must be in 0..5"):
        parse_config({"method": "fused", "fused.layers": "cli", "fused.cli-layers": 6})
    with pytest.raises(ConfigError, match="'method'='fused' needs a task of kind vision") as err:
        parse_config({"method": "fused", "task": "llm-tofu"})
    assert "\n" not in str(err.value)


def test_text_table_adapts_the_last_trained_encoder_layer_and_the_head():
    for layers, last in ((1, 0), (2, 1)):
        cfg = parse_config({"task": "text-minilm", "method": "fused", "text.train-layers": layers})
        targets = target_layers(cfg.task.arch, "auto", cfg.task.model_outline(cfg))
        assert targets == [f"features.layers.{last}.intermediate.dense", f"features.layers.{last}.output.dense", "head"]
    with pytest.raises(ConfigError, match="trains none \\(text.train-layers=0\\)"):
        parse_config({"task": "text-minilm", "method": "fused", "text.train-layers": 0})
