"""The one registration point: methods found in their packages, their settings, queries, objectives, presets."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from core.config import ConfigError, positive, setting
from strategies import registry, run_config
from strategies.common.base import UnlearningMethod
from strategies.registry import MethodSpec, all_methods, method_for, method_spec
from strategies.run_config import parse_config
from tasks.registry import task_for


def test_every_package_registers_methods_whose_strategy_matches_the_declaration():
    names = [spec.name for spec in all_methods()]
    assert {"none", "retrain", "fedup", "lethe", "firm", "avg", "sum", "ties", "fulm", "ga", "npo", "simnpo",
            "pga", "federaser", "exact-fun", "fused", "not", "fedosd", "fedau", "rmu"} == set(names)
    for spec in all_methods():
        method = method_for(spec.name)
        assert isinstance(method, UnlearningMethod) and method.name == spec.name
        assert method.reversible == spec.reversible, spec.name


def test_a_method_owns_its_keys_and_another_methods_key_is_named_not_used():
    owned = {s.key for s in method_spec("fedup").settings}
    assert "fedup.alpha" in owned and not any(k.startswith("lethe.") for k in owned)
    cfg = parse_config({"method": "lethe", "fedup.alpha": 0.3})
    assert run_config.inapplicable_settings(cfg) == ["fedup.alpha (method fedup only)"]
    assert run_config.inapplicable_settings(parse_config({"task": "llm-tofu", "method": "avg",
                                                      "firm.fisher-batches": 4})) == []  # the merges read it


def test_preset_fills_what_the_user_left_and_an_explicit_key_wins():
    cfg = parse_config({"task": "llm-tofu", "method": "lethe"})
    assert cfg["lethe.adapter-steps"] == 0 and cfg.presets == {"lethe.adapter-steps": 0}
    mine = parse_config({"task": "llm-tofu", "method": "lethe", "lethe.rectify-rounds": 2})
    assert mine["lethe.rectify-rounds"] == 2 and "lethe.rectify-rounds" not in mine.presets
    off = parse_config({"task": "llm-tofu", "method": "lethe", "presets": False, "lethe.adapter-steps": 0})
    assert off.presets == {}
    vision = parse_config({"method": "lethe"})
    assert vision["lethe.adapter-steps"] == 50  # Lethe's preset is the LLM task's only
    assert not any(k.startswith("lethe.") for k in vision.presets)


def test_a_method_alone_is_its_paper_and_a_recipe_fills_its_keys_by_scenario_and_task_kind():
    """No guard is on by default; ``recipe='lethe-robust'`` fills them (its [scenario.*] and
    [task-kind.*] tables over its [settings]), records what it filled, and an explicit key wins."""
    from strategies.common.guards import GUARD_SETTINGS

    paper = parse_config({"method": "lethe", "scenario": "client"})
    assert paper.recipe == "paper" and paper.recipe_settings == {}
    assert all(paper[s.key] == s.default for s in GUARD_SETTINGS)
    client = parse_config({"method": "lethe", "scenario": "client", "recipe": "lethe-robust"})
    assert client.recipe == "lethe-robust" and client["guard.retain-rise"] == 2.0 and client["lethe.lr"] == 0.01
    assert client.recipe_settings["guard.stop-loss"] == 12.0 and client["guard.verify-passes"] == 3
    klass = parse_config({"method": "lethe", "scenario": "class", "recipe": "lethe-robust"})
    assert klass["lethe.lr"] == 0.02 and klass["guard.step-clip"] == 5.0 and klass["guard.retain-rise"] == 0.5
    llm = parse_config({"task": "llm-tofu", "method": "lethe", "scenario": "client", "recipe": "lethe-robust"})
    assert llm["guard.gamma-rule"] == "clamp" and llm["guard.retain-rise"] == 0.5 and llm["lethe.adapter-steps"] == 0
    mine = parse_config({"method": "lethe", "recipe": "lethe-robust", "guard.stop-loss": 20.0})
    assert mine["guard.stop-loss"] == 20.0 and "guard.stop-loss" not in mine.recipe_settings
    smoke = parse_config({"method": "lethe", "recipe": "lethe-robust", "smoke": True})
    assert smoke["guard.restore-extra-rounds"] == 0 and "guard.restore-extra-rounds" not in smoke.recipe_settings


def test_a_recipe_for_another_method_or_an_unknown_one_is_one_line():
    with pytest.raises(ConfigError, match="'recipe'='lethe-robust' is for method lethe, not 'fedup'"):
        parse_config({"method": "fedup", "recipe": "lethe-robust"})
    allowed = "must be one of '' \\(none\\), fedup-robust, lethe-robust"
    with pytest.raises(ConfigError, match=f"'recipe'='nope' is not allowed: {allowed}"):
        parse_config({"method": "lethe", "recipe": "nope"})


def test_smoke_shrinks_every_phase_but_keeps_explicit_keys():
    cfg = parse_config({"method": "fedup", "smoke": True, "continue-rounds": 3})
    assert cfg["pretrain-rounds"] == 2 and cfg["local-epochs"] == 1 and cfg["fedup.epochs"] == 5
    assert cfg["continue-rounds"] == 3
    with pytest.raises(ConfigError, match="'smoke'"):
        parse_config({"smoke": "sometimes"})


CALLS: list[float] = []


def double_ce(model, x, y, *, cfg, conf, seed, device):
    """A test method's own local objective: cross-entropy scaled by its own setting."""
    from tasks.training import train_local

    CALLS.append(cfg["double-weight"])
    return train_local(model, x, y, epochs=1, batch_size=cfg["batch-size"], lr=0.01, momentum=0.0, seed=seed,
                       loss_fn=lambda m, xb, yb: cfg["double-weight"] * torch.nn.functional.cross_entropy(m(xb), yb))


def test_a_new_method_registers_its_setting_and_objective_in_one_place(monkeypatch):
    """A method declared once is accepted by the config and its local objective runs on the clients."""
    from client_app.app import app
    from server_app.inprocess import InProcessGrid

    spec = MethodSpec("double", "test method", "strategies.reference.strategy:NoUnlearning",
                      settings=(setting("double-weight", float, 2.0, "loss weight", positive()),),
                      objectives={"double-ce": f"{__name__}:double_ce"})
    real = registry.all_methods
    monkeypatch.setattr(registry, "all_methods", lambda: (*real(), spec))
    run_config.all_settings.cache_clear()
    CALLS.clear()
    try:
        assert parse_config({"method": "double"})["double-weight"] == 2.0
        with pytest.raises(ConfigError, match="'double-weight'"):
            parse_config({"method": "double", "double-weight": -1.0})
        run = {"method": "double", "scenario": "class", "double-weight": 3.0}
        InProcessGrid(3, run)  # sets Flower's task identity for the message below
        model = task_for("digits-lenet5").build_model([], seed=0)
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "config": ConfigRecord({"role": "retain", "objective": "double-ce"})})
        context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run,
                          node_config={"partition-id": 0, "num-partitions": 3})
        reply = app(Message(content, dst_node_id=7, message_type="train"), context)
        assert CALLS == [3.0] and reply.content["metrics"]["loss"] > 0
    finally:
        run_config.all_settings.cache_clear()


def test_two_methods_cannot_share_a_name(monkeypatch):
    clash = dataclasses.replace(method_spec("none"), summary="again")
    monkeypatch.setattr(registry.importlib, "import_module", _with_extra(registry.importlib.import_module, clash))
    registry.all_methods.cache_clear()
    try:
        with pytest.raises(RuntimeError, match="registered twice: none"):
            registry.all_methods()
    finally:
        monkeypatch.undo()
        registry.all_methods.cache_clear()


def _with_extra(import_module, spec):
    class Extra:
        METHODS = (spec,)

    def fake(name, *args):
        return Extra if name == "strategies.merges" else import_module(name, *args)

    return fake


def test_a_recipe_writes_a_key_as_a_dotted_name_or_in_its_namespace_table_and_is_read_once(tmp_path):
    from tasks.recipes import _read_recipe

    path = tmp_path / "mine.toml"
    path.write_text('methods = ["lethe"]\n[settings]\n"lethe.lr" = 0.02\n[settings.guard]\nstop-loss = 12.0\n'
                    '[scenario.class.lethe]\ngamma = 0.4\n[task-kind.llm]\n"guard.walk-back" = 1.0\n')
    recipe = _read_recipe("mine", str(path))
    assert recipe.values_for("class", "llm") == {"lethe.lr": 0.02, "guard.stop-loss": 12.0, "lethe.gamma": 0.4,
                                                 "guard.walk-back": 1.0}
    assert recipe.values_for("sample", "vision") == {"lethe.lr": 0.02, "guard.stop-loss": 12.0}
    path.write_text('methods = ["lethe"]\n')
    assert _read_recipe("mine", str(path)) is recipe  # read once per process
