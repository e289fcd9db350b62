"""``original-model`` on the LLM task: a PEFT adapter folder, or a merged Hugging Face model folder."""

from __future__ import annotations

import json
import os

import pytest
import torch

from core.config import ConfigError
from server_app.experiment import Experiment
from server_app.inprocess import InProcessGrid
from strategies.common.federation import Federation
from strategies.run_config import parse_config
from tasks.llm.given_model import folder_sha256

TINY_LLM = {"task": "llm-tofu", "method": "none", "scenario": "sample", "llm.num-authors": 8, "llm.qa-per-author": 3,
            "llm.forget-fraction": 0.25, "pretrain-rounds": 2, "continue-rounds": 1, "llm.local-epochs": 1,
            "llm.lr": 5e-3, "llm.batch-size": 8, "llm.lora-rank": 4, "llm.max-new-tokens": 6}


def _trained_adapter_folder(path, cfg) -> dict:
    """The run's own LoRA model with its adapter moved off the fresh one, written by PEFT's
    ``save_pretrained``; returns the adapter tensors it holds."""
    from peft import get_peft_model_state_dict

    from tasks.llm.model import build_llm

    model, _ = build_llm(lora_rank=cfg["llm.lora-rank"], lora_alpha=cfg["llm.lora-alpha"], seed=cfg["seed"])
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.add_(0.01)
    model.save_pretrained(str(path))
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(model).items()}


def _experiment(tmp_path, **overrides):
    config = {**TINY_LLM, "cache-dir": str(tmp_path / "c"), "outputs-dir": str(tmp_path / "o"), **overrides}
    grid = InProcessGrid(3, config)
    sent = []
    original_send = grid.send_and_receive
    grid.send_and_receive = lambda messages, **kw: sent.extend(messages) or original_send(messages, **kw)
    return Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config), sent


def test_an_adapter_folder_is_the_original_and_nothing_is_pretrained(tmp_path):
    cfg = parse_config(TINY_LLM)
    folder = tmp_path / "adapter"
    adapter = _trained_adapter_folder(folder, cfg)
    experiment, _ = _experiment(tmp_path, **{"original-model": str(folder)})
    out = experiment.run()
    with open(os.path.join(out, "results.json"), encoding="utf-8") as handle:
        results = json.load(handle)
    assert results["cost"]["pretrain"]["rounds"] == 0 and results["cost"]["pretrain"]["bytes_down"] == 0
    assert results["run"]["original_model"] == {"path": str(folder), "sha256": folder_sha256(str(folder))}
    from server_app.model_files import read_model

    kept = read_model(os.path.join(out, results["model_files"]["original"]["path"])).arrays.to_torch_state_dict()
    assert kept.keys() == adapter.keys() and all(torch.equal(kept[k], adapter[k].float()) for k in adapter)
    from server_app.receipt import verify

    code, line = verify(out)  # the receipt names the given folder by its combined hash
    assert code == 0, line


def test_the_folder_hash_changes_with_any_file(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "a.json").write_text("{}")
    first = folder_sha256(str(folder))
    assert folder_sha256(str(folder)) == first
    (folder / "b.bin").write_bytes(b"x")
    assert folder_sha256(str(folder)) != first


@pytest.mark.parametrize("make, fragment", [
    ("other-rank", "is an adapter with llm.lora-rank 8, the run's llm.lora-rank is 4"),
    ("other-shapes", "is not a model of this task"),
    ("empty", r"holds neither adapter_config.json \+ adapter_model.safetensors"),
    ("merged-with-oracle", "is a merged model"),
    ("file", "is not a folder"),
])
def test_a_folder_that_does_not_fit_is_one_line_before_any_node_works(tmp_path, make, fragment):
    from tests.tiny_llm import CONFIG, LORA, tiny_base, tiny_lora

    folder = tmp_path / "given"
    if make == "other-rank":
        cfg = parse_config({**TINY_LLM, "llm.lora-rank": 8})
        _trained_adapter_folder(folder, cfg)
    elif make == "other-shapes":  # tests/tiny_llm's Llama: another architecture; settings made to agree
        from peft import LoraConfig, get_peft_model

        get_peft_model(tiny_base(), LoraConfig(**{**LORA, "r": 4, "lora_alpha": 32.0,
                                                  "target_modules": parse_config(TINY_LLM)["llm.target-modules"]
                                                  .split(",")})).save_pretrained(str(folder))
    elif make == "empty":
        folder.mkdir()
    elif make == "merged-with-oracle":
        tiny_lora().merge_and_unload().save_pretrained(str(folder))
        assert CONFIG and (folder / "config.json").exists()
    else:
        folder = tmp_path / "model.safetensors"
        folder.write_bytes(b"x")
    sent = []
    with pytest.raises(ConfigError, match=fragment) as info:
        experiment, sent = _experiment(tmp_path, **{"original-model": str(folder)})
        experiment.run()
    assert "\n" not in str(info.value) and not sent


def _metrics(results: dict) -> dict:
    return {k: v for k, v in results["models"]["original"].items() if isinstance(v, float)}


@pytest.mark.slow
def test_a_merged_folder_is_the_same_original_as_its_adapter(tmp_path):
    """The adapter merged into its base (``merge_and_unload``, saved with its tokenizer) is the run's
    base with a fresh adapter: the same original's figures as the adapter folder, nothing pretrained,
    and the oracle's figures listed as missing."""
    from tasks.llm.model import build_llm

    cfg = parse_config(TINY_LLM)
    adapter_folder, merged_folder = tmp_path / "adapter", tmp_path / "merged"
    _trained_adapter_folder(adapter_folder, cfg)
    model, tokenizer = build_llm(lora_rank=cfg["llm.lora-rank"], lora_alpha=cfg["llm.lora-alpha"], seed=cfg["seed"])
    model.load_adapter(str(adapter_folder), adapter_name="given")
    model.set_adapter("given")
    model.merge_and_unload(adapter_names=["given"]).save_pretrained(str(merged_folder))
    tokenizer.save_pretrained(str(merged_folder))
    runs = {}
    for name, folder in (("adapter", adapter_folder), ("merged", merged_folder)):
        experiment, _ = _experiment(tmp_path / f"run-{name}", **{"original-model": str(folder), "retrain-oracle": False})
        with open(os.path.join(experiment.run(), "results.json"), encoding="utf-8") as handle:
            runs[name] = json.load(handle)
    merged = runs["merged"]
    assert merged["cost"]["pretrain"]["rounds"] == 0 and merged["cost"]["retrain"]["rounds"] == 0
    assert merged["run"]["original_model"]["sha256"] == folder_sha256(str(merged_folder))
    assert merged["validity"]["missing"] and "retrain" not in merged["models"]
    adapter_metrics, merged_metrics = _metrics(runs["adapter"]), _metrics(merged)
    assert adapter_metrics.keys() == merged_metrics.keys() and adapter_metrics
    for key, value in adapter_metrics.items():
        assert merged_metrics[key] == pytest.approx(value, abs=1e-3), key
