"""The LLM task (``llm-tofu``) through the real phases: in-process runs per method, bad input, TOFU files.

Tiny setting: 8 synthetic authors x 3 QA pairs on 4 clients, 2 pretrain rounds, 1 continued round;
every method shares one cached original/retrain model (module-scoped cache folder).
"""

import json
import os

import pytest

from core.config import ConfigError
from server_app.experiment import Experiment
from server_app.inprocess import InProcessGrid
from strategies.common.federation import Federation
from strategies.run_config import parse_config
from tasks.llm import synthetic
from tasks.llm.federation_data import (
    author_partition,
    build_llm_client_data,
    load_author_records,
)

TINY_LLM = {"task": "llm-tofu", "method": "none", "scenario": "sample", "llm.num-authors": 8, "llm.qa-per-author": 3,
            "llm.forget-fraction": 0.25, "pretrain-rounds": 2, "continue-rounds": 1, "llm.local-epochs": 1,
            "llm.lr": 5e-3, "llm.batch-size": 8, "lethe.adapter-steps": 0, "lethe.rectify-rounds": 1,
            "lethe.restore-rounds": 1, "llm.lora-rank": 4, "llm.max-new-tokens": 6}
LLM_KEYS = ("forget_fact_acc", "retain_fact_acc", "forget_rouge", "retain_rouge", "forget_truth", "retain_truth",
            "kr", "forget_quality", "utility", "forget_acc", "forget_mc_acc", "retain_mc_acc")


def run_llm(cache, out, num_clients=4, **overrides):
    config = {**TINY_LLM, "cache-dir": str(cache), "outputs-dir": str(out), **overrides}
    grid = InProcessGrid(num_clients, config)
    fed = Federation(grid, round_timeout=60, min_reply_fraction=0.5)
    folder = Experiment(fed, config).run()
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle), grid


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("llm")
    return {method: run_llm(base / "cache", base / "out", method=method)
            for method in ("none", "retrain", "ga", "npo", "simnpo", "lethe")}


def adapter_bytes():
    """(float32 bytes of the LoRA adapter, number of its tensors)."""
    cfg = parse_config(TINY_LLM)
    state = cfg.task.server_model(cfg, []).state_dict()
    return sum(t.numel() * 4 for t in state.values()), len(state)


@pytest.mark.parametrize("method", ["none", "retrain", "ga", "npo", "simnpo", "lethe"])
def test_every_method_writes_the_llm_entries(runs, method):
    results, _ = runs[method]
    assert results["run"]["task"] == "llm-tofu" and results["run"]["forget_clients"] == [0]
    for name in ("original", "unlearned", "continued"):
        entry = results["models"][name]
        for key in LLM_KEYS:
            assert entry[key] is not None and 0.0 <= entry[key] <= 1.0, (name, key)
        assert entry["forget_acc"] == entry["kr"]
        assert "_forget_truth_ratios" not in entry
    res = results["resurfacing"]
    assert res["kr_unlearned"] == results["models"]["unlearned"]["kr"] and len(res["kr_curve"]) == 1


def test_none_and_retrain_are_the_references(runs):
    none, _ = runs["none"]
    assert none["models"]["unlearned"] == none["models"]["original"]
    retrain, _ = runs["retrain"]
    # the retrain model compared with itself: identical truth-ratio samples
    assert retrain["models"]["unlearned"]["forget_quality"] == 1.0
    assert retrain["cost"]["unlearn"] == retrain["cost"]["built"]["retrain"]
    # every method starts from the same cached original model
    assert all(runs[m][0]["models"]["original"] == none["models"]["original"] for m in runs)


@pytest.mark.parametrize("method", ["ga", "npo", "simnpo"])
def test_one_round_objectives_lower_the_forget_likelihood(runs, method):
    results, grid = runs[method]
    original, unlearned = results["models"]["original"], results["models"]["unlearned"]
    assert unlearned["forget_prob"] < original["forget_prob"]
    cost = results["cost"]["unlearn"]
    assert cost["rounds"] == 1
    # one forget client uploads its LoRA adapter once: nothing but the adapter crosses
    size, tensors = adapter_bytes()
    slack = 300 * tensors + 1000  # per-tensor record metadata, config and metrics
    assert size <= cost["bytes_up"] < size + slack and size <= cost["bytes_down"] < size + slack
    assert results["method"]["forget_clients"] == [0]


def test_lethe_rectifies_the_lora_adapter(runs):
    results, _ = runs["lethe"]
    assert results["cost"]["unlearn"]["rounds"] == 2  # 1 rectify + 1 restore
    bounds = results["method"]["gamma_bounds"]
    assert len(bounds) == 1 and all("lora_" in name for name in bounds[0]["layers"])


@pytest.mark.parametrize("overrides,fragment", [
    ({"scenario": "class"}, "'scenario'='class' is not meaningful"),
    ({"poison": "label-flip"}, "'poison'='label-flip' is not meaningful"),
    ({"method": "fedup"}, "'method'='fedup' needs a task of kind vision"),
    ({"method": "lethe", "lethe.adapter-steps": 5}, "'lethe.adapter-steps'=5"),
    ({"llm.lora-rank": 0}, "'llm.lora-rank'=0"),
])
def test_bad_llm_config_is_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config({**TINY_LLM, **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_llm_methods_need_the_llm_task():
    with pytest.raises(ConfigError, match=r"'method'='npo' needs a task of kind llm \(llm-tofu, llm-wmdp, "):
        parse_config({"method": "npo"})


@pytest.mark.parametrize("overrides,fragment", [
    ({"llm.model": "/nonexistent/model"}, "llm.model '/nonexistent/model' is neither"),
    ({"llm.target-modules": "q_proj,wq"}, "llm.target-modules ['wq'] not in the model"),
    ({"llm.num-authors": 3}, "'llm.num-authors'"),
])
def test_bad_model_or_data_stops_before_any_message(tmp_path, overrides, fragment):
    config = {**TINY_LLM, "cache-dir": str(tmp_path), "outputs-dir": str(tmp_path), **overrides}
    grid = InProcessGrid(4, config)
    with pytest.raises(ConfigError) as err:
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert grid.sent_types == []


def write_tofu(folder, drop_column=None):
    """A small TOFU layout (4 authors x 20 rows, no author/key_fact columns) from synthetic words."""
    records = synthetic.fictitious_authors(4, 20, seed=3)
    full = [{"question": r["question"], "answer": r["answer"]} for r in records]
    if drop_column:
        full = [{k: v for k, v in row.items() if k != drop_column} for row in full]
    perturbed = [{k: r[k] for k in ("question", "answer", "paraphrased_answer", "perturbed_answer")}
                 for r in records[::2]]
    folder.mkdir()
    (folder / "full.json").write_text(json.dumps(full))
    (folder / "retain_perturbed.json").write_text(json.dumps(perturbed))
    return records


def test_tofu_files_partition_by_author_and_join_perturbed_answers(tmp_path):
    records = write_tofu(tmp_path / "tofu")
    cfg = parse_config({**TINY_LLM, "llm.data-dir": str(tmp_path / "tofu")}, num_clients=4)
    loaded = load_author_records(cfg)
    assert len(loaded) == 80 and loaded[20]["author"] == "tofu-author-1"
    assert sum(bool(r["perturbed_answer"]) for r in loaded) == 40
    clients = [build_llm_client_data(cfg, loaded, pid, 4) for pid in range(4)]
    assert [len(c.authors) for c in clients] == [1, 1, 1, 1]
    # sample scenario: the last 25 % of authors (TOFU's forgetNN rule) live on client 0
    assert clients[0].forget_authors == ["tofu-author-3"] and all(not c.forget for c in clients[1:])
    assert len(clients[0].evaluable("forget")) == 10 and records[60]["question"] == clients[0].forget[0]["question"]


def test_tofu_file_missing_a_column_stops_before_any_message(tmp_path):
    write_tofu(tmp_path / "tofu", drop_column="answer")
    config = {**TINY_LLM, "llm.data-dir": str(tmp_path / "tofu"), "cache-dir": str(tmp_path / "c")}
    grid = InProcessGrid(4, config)
    with pytest.raises(ConfigError, match="'llm.data-dir': .*missing column 'answer'"):
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    assert grid.sent_types == []


def test_author_partition_is_deterministic_and_documented():
    authors = [f"a{i}" for i in range(10)]
    cfg = parse_config({**TINY_LLM, "llm.forget-fraction": 0.3, "forget-client": 2})
    parts, forgotten = author_partition(cfg, authors, 4)
    assert forgotten == ["a7", "a8", "a9"] and set(forgotten) <= set(parts[2])
    assert sorted(a for p in parts for a in p) == sorted(authors) and sorted(map(len, parts)) == [2, 2, 3, 3]
    assert author_partition(cfg, authors, 4) == (parts, forgotten)
    client_cfg = parse_config({**TINY_LLM, "scenario": "client"})
    client_parts, client_forgotten = author_partition(client_cfg, authors, 4)
    assert client_forgotten == client_parts[0] and len(client_parts[0]) == 3
    other_seed = parse_config({**TINY_LLM, "scenario": "client", "seed": 7})
    assert author_partition(other_seed, authors, 4)[0] != client_parts
