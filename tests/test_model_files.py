"""Every model a run makes is kept as safetensors under its results folder (``server_app.model_files``)."""

from __future__ import annotations

import json
import os

import pytest
import torch
from flwr.app import ArrayRecord
from safetensors.torch import save_file

from server_app.inprocess import run_inprocess
from server_app.model_files import (
    plugin_parts,
    read_model,
    sha256_of,
    write_model,
    write_models,
)
from strategies.common.base import ModelState


def test_a_model_file_round_trips_its_tensors_and_plugins(tmp_path):
    state = {"w": torch.arange(6.0).reshape(2, 3), "plugins.0.up.weight": torch.ones(3, 2),
             "steps": torch.tensor(4, dtype=torch.int64)}
    model = ModelState(ArrayRecord(state), [{"kind": "fedup-filter", "seed": 1}])
    entry = write_model(str(tmp_path / "m.safetensors"), model, "unlearned")
    assert entry["sha256"] == sha256_of(entry["path"]) and entry["tensors"] == 3
    back = read_model(entry["path"])
    assert back.plugins == model.plugins
    got = back.arrays.to_torch_state_dict()
    assert set(got) == set(state) and all(torch.equal(got[k], state[k]) for k in state)
    assert [f for f in os.listdir(tmp_path)] == ["m.safetensors"]  # written atomically: no temporary left


def test_each_plugin_is_its_own_part():
    state = {"w": torch.zeros(2), "plugins.0.a": torch.ones(2), "plugins.1.b": torch.full((2,), 2.0)}
    model = ModelState(ArrayRecord(state), [{"kind": "first"}, {"kind": "second"}])
    parts = plugin_parts(model)
    assert [kind for kind, _ in parts] == ["first", "second"]
    assert list(parts[1][1].arrays.keys()) == ["plugins.1.b"] and parts[1][1].plugins == [{"kind": "second"}]


def test_write_models_keeps_a_reversible_methods_plugin_apart(tmp_path):
    base = ModelState(ArrayRecord({"w": torch.zeros(2)}))
    unlearned = ModelState(ArrayRecord({"w": torch.zeros(2), "plugins.0.a": torch.ones(2)}), [{"kind": "flt"}])
    files = write_models(str(tmp_path), {"original": base, "unlearned": unlearned}, reversible=True)
    assert set(files) == {"original", "unlearned", "flt"} and files["flt"]["path"] == "models/flt.safetensors"
    assert not write_models(str(tmp_path / "b"), {"unlearned": unlearned}, reversible=False).keys() - {"unlearned"}


def test_a_run_keeps_its_original_unlearned_and_continued_models(tmp_path):
    """A FedUP smoke run: the three models and the filter, each listed in results.json with the sha256 of
    its file; the unlearned model read back is the original with the filter added."""
    folder = run_inprocess({"method": "fedup", "scenario": "class", "smoke": True, "cache-dir": str(tmp_path / "c"),
                            "outputs-dir": str(tmp_path / "o")}, 3)
    results = json.load(open(os.path.join(folder, "results.json")))
    files = results["model_files"]
    assert set(files) == {"original", "unlearned", "continued", "fedup-filter"}
    for entry in files.values():
        assert sha256_of(os.path.join(folder, entry["path"])) == entry["sha256"]
    original = read_model(os.path.join(folder, files["original"]["path"])).arrays.to_torch_state_dict()
    unlearned = read_model(os.path.join(folder, files["unlearned"]["path"]))
    assert unlearned.plugins and unlearned.plugins[0]["kind"] == "fedup-filter"
    state = unlearned.arrays.to_torch_state_dict()
    assert all(torch.equal(state[k], original[k]) for k in original)  # the backbone is the original's
    assert set(state) - set(original) == set(read_model(os.path.join(folder, files["fedup-filter"]["path"]))
                                             .arrays.keys())


def test_a_run_starts_from_a_given_model_and_pretrains_nothing(tmp_path):
    """``original-model`` = an earlier run's models/original.safetensors: no pretraining round, the same
    original figures, the file's sha256 in results.json; FedUP's class request still runs on it."""
    first = run_inprocess({"method": "none", "scenario": "class", "smoke": True, "cache-dir": str(tmp_path / "c"),
                           "outputs-dir": str(tmp_path / "o")}, 3)
    before = json.load(open(os.path.join(first, "results.json")))
    path = os.path.join(first, before["model_files"]["original"]["path"])
    second = run_inprocess({"method": "fedup", "scenario": "class", "smoke": True, "original-model": path,
                            "cache-dir": str(tmp_path / "c2"), "outputs-dir": str(tmp_path / "o2")}, 3)
    after = json.load(open(os.path.join(second, "results.json")))
    assert after["cost"]["pretrain"]["rounds"] == 0 and after["cost"]["pretrain"]["bytes_down"] == 0
    assert after["run"]["original_model"] == {"path": path, "sha256": sha256_of(path)}
    assert after["models"]["original"]["test_acc"] == before["models"]["original"]["test_acc"]
    kept = read_model(os.path.join(second, after["model_files"]["original"]["path"])).arrays.to_torch_state_dict()
    given = read_model(path).arrays.to_torch_state_dict()
    assert kept.keys() == given.keys() and all(torch.equal(kept[k], given[k]) for k in given)
    assert before["run"]["original_model"] is None


@pytest.mark.parametrize("write, fragment", [
    (lambda p: save_file({"conv1.weight": torch.zeros(1)}, p), "is not a model of this task: missing"),
    (lambda p: open(p, "w").write("not a model"), "cannot be read as safetensors"),
])
def test_a_given_model_that_does_not_fit_the_task_is_one_line_before_any_node_works(tmp_path, write, fragment):
    from core.config import ConfigError
    from server_app.experiment import Experiment
    from server_app.inprocess import InProcessGrid
    from strategies.common.federation import Federation

    path = str(tmp_path / "model.safetensors")
    write(path)
    config = {"method": "fedup", "smoke": True, "original-model": path, "cache-dir": str(tmp_path / "c"),
              "outputs-dir": str(tmp_path / "o")}
    grid = InProcessGrid(3, config)
    sent = []
    original_send = grid.send_and_receive
    grid.send_and_receive = lambda messages, **kw: sent.extend(messages) or original_send(messages, **kw)
    with pytest.raises(ConfigError, match=f"'original-model'={path!r} {fragment}") as info:
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    assert "\n" not in str(info.value) and not sent


@pytest.mark.parametrize("overrides, fragment", [
    ({"method": "pga"}, "method 'pga' needs what its own pretraining kept"),
    ({"original-model": "/nonexistent/model.safetensors"}, "no such file"),
    ({"task": "llm-tofu", "method": "lethe"}, "is not a folder: the LLM task takes a PEFT adapter folder"),
])
def test_what_a_given_model_cannot_serve_is_refused_in_one_line(tmp_path, overrides, fragment):
    from core.config import ConfigError
    from strategies.run_config import parse_config

    path = tmp_path / "m.safetensors"
    save_file({"w": torch.zeros(1)}, str(path))
    with pytest.raises(ConfigError, match=fragment):
        parse_config({"original-model": str(path), **overrides})


def test_a_node_does_not_look_for_the_servers_model_file():
    """``original-model`` is a path on the server's host: a node parsing the run config (vision task)
    does not check it, the server does."""
    from core.config import ConfigError
    from strategies.run_config import parse_config

    config = {"original-model": "/nonexistent/model.safetensors"}
    assert parse_config(config, on_node=True)["original-model"] == config["original-model"]
    with pytest.raises(ConfigError, match="no such file"):
        parse_config(config)
