"""Run-config validation: every bad value is one line naming the key, before any work."""

import math
from pathlib import Path

import pytest
import tomllib

from core.config import ConfigError
from strategies.run_config import all_settings, parse_config

ROOT = Path(__file__).resolve().parents[1]


def test_defaults_parse_and_match_pyproject_as_flower_reads_it():
    """Flower flattens pyproject's nested run-config tables into dotted keys and fuses the user's
    dotted overrides into them (``flwr.common.config``): the keys are the declared ones."""
    from flwr.common.config import get_fused_config_from_dir, parse_config_args

    cfg = parse_config({"presets": False})  # pyproject holds the global defaults; presets fill on top
    pyproject = get_fused_config_from_dir(ROOT, {})
    assert set(pyproject) == {s.key for s in all_settings()} and "lethe.gamma" in pyproject
    for setting in all_settings():
        assert cfg[setting.key] == pyproject[setting.key] or setting.key == "presets", setting.key
    fused = get_fused_config_from_dir(ROOT, parse_config_args(["lethe.gamma=0.5 method='lethe'"]))
    assert fused["lethe.gamma"] == 0.5 and parse_config(fused, given={"lethe.gamma", "method"})["lethe.gamma"] == 0.5


def test_pyproject_run_config_is_generated_from_the_declarations(tmp_path):
    """``python -m strategies.registry --write pyproject.toml`` writes the ``[tool.flwr.app.config*]``
    tables: generic keys at the top level (at most 45), each namespace in its own table, and every
    other byte of the file as it was."""
    from strategies.registry import pyproject_config, write_pyproject_config

    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert pyproject_config() in text
    config = tomllib.loads(text)["tool"]["flwr"]["app"]["config"]
    assert len([k for k, v in config.items() if not isinstance(v, dict)]) <= 45
    assert {"fedup", "lethe", "guard", "firm", "llm", "text"} <= {k for k, v in config.items() if isinstance(v, dict)}
    stale = tmp_path / "pyproject.toml"
    stale.write_text(text.replace("[tool.flwr.app.config.lethe]\n", "[tool.flwr.app.config.lethe]\nold = 1\n"))
    assert write_pyproject_config(str(stale)) and stale.read_text(encoding="utf-8") == text
    assert not write_pyproject_config(str(stale))


def test_an_explicit_key_wins_over_a_preset_even_at_its_default():
    """digits-lenet5's preset runs 30 continued rounds; continue-rounds=10 (the global default) given
    by the user runs 10, in a run config of only the given keys and in a full one with ``given``."""
    from flwr.common.config import get_fused_config_from_dir

    assert parse_config({})["continue-rounds"] == 30
    assert parse_config({"continue-rounds": 10})["continue-rounds"] == 10
    full = get_fused_config_from_dir(ROOT, {"continue-rounds": 10})
    assert parse_config(full, given={"continue-rounds"})["continue-rounds"] == 10
    assert parse_config(full, given=set())["continue-rounds"] == 30
    assert "continue-rounds" not in parse_config(full, given={"continue-rounds"}).presets


def test_the_offline_default_trains_one_local_epoch_a_round_and_presets_false_gives_the_former_recipe():
    recipe = ("pretrain-rounds", "local-epochs", "continue-rounds")
    assert tuple(parse_config({})[k] for k in recipe) == (60, 1, 30)
    assert tuple(parse_config({"presets": False})[k] for k in recipe) == (20, 3, 10)
    given = parse_config({"pretrain-rounds": 40, "continue-rounds": 5})
    assert tuple(given[k] for k in recipe) == (40, 1, 5) and "pretrain-rounds" not in given.presets


def test_readme_tables_are_the_registered_ones(tmp_path):
    """The README's method table and docs/settings.md's key table are generated from the registrations
    (``python -m strategies.registry --write README.md docs/settings.md``); a new method or key must be
    written there. The writer fills whichever marked tables a file holds and refuses a file with none."""
    from strategies.registry import key_table, method_table, write_readme_tables

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    settings = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert "<!-- methods:begin -->\n" + method_table() + "\n<!-- methods:end -->" in readme
    assert "<!-- keys:begin -->\n" + key_table() + "\n<!-- keys:end -->" in settings
    assert "<!-- keys:begin -->" not in readme  # the key table lives in docs/settings.md only
    missing = [s.key for s in all_settings() if f"| `{s.key}` |" not in settings]
    assert not missing

    only_keys = tmp_path / "settings.md"
    only_keys.write_text("# keys\n<!-- keys:begin -->\nold\n<!-- keys:end -->\ntail\n", encoding="utf-8")
    assert write_readme_tables(str(only_keys)) is True
    assert only_keys.read_text(encoding="utf-8") == f"# keys\n<!-- keys:begin -->\n{key_table()}\n<!-- keys:end -->\ntail\n"
    assert write_readme_tables(str(only_keys)) is False
    none = tmp_path / "none.md"
    none.write_text("no tables here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="none of the generated tables"):
        write_readme_tables(str(none))


@pytest.mark.parametrize("key,value,fragment", [
    ("task", "imagenet-vgg", "one of digits-lenet5"),
    ("method", "magic", "one of none"),
    ("scenario", "everything", "one of client"),
    ("poison", "noise", "one of label-flip"),
    ("forget-class", 10, "0..9"),
    ("forget-class", -1, ">= 0"),
    ("pretrain-rounds", 0, "> 0"),
    ("local-epochs", -1, "> 0"),
    ("batch-size", 0, "> 0"),
    ("lr", 0.0, "> 0"),
    ("lr", -0.1, "> 0"),
    ("dirichlet-alpha", 0.0, "> 0"),
    ("sample-fraction", 0.0, "(0, 1]"),
    ("sample-fraction", 1.5, "(0, 1]"),
    ("continue-rounds", -1, ">= 0"),
    ("max-grad-norm", -1.0, ">= 0"),
    ("fedup.rho", 1.5, "(0, 1]"),
    ("fedup.sigma", -1.0, ">= 0"),
    ("fedup.epsilon", 0.0, "> 0"),
    ("fedup.delta", 1.0, "(0, 1)"),
    ("fedup.bottleneck", 0, "> 0"),
    ("lethe.gamma", 0.0, "> 0"),
    ("lethe.adapter-steps", -1, ">= 0"),
    ("lethe.rectify-rounds", -2, ">= 0"),
    ("init-seed", -2, "-1 or in 0..4294967295"),
])
def test_bad_value_names_key_and_allowed(key, value, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config({key: value})
    message = str(err.value)
    assert f"'{key}'" in message and fragment in message and "\n" not in message


def test_forget_client_outside_federation():
    with pytest.raises(ConfigError, match="'forget-client'=10 is outside the federation"):
        parse_config({"forget-client": 10}, num_clients=10)
    assert parse_config({"forget-client": 9}, num_clients=10)["forget-client"] == 9


def test_an_lr_schedule_is_refused_where_it_would_not_be_followed():
    """Methods that replay pretraining at the constant lr, and the LLM task (its own llm.lr), take
    'constant'; vision methods that do not replay take 'cosine'."""
    for overrides, fragment in [({"method": "federaser", "scenario": "client"}, "method 'federaser' replays"),
                                ({"method": "exact-fun", "scenario": "client"}, "method 'exact-fun' replays"),
                                ({"task": "llm-tofu", "method": "ga", "scenario": "client"}, "applies to vision and text")]:
        with pytest.raises(ConfigError) as err:
            parse_config({**overrides, "lr-schedule": "cosine"})
        assert "'lr-schedule'='cosine'" in str(err.value) and fragment in str(err.value)
    assert parse_config({"method": "fedup", "lr-schedule": "cosine"})["lr-schedule"] == "cosine"


def test_init_seed_is_refused_by_the_llm_task_which_starts_from_a_pretrained_model():
    with pytest.raises(ConfigError, match="'init-seed'=3 applies to vision and text"):
        parse_config({"task": "llm-tofu", "method": "ga", "scenario": "client", "init-seed": 3})
    assert parse_config({"init-seed": 3}).init_seed == 3 and parse_config({"seed": 5}).init_seed == 5


def test_a_gradient_clip_is_refused_by_the_llm_task_which_would_not_apply_it():
    """The LLM task trains its adapter with AdamW on llm.lr and no clip: it takes the default and
    refuses another value in one line; vision and text tasks take any value >= 0."""
    assert parse_config({"task": "llm-tofu", "method": "ga", "scenario": "client"})["max-grad-norm"] == 100.0
    with pytest.raises(ConfigError, match=r"'max-grad-norm'=0\.0 applies to vision and text tasks; task 'llm-tofu'"):
        parse_config({"task": "llm-tofu", "method": "ga", "scenario": "client", "max-grad-norm": 0})
    assert parse_config({"task": "text-minilm", "max-grad-norm": 0})["max-grad-norm"] == 0.0


def test_unknown_key_and_wrong_type():
    with pytest.raises(ConfigError, match="unknown run-config key"):
        parse_config({"pretrain-round": 3})
    with pytest.raises(ConfigError, match="'pretrain-rounds' must be a int"):
        parse_config({"pretrain-rounds": "many"})


def test_a_preset_of_an_unknown_key_is_one_line(monkeypatch):
    """A task, method or smoke preset naming a key nobody declares is refused like a user's unknown key."""
    from strategies import run_config

    monkeypatch.setitem(run_config.SMOKE, "no-such-key", 1)
    with pytest.raises(ConfigError, match="preset sets unknown run-config key 'no-such-key'"):
        parse_config({"smoke": True})
    assert "no-such-key" not in parse_config({}).as_dict()


def test_coercion_and_inf():
    cfg = parse_config({"lr": 1, "download": "true", "fedup.epsilon": math.inf})
    assert cfg["lr"] == 1.0 and isinstance(cfg["lr"], float)
    assert cfg["download"] is True and math.isinf(cfg["fedup.epsilon"])
    assert cfg.pretrain_rounds == cfg["pretrain-rounds"]


def test_with_values_keeps_the_task_and_refuses_to_change_it():
    cfg = parse_config({})
    changed = cfg.with_values({"lr": 0.5, "task": cfg["task"]})
    assert changed["lr"] == 0.5 and changed.task is cfg.task
    with pytest.raises(ValueError, match="'task'"):
        cfg.with_values({"task": cfg["task"] + "-other"})


def test_run_config_text_keeps_spaces_inside_quotes():
    from server_app.inprocess import parse_overrides

    parsed = parse_overrides("outputs-dir='/tmp/my runs/out' requests='class:3; class:5' lethe.gamma=0.5 x=\"a b\"")
    assert parsed == {"outputs-dir": "/tmp/my runs/out", "requests": "class:3; class:5", "lethe.gamma": 0.5,
                      "x": "a b"}


@pytest.mark.parametrize("overrides, fragment", [("lr=-1", "'lr'=-1.0 is not allowed: must be > 0"),
                                                 ("lr=", "is not 'key=value ...' in TOML syntax")])
def test_the_inprocess_runner_names_a_bad_setting_in_one_line(overrides, fragment):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "server_app.inprocess", "--clients", "3", "--run-config", overrides],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2 and fragment in done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1 and not done.stdout
