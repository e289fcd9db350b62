"""End-to-end runs of the real ServerApp phases against the real ClientApp, in one process.

``InProcessGrid`` replaces only Ray and the SuperLink, so these tests exercise the production
path (hello, FedAvg, unlearning strategies, evaluation, continue, restore, report) in seconds.
"""

import json
import math
import os

import pytest

from server_app.experiment import Experiment
from server_app.inprocess import InProcessGrid
from strategies.common.federation import Federation, RoundFailed

TINY = {"pretrain-rounds": 2, "continue-rounds": 2, "local-epochs": 1, "mia-max-samples": 30,
        "fedup.epochs": 20, "lethe.rectify-rounds": 1, "lethe.restore-rounds": 1, "lethe.adapter-steps": 3,
        "guard.verify-passes": 0, "guard.restore-extra-rounds": 0}
ROBUST = {"recipe": "lethe-robust"}


def run(tmp_path, num_clients=4, fail_nodes=(), **overrides):
    config = {**TINY, "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out"), **overrides}
    grid = InProcessGrid(num_clients, config, fail_nodes=fail_nodes)
    fed = Federation(grid, round_timeout=60, min_reply_fraction=config.get("min-reply-fraction", 0.5))
    folder = Experiment(fed, config).run()
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle), folder, grid


def fractions_ok(entry):
    """Every figure of a model entry is a fraction or None (``test_acc_by_class``: each class's)."""
    values = [v for k, v in entry.items() if k not in ("equals_original", "test_acc_by_class")]
    values += entry.get("test_acc_by_class") or []
    return all(v is None or 0.0 <= v <= 1.0 for v in values)


def test_retrain_run_writes_the_results_contract(tmp_path):
    results, folder, _ = run(tmp_path, method="retrain", scenario="class")
    assert set(results) >= {"run", "models", "resurfacing", "cost"}
    assert results["run"]["method"] == "retrain" and results["run"]["num_clients"] == 4
    for name in ("original", "unlearned", "continued"):
        assert fractions_ok(results["models"][name])
    # the retrain oracle never saw the forgotten class
    assert results["models"]["unlearned"]["forget_acc"] == 0.0
    res = results["resurfacing"]
    assert len(res["kr_curve"]) == 2 and res["kr_unlearned"] == results["models"]["unlearned"]["forget_acc"]
    cost = results["cost"]
    assert cost["pretrain"]["rounds"] == 2 and cost["pretrain"]["bytes_up"] > 0 and cost["pretrain"]["bytes_down"] > 0
    assert cost["unlearn"] == {**cost["built"]["retrain"]}
    # the references are plain FedAvg: exactly their configured rounds, and nothing but the phase's cost
    assert cost["built"]["original"]["rounds"] == 2 and cost["built"]["retrain"]["rounds"] == 2
    assert cost["continue"]["rounds"] == TINY["continue-rounds"]
    for phase in ("pretrain", "retrain", "continue"):
        assert set(cost[phase]) == {"seconds", "rounds", "bytes_up", "bytes_down", "failures", "degraded"}
    assert os.path.getsize(os.path.join(folder, "kr_curve.png")) > 1000
    assert os.path.getsize(os.path.join(folder, "features_pca.png")) > 1000
    diagnostics = results["diagnostics"]
    assert len(diagnostics["rollback_tendency"]) == 2
    assert set(diagnostics["forgetting_dispersion"]) == {"original", "retrain", "unlearned"}
    assert all(v >= 0 for v in diagnostics["forgetting_dispersion"].values())
    csv_lines = open(tmp_path / "out" / "results.csv").read().splitlines()
    assert len(csv_lines) == 2 and csv_lines[0].startswith("time,task,method")


def test_second_run_reuses_the_cached_original(tmp_path):
    first, _, _ = run(tmp_path, method="none")
    second, _, grid = run(tmp_path, method="none")
    assert second["cost"]["pretrain"]["rounds"] == 0 and second["cost"]["pretrain"]["bytes_up"] == 0
    assert second["models"]["original"] == first["models"]["original"]
    assert second["cost"]["built"]["original"] == first["cost"]["built"]["original"]
    assert len(open(tmp_path / "out" / "results.csv").read().splitlines()) == 3


def test_failing_client_round_continues(tmp_path, caplog):
    results, _, _ = run(tmp_path, method="none", fail_nodes=[2])
    assert "node 1002 failed" in caplog.text
    assert results["cost"]["pretrain"]["rounds"] == 2


def test_too_many_failures_stop_naming_phase_and_round_and_cache_stays_clean(tmp_path):
    with pytest.raises(RoundFailed, match="phase 'pretrain' round 1: only 1 of 4 nodes replied"):
        run(tmp_path, method="none", fail_nodes=[0, 1, 2])
    assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").glob("*.pt"))


def test_corrupt_cache_entry_is_recomputed(tmp_path):
    run(tmp_path, method="none")
    for path in (tmp_path / "cache").glob("original-*.pt"):
        path.write_bytes(b"not a model")
    results, _, _ = run(tmp_path, method="none")
    assert results["cost"]["pretrain"]["rounds"] == 2


def test_fedup_is_one_round_and_restores_exactly(tmp_path):
    results, _, grid = run(tmp_path, method="fedup", scenario="class", **{"forget-class": 1})
    assert results["cost"]["unlearn"]["rounds"] == 1
    assert "query.centroids" in grid.sent_types
    restored = results["models"]["restored"]
    assert restored["equals_original"] is True
    assert {k: v for k, v in restored.items() if k != "equals_original"} == results["models"]["original"]
    assert results["method"]["privacy"]["clients"]
    # one evaluate round: original, unlearned, retrain, restored and the last continued model; every
    # earlier continued model is measured by the nodes that receive it in the next round
    assert results["cost"]["evaluate"]["rounds"] == 1 and grid.sent_types.count("evaluate") == 4
    assert len(results["resurfacing"]["kr_curve"]) == TINY["continue-rounds"]


def test_without_continued_rounds_the_continued_model_is_the_unlearned_one_evaluated_once(tmp_path):
    results, _, grid = run(tmp_path, method="fedup", scenario="class", **{"forget-class": 1, "continue-rounds": 0})
    assert results["models"]["continued"] == results["models"]["unlearned"]
    assert results["resurfacing"]["kr_curve"] == []
    assert results["cost"]["evaluate"]["rounds"] == 1 and grid.sent_types.count("evaluate") == 4


@pytest.mark.parametrize("plugins", ["frozen", "trained"])
def test_continued_training_keeps_a_methods_plugins_frozen_unless_asked_to_train_them(tmp_path, monkeypatch, plugins):
    """FedUP's filter is the method's removable artifact: by default continued rounds train the
    base only (scope ``base``) and every round's model carries the filter bit for bit;
    ``continue-plugins='trained'`` trains it with the base."""
    import torch

    from tasks.model import PLUGIN_PREFIX

    seen = []
    original = Experiment.continue_training

    def recording(self, start):
        outcome = original(self, start)
        seen.append((start.arrays.to_torch_state_dict(), outcome[2]))
        return outcome

    monkeypatch.setattr(Experiment, "continue_training", recording)
    results, _, grid = run(tmp_path, method="fedup", scenario="class",
                           **{"forget-class": 1, "continue-plugins": plugins})
    (start, states), = seen
    plugin_keys = [k for k in start if k.startswith(PLUGIN_PREFIX)]
    assert plugin_keys and len(states) == TINY["continue-rounds"]
    for state in states:
        assert state.keys() == start.keys()
        kept = [torch.equal(state[k], start[k]) for k in plugin_keys]
        assert all(kept) if plugins == "frozen" else not any(kept)
        assert any(not torch.equal(state[k], start[k]) for k in start if k not in plugin_keys)
    assert results["resurfacing"].get("diverged_at_round") is None


def test_continued_models_measured_inside_the_next_round_score_as_in_their_own_evaluate_round(tmp_path, monkeypatch):
    """Client scenario: the leaving client does not train in continued rounds, so it gets an evaluate
    message in the same exchange; the KR curve equals evaluate rounds of each round's model."""
    from server_app.evaluation import evaluate_models
    from strategies.common.base import ModelState
    from strategies.common.fedavg_rounds import RoleFedAvg

    rounds, models = 3, []
    original = RoleFedAvg.aggregate_train

    def recording(self, server_round, replies):
        arrays, metrics = original(self, server_round, replies)
        if self.fed.phase == "continue":
            models.append(arrays)
        return arrays, metrics

    monkeypatch.setattr(RoleFedAvg, "aggregate_train", recording)
    config = {**TINY, "method": "none", "scenario": "client", "poison": "backdoor", "continue-rounds": rounds,
              "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out")}
    grid = InProcessGrid(4, config)
    fed = Federation(grid, round_timeout=60, min_reply_fraction=0.5)
    experiment = Experiment(fed, config)
    with open(os.path.join(experiment.run(), "results.json")) as handle:
        results = json.load(handle)
    # the final round (4 nodes) + the leaving client in every continued round after the first
    assert grid.sent_types.count("evaluate") == 4 + (rounds - 1)
    separate = evaluate_models(fed, experiment.cfg, {str(i): ModelState(a, []) for i, a in enumerate(models)})
    assert results["resurfacing"]["kr_curve"] == [separate[str(i)]["forget_acc"] for i in range(rounds)]
    last = separate[str(rounds - 1)]
    assert {k: results["models"]["continued"][k] for k in last} == last


def test_lethe_runs_its_papers_three_phases_by_default(tmp_path):
    """``method='lethe'`` alone: amplify (1) + T rectify (1) + R FedAvg restore rounds (1), no guard;
    results say it ran the paper. The lethe-robust recipe's rectified restore also trains the forget
    clients and reports on restore's last model: one round more, more bytes up, another model."""
    paper, _, _ = run(tmp_path, method="lethe", scenario="client", poison="backdoor")
    assert paper["run"]["recipe"] == "paper" and paper["run"]["recipe_settings"] == {}
    assert "adapter_final_loss" in paper["method"] and len(paper["method"]["gamma_bounds"]) == 1
    assert paper["cost"]["unlearn"]["rounds"] == 3 and "carried_out" not in paper["method"]
    assert math.isfinite(paper["models"]["unlearned"]["test_acc"])
    robust, _, _ = run(tmp_path, method="lethe", scenario="client", poison="backdoor", **ROBUST)
    assert robust["run"]["recipe"] == "lethe-robust" and robust["run"]["recipe_settings"]["guard.stop-loss"] == 12.0
    assert "guard.verify-passes" not in robust["run"]["recipe_settings"]  # given explicitly (TINY): not the recipe's
    assert robust["cost"]["unlearn"]["rounds"] == 4
    assert paper["cost"]["unlearn"]["bytes_up"] < robust["cost"]["unlearn"]["bytes_up"]
    assert paper["models"]["unlearned"] != robust["models"]["unlearned"]


def test_lethe_never_returns_the_retrain_model(tmp_path):
    """4 clients at alpha 0.5, client scenario: the leaving client holds 0.90 of class 8's training samples.
    Lethe, paper or recipe, rectifies and reports its own model; nothing of retrain's is substituted."""
    retrain, _, _ = run(tmp_path, method="retrain", scenario="client", poison="backdoor")
    for extra in ({}, ROBUST):
        lethe, _, _ = run(tmp_path, method="lethe", scenario="client", poison="backdoor", **extra)
        assert "exact_fallback" not in lethe["method"] and len(lethe["method"]["gamma_bounds"]) == 1
        assert lethe["models"]["unlearned"] != retrain["models"]["unlearned"]
        assert lethe["cost"]["unlearn"] != retrain["cost"]["unlearn"]


def test_lethes_client_forget_stream_is_all_the_leaving_clients_data(tmp_path, monkeypatch):
    """Every train message of Lethe's forget stream asks the leaving client for all its training data
    (``forget-all-data``, the paper's client-level stream): amplify and rectify in the paper; restore
    and the reports on its model too with the recipe's rectified restore."""
    flags = []
    send = InProcessGrid.send_and_receive

    def recording(self, messages, **kwargs):
        messages = list(messages)
        flags.extend(m.content["config"].get("forget-all-data", False) for m in messages
                     if m.metadata.message_type == "train" and str(m.content["config"]["role"]).startswith("forget"))
        return send(self, messages, **kwargs)

    monkeypatch.setattr(InProcessGrid, "send_and_receive", recording)
    run(tmp_path, method="lethe", scenario="client", poison="backdoor")
    assert len(flags) == 2 and all(flags)
    flags.clear()
    run(tmp_path, method="lethe", scenario="client", poison="backdoor", **ROBUST)
    assert len(flags) == 4 and all(flags)
    flags.clear()
    run(tmp_path, method="lethe", scenario="sample")
    assert len(flags) == 2 and not any(flags)


def test_lethe_checks_its_restored_model_at_the_forget_clients_and_passes_again_while_it_knows(tmp_path):
    """With no rectify and no restore round a pass changes nothing: the forget clients' check finds the
    class still known, a second pass runs from the first one's model, and the check equals the
    server's own forget accuracy of the kept model (the same data, measured at the nodes). The
    request is left undone, so a second attempt with the looser walk-back runs; it changes nothing
    either and is not kept."""
    results, _, _ = run(tmp_path, method="lethe", scenario="class", **ROBUST,
                        **{"guard.verify-passes": 1, "lethe.rectify-rounds": 0, "lethe.restore-rounds": 0,
                           "continue-rounds": 1})
    details, unlearned = results["method"], results["models"]["unlearned"]
    checks = details["forget_checks"]
    assert [c["known"] for c in checks] == [True, True] and len(details["passes"]) == 1
    assert checks[0]["bound"] == 0.02 and checks[0]["forget_n"] > 0
    assert details["kept_pass"] == 1  # both still know it equally: the earlier is kept
    assert checks[0]["forget_acc"] == pytest.approx(unlearned["forget_acc"]) and unlearned["forget_acc"] > 0.5
    assert details["retry"]["backbone_rise"] == 2.0 and details["retry"]["kept"] is False
    assert details["carried_out"] is False  # reported as such, with Lethe's own model
    assert results["cost"]["unlearn"]["rounds"] == 4  # each pass's amplify round, in both attempts


def test_lethe_sends_one_message_to_a_client_holding_both_roles(tmp_path):
    """Class scenario: every client holds forget and retained data, so each rectify or restore round
    is one download per client (two uploads), not two exchanges."""
    results, _, _ = run(tmp_path, method="lethe", scenario="class", **ROBUST, **{"guard.stop-loss": float("inf")})
    cost = results["cost"]["unlearn"]
    assert cost["rounds"] == 4
    model_bytes = results["cost"]["pretrain"]["bytes_down"] / (TINY["pretrain-rounds"] * 4)
    # amplify sends the composite once to each of the 4 clients, rectify, restore and the reports on
    # restore's last model once more each
    assert 4 * 4 * model_bytes <= cost["bytes_down"] < 4.5 * 4 * model_bytes
    assert cost["bytes_up"] > 2 * 2 * 4 * 0.9 * model_bytes


def test_the_recipes_class_scenario_takes_its_own_step_settings(tmp_path):
    """lethe-robust's [scenario.class] sets lethe.lr 0.02 (its [settings] 0.01); an explicit lethe.lr wins."""
    common = {"method": "lethe", "scenario": "class", "guard.stop-loss": float("inf"), "lethe.restore-rounds": 0,
              **ROBUST}
    default, _, _ = run(tmp_path, **common)
    assert default["run"]["recipe_settings"]["lethe.lr"] == 0.02
    same_lr, _, _ = run(tmp_path, **common, **{"lethe.lr": 0.02})
    other_lr, _, _ = run(tmp_path, **common, **{"lethe.lr": 0.5})
    assert same_lr["models"]["unlearned"] == default["models"]["unlearned"]
    assert other_lr["models"]["unlearned"] != default["models"]["unlearned"]


def test_lethe_rectification_stops_once_the_forget_loss_is_reached(tmp_path):
    results, _, _ = run(tmp_path, method="lethe", scenario="client", poison="backdoor", **ROBUST,
                        **{"lethe.rectify-rounds": 3, "guard.stop-loss": 1e-6})
    history = results["method"]["gamma_bounds"]
    assert len(history) == 1 and history[0]["stopped"] is True and history[0]["forget_loss"] >= 1e-6
    # amplify (1) + the stopping round, forget clients only (1) + restore (1) + reports on its model (1),
    # not 3 rectify rounds
    assert results["cost"]["unlearn"]["rounds"] == 4
    unlimited, _, _ = run(tmp_path, method="lethe", scenario="client", poison="backdoor", **ROBUST,
                          **{"lethe.rectify-rounds": 2, "guard.stop-loss": float("inf")})
    assert [("stopped" in h) for h in unlimited["method"]["gamma_bounds"]] == [False, False]
    assert all(h["forget_loss"] >= 0 for h in unlimited["method"]["gamma_bounds"])


def test_lethe_stops_clearly_when_the_forget_client_fails(tmp_path):
    with pytest.raises(RoundFailed, match="phase 'unlearn' round 1"):
        run(tmp_path, method="lethe", scenario="client", poison="backdoor", **{"forget-client": 1},
            fail_nodes=[1])


def test_the_gradient_clip_reaches_local_training_and_keys_the_cached_models(tmp_path):
    """``max-grad-norm`` is what the clients' cross-entropy rounds clip at: a clip far below the
    gradients trains another original than the default, which the cache does not hand back."""
    default, _, _ = run(tmp_path, method="retrain", scenario="class")
    tight, _, _ = run(tmp_path, method="retrain", scenario="class", **{"max-grad-norm": 1e-3})
    assert tight["cost"]["pretrain"]["rounds"] == 2  # trained, not the default's cached original
    assert tight["models"]["original"]["test_acc"] != default["models"]["original"]["test_acc"]


def test_a_cosine_lr_schedule_steps_down_over_the_rounds_that_build_the_original_and_the_oracle(tmp_path, monkeypatch):
    """Round r of R gets lr (1 + cos(pi (r - 1) / R)) / 2; continued rounds keep the run's lr; the
    scheduled original is cached apart from the constant one."""
    from strategies.common.fedavg_rounds import RoleFedAvg

    sent = []
    configure = RoleFedAvg.configure_train

    def recording(self, server_round, arrays, config, grid):
        sent.append((self.fed.phase, server_round, float(config["lr"])))
        return configure(self, server_round, arrays, config, grid)

    monkeypatch.setattr(RoleFedAvg, "configure_train", recording)
    run(tmp_path, method="retrain", scenario="class")
    constant = list(sent)
    sent.clear()
    run(tmp_path, method="retrain", scenario="class", **{"lr-schedule": "cosine"})
    lr = 0.05
    assert [s for s in constant if s[0] in ("pretrain", "retrain")] == [
        ("pretrain", 1, lr), ("pretrain", 2, lr), ("retrain", 1, lr), ("retrain", 2, lr)]
    assert [s for s in sent if s[0] in ("pretrain", "retrain")] == [
        ("pretrain", 1, lr), ("pretrain", 2, pytest.approx(lr / 2)), ("retrain", 1, lr), ("retrain", 2, pytest.approx(lr / 2))]
    assert [s[2] for s in sent if s[0] == "continue"] == [lr] * TINY["continue-rounds"]


def test_init_seed_draws_other_models_from_the_same_data_and_request(tmp_path):
    """``init-seed`` changes only the starting weights: the same clients, counts and forget data, other
    original and retrain models, cached apart; ``init-seed`` equal to ``seed`` is the default run."""
    from server_app import cache
    from strategies.run_config import parse_config

    default, _, _ = run(tmp_path, method="retrain", scenario="class")
    drawn, _, _ = run(tmp_path, method="retrain", scenario="class", **{"init-seed": 7})
    same, _, grid = run(tmp_path, method="retrain", scenario="class", **{"init-seed": 42})
    assert drawn["run"]["forget_clients"] == default["run"]["forget_clients"]
    assert drawn["run"]["config"]["init-seed"] == 7 and (drawn["run"]["init_seed"], default["run"]["init_seed"]) == (7, 42)
    import csv
    rows = list(csv.DictReader(open(tmp_path / "out" / "results.csv")))
    assert [r["init_seed"] for r in rows] == ["42", "7", "42"] and {r["seed"] for r in rows} == {"42"}
    for model in ("original", "unlearned"):
        assert drawn["models"][model]["test_acc"] != default["models"][model]["test_acc"] or \
            drawn["models"][model]["retain_acc"] != default["models"][model]["retain_acc"]
        assert same["models"][model] == default["models"][model]
    assert same["cost"]["pretrain"]["rounds"] == 0  # seed 42's own models, from the cache
    cfg = parse_config({**TINY, "init-seed": 7})
    assert cache.model_key("original", cfg, [], "d") != cache.model_key("original", parse_config(TINY), [], "d")
    assert cache.model_key("original", parse_config({**TINY, "init-seed": 42}), [], "d") == \
        cache.model_key("original", parse_config(TINY), [], "d")


def test_without_the_retrain_oracle_the_run_gives_the_rest_and_lists_what_it_cannot(tmp_path):
    """``retrain-oracle=false``: no retrain round is played, KR against retrain and RR are null and
    listed in ``validity.missing`` with the reason; the other figures are there."""
    results, _, _ = run(tmp_path, method="fedup", scenario="class", **{"retrain-oracle": False})
    assert results["cost"]["retrain"]["rounds"] == 0 and results["cost"]["retrain"]["bytes_down"] == 0
    assert results["resurfacing"]["kr_retrain"] is None and results["resurfacing"]["rr"] is None
    assert results["resurfacing"]["ct_kr"] is not None and fractions_ok(results["models"]["unlearned"])
    missing = {m["figure"] for m in results["validity"]["missing"]}
    assert {"resurfacing.kr_retrain", "resurfacing.rr"} <= missing
    assert results["validity"]["checks"]["original_learned"] is None
    assert not list((tmp_path / "cache").glob("retrain-*"))


def test_the_serverapp_reads_the_keys_the_user_set_from_the_run_and_hello_tells_the_nodes(tmp_path, monkeypatch):
    """``flwr run`` keeps the user's ``--run-config`` on the run (``grid.run.override_config``) beside
    the full run config; the ServerApp parses with those keys and hello carries them to the nodes."""
    from types import SimpleNamespace

    from client_app.state import GIVEN_KEYS
    from server_app.app import user_keys

    grid = SimpleNamespace(run=SimpleNamespace(override_config={"continue-rounds": 10, "lethe.gamma": 0.5}))
    assert user_keys(grid) == {"continue-rounds", "lethe.gamma"}
    assert user_keys(SimpleNamespace(run=None)) is None

    class Sent(Exception):
        pass

    def hello(self, config):
        raise Sent(dict(config))

    monkeypatch.setattr(Federation, "hello", hello)
    run = {"continue-rounds": 10, "cache-dir": str(tmp_path / "c"), "outputs-dir": str(tmp_path / "o")}
    for given, told in ((set(run), {GIVEN_KEYS: "cache-dir continue-rounds outputs-dir"}), (None, {})):
        experiment = Experiment(Federation(InProcessGrid(3, run), round_timeout=60, min_reply_fraction=0.5), run,
                                given=given)
        assert experiment.cfg["continue-rounds"] == 10
        with pytest.raises(Sent) as sent:
            experiment.setup()
        assert sent.value.args[0] == told
