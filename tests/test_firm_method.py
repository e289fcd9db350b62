"""FIRM and the merge baselines as methods of the app: the ``query.fisher`` handler, in-process runs on the
tiny LLM task (one shared cached original), config errors, a missing or malformed forget upload.

The end-to-end runs use ``test_llm_experiment``'s tiny setting (8 authors x 3 QA, 4 clients, forget
authors on client 0). FIRM runs with a small finite epsilon so that its projection is active.
"""

import json
import math
import os

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from test_llm_experiment import LLM_KEYS, TINY_LLM, adapter_bytes

from client_app.app import app
from core.config import ConfigError
from server_app.experiment import Experiment
from server_app.inprocess import NODE_OFFSET, InProcessGrid
from strategies.common.federation import Federation, RoundFailed, RunStopped
from strategies.run_config import parse_config
from tasks.llm.federation_model import task_llm

EPSILON = 1e-6
PER_TENSOR, PER_MESSAGE = 300, 1000  # record metadata per tensor; config and metrics (as test_llm_experiment)


class CorruptingGrid(InProcessGrid):
    """Replaces one entry of the Fisher that client ``corrupt`` uploads with NaN (a malformed upload)."""

    def __init__(self, num_clients, run_config, corrupt):
        super().__init__(num_clients, run_config)
        self.corrupt = corrupt

    def send_and_receive(self, messages, *, timeout=None):
        replies = super().send_and_receive(messages, timeout=timeout)
        for reply in replies:
            meta = reply.metadata
            if meta.message_type == "query.fisher" and meta.src_node_id == NODE_OFFSET + self.corrupt:
                fisher = reply.content["fisher"].to_torch_state_dict()
                fisher[next(iter(fisher))][0, 0] = math.nan
                reply.content["fisher"] = ArrayRecord(fisher)
        return replies


def run(cache, out, grid=None, **overrides):
    config = {**TINY_LLM, "cache-dir": str(cache), "outputs-dir": str(out), "continue-rounds": 0, **overrides}
    grid = grid(config) if grid else InProcessGrid(4, config)
    folder = Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle)


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return tmp_path_factory.mktemp("firm-method")


@pytest.fixture(scope="module")
def runs(work):
    cache, out = work / "cache", work / "out"
    return {
        "firm": run(cache, out, method="firm", **{"firm.epsilon": EPSILON, "continue-rounds": 1}),
        "sum": run(cache, out, method="sum"),
        "ties": run(cache, out, method="ties"),
        "fulm": run(cache, out, method="fulm"),
        # client 3's upload carries a NaN Fisher entry: dropped, the merge goes on without it
        "avg": run(cache, out, method="avg", grid=lambda config: CorruptingGrid(4, config, corrupt=3)),
    }


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("method", ["firm", "sum", "ties", "fulm", "avg"])
def test_one_round_merge_runs_through_the_phases(runs, method):
    results = runs[method]
    details, cost = results["method"], results["cost"]["unlearn"]
    assert results["run"]["method"] == method and details["method"] == method and details["space"] == "lora"
    original, unlearned = results["models"]["original"], results["models"]["unlearned"]
    assert original == runs["sum"]["models"]["original"]  # one cached original for every method
    for entry in (original, unlearned, results["models"]["continued"]):
        assert all(entry[key] is not None and 0.0 <= entry[key] <= 1.0 for key in LLM_KEYS)
    # the forget client's ascent is in every merge: the forget answers get less likely
    assert unlearned["forget_prob"] < original["forget_prob"] and details["merged_norm"] > 0
    # one query.fisher round: the adapter down, task vector + Fisher (two adapters) up, per asked client
    size, tensors = adapter_bytes()
    asked = details["asked"]["forget"] + details["asked"].get("retain", [])
    assert cost["rounds"] == 1 and asked == ([0] if method in ("sum", "ties") else [0, 1, 2, 3])
    n = len(asked)
    assert n * size <= cost["bytes_down"] <= n * (size + PER_TENSOR * tensors + PER_MESSAGE)
    assert 2 * n * size <= cost["bytes_up"] <= 2 * n * (size + PER_TENSOR * tensors + PER_MESSAGE)


def test_firm_projection_is_certified_and_binding(runs):
    details = runs["firm"]["method"]
    assert details["settings"]["epsilon"] == EPSILON and details["used"] == [0, 1, 2, 3] and not details["dropped"]
    tensors = details["tensors"]
    adapter_keys = set(task_llm(parse_config(TINY_LLM))[2])
    assert set(tensors) == adapter_keys and any("lora_A" in k for k in tensors) and any("lora_B" in k for k in tensors)
    assert details["max_kkt_residual"] <= 1e-6 and details["active_constraints"] > 0
    for report in tensors.values():
        assert len(report["lambdas"]) == 3  # one constraint per retain client
        assert all(value <= 1e-6 for value in report["residuals"].values())
        assert all(damage <= EPSILON * (1 + 1e-6) for damage in report["damages"])
        assert report["merged_norm"] <= report["base_norm"] * (1 + 1e-6)
    assert len(runs["firm"]["resurfacing"]["kr_curve"]) == 1  # the merged adapter trains on as any other


def test_baselines_use_their_roles_and_settings(runs):
    assert runs["sum"]["method"]["used"] == [0] and runs["sum"]["method"]["settings"] == {"scale": 1.0}
    assert runs["ties"]["method"]["settings"] == {"scale": 1.0, "density": 0.2}
    assert runs["fulm"]["method"]["settings"] == {"scale": 1.0, "threshold": 0.6, "density": 0.3}
    assert runs["fulm"]["method"]["used"] == [0, 1, 2, 3]
    # one forget vector: TIES keeps its top 20 % per tensor, SUM all of it
    assert runs["ties"]["method"]["merged_norm"] < runs["sum"]["method"]["merged_norm"]


def test_malformed_upload_is_dropped_and_the_merge_goes_on(runs):
    details = runs["avg"]["method"]
    assert details["used"] == [0, 1, 2] and list(details["dropped"]) == ["3"]
    assert "NaN" in details["dropped"]["3"] or "finite" in details["dropped"]["3"]


def test_missing_forget_client_ends_the_phase(work):
    config = {**TINY_LLM, "method": "firm", "cache-dir": str(work / "cache"), "outputs-dir": str(work / "out")}
    grid = InProcessGrid(4, config, fail_nodes=[0], fail_types=["query.fisher"])
    with pytest.raises(RoundFailed, match=r"phase 'unlearn' round 1: only 0 of 1 nodes replied"):
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()


def test_no_well_formed_forget_upload_stops_the_run_in_one_line(work):
    config = {**TINY_LLM, "method": "sum", "cache-dir": str(work / "cache"), "outputs-dir": str(work / "out")}
    grid = CorruptingGrid(4, config, corrupt=0)
    with pytest.raises(RunStopped) as err:
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    assert "sum: FIRM needs at least one well-formed forget upload" in str(err.value) and "\n" not in str(err.value)


# ----------------------------------------------------------------------------- the handler


def _fisher_query(adapter, role="forget", objective="ascent", pid=0, run=TINY_LLM):
    InProcessGrid(4, run)  # sets Flower's task identity for the messages below
    config = {"role": role, "objective": objective, "server-round": 1, "llm-epochs": 1, "llm.lr": 1e-3,
              "fisher-batches": 4}
    message = Message(RecordDict({"arrays": ArrayRecord(adapter), "config": ConfigRecord(config)}),
                      dst_node_id=NODE_OFFSET + pid, message_type="query.fisher")
    context = Context(run_id=1, node_id=NODE_OFFSET + pid, state=RecordDict(), run_config=run,
                      node_config={"partition-id": pid, "num-partitions": 4})
    return app(message, context), context


@pytest.fixture(scope="module")
def trained_adapter():
    """The run's adapter with a non-zero B, as after federated training."""
    fresh = task_llm(parse_config(TINY_LLM))[2]
    generator = torch.Generator().manual_seed(0)
    return {k: (0.05 * torch.randn(v.shape, generator=generator) if "lora_B" in k else v.clone())
            for k, v in fresh.items()}


def test_fisher_handler_returns_the_adapters_keys_and_a_valid_fisher(trained_adapter):
    reply, _ = _fisher_query(trained_adapter)
    fisher = reply.content["fisher"].to_torch_state_dict()
    vector = reply.content["task-vector"].to_torch_state_dict()
    assert set(fisher) == set(vector) == set(trained_adapter)
    for key, tensor in fisher.items():
        assert tensor.shape == trained_adapter[key].shape
        assert bool(torch.isfinite(tensor).all()) and bool((tensor >= 0).all())
        assert float(tensor.sum()) > 0, key  # B != 0: A's Fisher is not zero either
    assert reply.content["metrics"]["num-examples"] == 6  # client 0 holds the 2 forget authors x 3 QA


def test_fisher_at_a_fresh_adapter_vanishes_on_A():
    fresh = task_llm(parse_config(TINY_LLM))[2]
    fisher = _fisher_query(fresh, role="retain", objective="ce", pid=1)[0].content["fisher"].to_torch_state_dict()
    assert all(float(t.abs().sum()) == 0 for k, t in fisher.items() if "lora_A" in k)
    assert all(float(t.sum()) > 0 for k, t in fisher.items() if "lora_B" in k)


def test_forget_task_vector_is_the_ga_update(trained_adapter):
    reply, context = _fisher_query(trained_adapter)
    vector = reply.content["task-vector"].to_torch_state_dict()
    config = ConfigRecord({"role": "forget", "objective": "ascent", "server-round": 1, "llm-epochs": 1,
                           "llm.lr": 1e-3})
    train = Message(RecordDict({"arrays": ArrayRecord(trained_adapter), "config": config}),
                    dst_node_id=NODE_OFFSET, message_type="train")
    trained = app(train, context).content["arrays"].to_torch_state_dict()
    assert any(float(v.abs().max()) > 0 for v in vector.values())
    for key, value in vector.items():
        torch.testing.assert_close(value, trained[key] - trained_adapter[key], rtol=0, atol=1e-7)


def test_fisher_query_on_a_vision_task_is_refused():
    run = {"scenario": "client", "forget-client": 1}
    with pytest.raises(ValueError, match="query.fisher of method firm needs a task of kind llm"):
        _fisher_query({}, run=run)


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize("overrides,fragment", [
    ({"firm.alpha": 0.0}, "'firm.alpha'=0.0 is not allowed: must be in (0, 1]"),
    ({"firm.alpha": 1.5}, "'firm.alpha'=1.5"),
    ({"firm.eps0": 0.0}, "'firm.eps0'=0.0 is not allowed: must be > 0 and finite"),
    ({"firm.epsilon": 0.0}, "'firm.epsilon'=0.0 is not allowed: must be > 0"),
    ({"firm.gamma": -1.0}, "'firm.gamma'=-1.0 is not allowed: must be >= 0 and finite"),
    ({"firm.gamma": math.inf}, "'firm.gamma'=inf"),
    ({"firm.forget-objective": "npo"}, "must be one of ascent, rmu"),
    ({"firm.fisher-batches": 0}, "'firm.fisher-batches'=0"),
    ({"sum.scale": 0.0}, "'sum.scale'=0.0"),
    ({"avg.scale": math.inf}, "'avg.scale'=inf"),
    ({"ties.density": 0.0}, "'ties.density'=0.0"),
    ({"fulm.threshold": 1.5}, "'fulm.threshold'=1.5 is not allowed: must be in [-1, 1]"),
])
def test_bad_firm_config_is_one_line(overrides, fragment):
    with pytest.raises(ConfigError) as err:
        parse_config({**TINY_LLM, "method": "firm", **overrides})
    assert fragment in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("method", ["firm", "avg", "sum", "ties", "fulm"])
def test_merge_methods_need_the_llm_task(method):
    with pytest.raises(ConfigError) as err:
        parse_config({"method": method})
    assert f"'method'='{method}' needs a task of kind llm (llm-tofu, " in str(err.value) and "\n" not in str(err.value)
    assert parse_config({**TINY_LLM, "method": method})["method"] == method
