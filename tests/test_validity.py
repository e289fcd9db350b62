"""No non-finite or degenerate model is scored silently: the pure checks (``tasks.validity``), the
phase check after every aggregation (``run_rounds``), and a continued training that diverges,
end to end in process (its curve ends at the round, CT-KR and RR are null and flagged)."""

import csv
import json
import math
import os

import pytest
import torch
from flwr.app import ArrayRecord

from server_app.experiment import Experiment
from server_app.inprocess import InProcessGrid
from strategies.common.fedavg_rounds import ModelDiverged, RoleFedAvg, require_finite
from strategies.common.federation import Federation
from tasks.validity import nonfinite_tensors, validity

GOOD_ORIGINAL = {"test_acc": 0.93, "forget_acc": 0.66}
RETRAIN = {"test_acc": 0.95, "forget_acc": 0.07}


def test_nonfinite_tensors_names_float_tensors_with_nan_or_inf():
    state = {"a": torch.ones(2), "b": torch.tensor([1.0, math.nan]), "c": torch.tensor([math.inf]),
             "n": torch.tensor([3])}
    assert nonfinite_tensors(state) == ["b", "c"]
    assert nonfinite_tensors({"a": torch.zeros(3)}) == []


def test_a_healthy_run_passes_every_check():
    block = validity(original=GOOD_ORIGINAL, unlearned={"test_acc": 0.94}, retrain=RETRAIN, num_classes=10)
    assert block["failed"] == [] and block["reasons"] == [] and block["original_valid"] is True
    assert all(block["checks"].values())


def test_without_the_retrain_oracle_its_checks_are_not_made_and_the_missing_figures_are_listed():
    """No oracle: the checks against it are None (neither passed nor failed), the others still judge,
    and ``missing`` names KR against retrain and RR with the reason."""
    block = validity(original={"test_acc": 0.41, "forget_acc": 0.0}, unlearned={"test_acc": 0.3}, retrain=None,
                     num_classes=10)
    assert block["checks"]["retrain_usable"] is None and block["checks"]["original_learned"] is None
    assert block["failed"] == ["original_usable"] and block["original_valid"] is False
    figures = [m["figure"] for m in block["missing"]]
    assert "resurfacing.kr_retrain" in figures and "resurfacing.rr" in figures
    assert all("retrain-oracle=false" in m["reason"] for m in block["missing"])
    assert validity(original=GOOD_ORIGINAL, unlearned=None, retrain=RETRAIN, num_classes=10)["missing"] == []


@pytest.mark.parametrize("original, failed", [
    ({"test_acc": 0.081, "forget_acc": 0.0}, ["original_usable", "original_learned"]),  # the dead original
    ({"test_acc": 0.41, "forget_acc": 0.9}, ["original_usable"]),  # below 0.5
    ({"test_acc": 0.80, "forget_acc": 0.9}, ["original_usable"]),  # > 0.10 below retrain's 0.95
    ({"test_acc": 0.93, "forget_acc": 0.2}, ["original_learned"]),  # 0.13 above retrain's KR, not 0.2
])
def test_a_degenerate_original_is_flagged_with_a_reason_per_check(original, failed):
    block = validity(original=original, unlearned={"test_acc": 0.94}, retrain=RETRAIN, num_classes=10)
    assert block["failed"] == failed and block["original_valid"] is False
    assert len(block["reasons"]) == len(failed) and all("\n" not in r for r in block["reasons"])


def test_an_unusable_originals_reason_names_only_the_conditions_that_failed():
    """0.643 is above the 0.5 floor: its line must not read "0.643 is below 0.500"."""
    drop = validity(original={"test_acc": 0.643, "forget_acc": 0.9}, unlearned=None,
                    retrain={"test_acc": 0.95, "forget_acc": 0.0}, num_classes=10)["reasons"][0]
    assert drop == "the original model's test accuracy 0.643 is more than 0.1 below retrain's 0.950"
    floor = validity(original={"test_acc": 0.394, "forget_acc": 0.9}, unlearned=None,
                     retrain={"test_acc": 0.45, "forget_acc": 0.0}, num_classes=10)["reasons"][0]
    assert floor == "the original model's test accuracy 0.394 is below max(2/classes, 0.5) = 0.500"
    both = validity(original={"test_acc": 0.394, "forget_acc": 0.9}, unlearned=None,
                    retrain={"test_acc": 0.593, "forget_acc": 0.0}, num_classes=10)["reasons"][0]
    assert both == ("the original model's test accuracy 0.394 is below max(2/classes, 0.5) = 0.500 and is more "
                    "than 0.1 below retrain's 0.593")
    nan = validity(original={"test_acc": float("nan"), "forget_acc": 0.9}, unlearned={"test_acc": float("nan")},
                   retrain={"test_acc": 0.95, "forget_acc": 0.0}, num_classes=10)["reasons"]
    assert nan[0] == "the original model's test accuracy nan is not a number"
    assert nan[-1] == "the unlearned model's test accuracy nan is not a number"


def test_a_collapsed_retrain_reference_invalidates_the_cell():
    block = validity(original=GOOD_ORIGINAL, unlearned={"test_acc": 0.91}, retrain={"test_acc": 0.111, "forget_acc": 0.0},
                     num_classes=10)
    assert block["failed"] == ["retrain_usable"] and block["original_valid"] is False


@pytest.mark.parametrize("retrain_fit, failed", [(0.744, ["retrain_usable"]), (0.95, [])])
def test_a_retrain_that_does_not_fit_its_own_training_data_invalidates_the_cell(retrain_fit, failed):
    """Seed 221 (10 clients alpha 0.5, sample): the oracle fit the retained data at 0.744 against the
    original's 0.999, its test accuracy 0.750 above the floor; 0.95 is within 0.10 of the original."""
    original = {**GOOD_ORIGINAL, "retain_acc": 0.999}
    block = validity(original=original, unlearned={"test_acc": 0.94}, retrain={**RETRAIN, "test_acc": 0.75,
                     "retain_acc": retrain_fit}, num_classes=10)
    assert block["failed"] == failed and block["original_valid"] is (not failed)
    assert block["bounds"]["retrain_max_fit_drop"] == 0.10
    if failed:
        assert "retained accuracy 0.744" in block["reasons"][0] and "original (0.999)" in block["reasons"][0]


def test_a_retrain_far_below_the_original_on_test_data_alone_is_a_reference():
    """A leaving client that held most of a class takes it out of retrain: its test accuracy may fall
    far below the original's while it still fits its own training data."""
    block = validity(original={"test_acc": 0.975, "forget_acc": 1.0, "retain_acc": 0.999}, unlearned=None,
                     retrain={"test_acc": 0.772, "forget_acc": 0.007, "retain_acc": 0.996}, num_classes=10)
    assert block["failed"] == [] and block["original_valid"] is True


def test_chance_bound_is_twice_chance_when_that_is_higher():
    # 3 classes: 2/3 > 0.5, so 0.6 is not usable there although it is for 10 classes
    three = validity(original={"test_acc": 0.6, "forget_acc": 0.9}, unlearned=None,
                     retrain={"test_acc": 0.62, "forget_acc": 0.0}, num_classes=3)
    ten = validity(original={"test_acc": 0.6, "forget_acc": 0.9}, unlearned=None,
                   retrain={"test_acc": 0.62, "forget_acc": 0.0}, num_classes=10)
    assert "original_usable" in three["failed"] and ten["failed"] == []
    assert three["bounds"]["original_min_acc"] == pytest.approx(2 / 3)


def test_method_outcome_checks_do_not_invalidate_the_cell():
    block = validity(original=GOOD_ORIGINAL, unlearned={"test_acc": 0.112}, retrain=RETRAIN, num_classes=10,
                     diverged_at_round=3)
    assert block["failed"] == ["unlearned_utility", "continued_finite"] and block["original_valid"] is True
    assert "round 3" in block["reasons"][1]
    nan_model = validity(original=GOOD_ORIGINAL, unlearned={"test_acc": math.nan}, retrain=RETRAIN, num_classes=10)
    assert nan_model["failed"] == ["unlearned_utility"]
    broken = validity(original={"test_acc": math.nan, "forget_acc": math.nan}, unlearned=None, retrain=RETRAIN,
                      num_classes=10, original_finite=False)
    assert broken["failed"][:1] == ["original_finite"] and not broken["original_valid"]


def test_llm_entries_use_utility_and_no_chance_bound():
    block = validity(original={"test_acc": math.nan, "utility": 0.4, "forget_acc": 0.9}, unlearned={"utility": 0.38},
                     retrain={"test_acc": math.nan, "utility": 0.42, "forget_acc": 0.1}, num_classes=0)
    assert block["failed"] == [] and block["bounds"]["original_min_acc"] is None
    # no classes, no fit check: the retained-fact accuracy of an LLM oracle is not held to the original's
    loose = validity(original={"utility": 0.4, "forget_acc": 0.9, "retain_acc": 0.9}, unlearned=None,
                     retrain={"utility": 0.42, "forget_acc": 0.1, "retain_acc": 0.5}, num_classes=0)
    assert loose["failed"] == [] and loose["bounds"]["retrain_max_fit_drop"] is None
    forgot_nothing = validity(original={"utility": 0.4, "forget_acc": 0.2}, unlearned=None,
                              retrain={"utility": 0.42, "forget_acc": 0.1}, num_classes=0)
    assert forgot_nothing["failed"] == ["original_learned"]


def test_require_finite_names_phase_round_and_method():
    good = ArrayRecord({"w": torch.ones(2)})
    require_finite(good, phase="continue", round_no=1, method="fedup")
    with pytest.raises(ModelDiverged, match=r"phase 'continue' round 3 \(method 'fedup'\): .*'w'") as info:
        require_finite(ArrayRecord({"w": torch.tensor([math.nan, 1.0])}), phase="continue", round_no=3,
                       method="fedup", last_finite=good)
    assert info.value.round_no == 3 and info.value.last_finite is good


TINY = {"pretrain-rounds": 2, "continue-rounds": 3, "local-epochs": 1, "mia-max-samples": 30,
        "diagnostic-samples": 0}


def run(tmp_path, **overrides):
    config = {**TINY, "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out"), **overrides}
    fed = Federation(InProcessGrid(3, config), round_timeout=60, min_reply_fraction=0.5)
    folder = Experiment(fed, config).run()
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle)


def test_a_non_finite_pretraining_stops_naming_the_phase_and_is_not_cached(tmp_path):
    with pytest.raises(ModelDiverged, match=r"phase 'pretrain' round 1 \(method 'none'\): the model has non-finite"):
        run(tmp_path, method="none", lr=1e30)
    assert not list((tmp_path / "cache").glob("*.pt")) if (tmp_path / "cache").exists() else True


def test_diverged_continued_training_ends_the_curve_and_is_flagged(tmp_path, monkeypatch, caplog):
    """Round 2 of continued training aggregates to NaN: the KR curve holds round 1 only, CT-KR and RR
    are null, results.json marks the round and the CSV's validity column names the failed check."""
    original = RoleFedAvg.aggregate_train

    def poisoned(self, server_round, replies):
        arrays, metrics = original(self, server_round, replies)
        if self.fed.phase == "continue" and server_round == 2:
            arrays = ArrayRecord({k: torch.full_like(v, math.nan) if v.is_floating_point() else v
                                  for k, v in arrays.to_torch_state_dict().items()})
        return arrays, metrics

    monkeypatch.setattr(RoleFedAvg, "aggregate_train", poisoned)
    results = run(tmp_path, method="none", scenario="class")
    res = results["resurfacing"]
    assert res["diverged_at_round"] == 2 and len(res["kr_curve"]) == 1
    assert res["ct_kr"] is None and res["rr"] is None
    assert results["models"]["continued"] == {"diverged_at_round": 2}
    assert "continued_finite" in results["validity"]["failed"]
    assert "validity: phase 'continue' round 2 (method 'none')" in caplog.text
    with open(tmp_path / "out" / "results.csv", newline="") as handle:
        row = next(csv.DictReader(handle))
    assert "continued_finite" in row["validity_failed"]
    assert row["ct_kr"] in ("", "nan") and row["rr"] in ("", "nan")  # no number from the dead model


def test_a_dead_round_is_kept_and_flagged_never_played_again(tmp_path, monkeypatch):
    """The references are plain FedAvg: a pretraining round whose aggregated model is a dead network (its
    last hidden ReLU layer zeroed) is played once, its model is the original, and the validity block
    flags that original; every phase trains exactly its configured rounds at the run's lr."""
    original_aggregate, original_configure = RoleFedAvg.aggregate_train, RoleFedAvg.configure_train
    plays: dict[tuple[str, int], list[float]] = {}

    def configure(self, server_round, arrays, config, grid):
        plays.setdefault((self.fed.phase, server_round), []).append(float(config["lr"]))
        return original_configure(self, server_round, arrays, config, grid)

    def aggregate(self, server_round, replies):
        arrays, metrics = original_aggregate(self, server_round, replies)
        if (self.fed.phase, server_round) == ("pretrain", 2):
            state = arrays.to_torch_state_dict()
            state["features.10.weight"].zero_()
            state["features.10.bias"].fill_(-1.0)
            arrays = ArrayRecord(state)
        return arrays, metrics

    monkeypatch.setattr(RoleFedAvg, "configure_train", configure)
    monkeypatch.setattr(RoleFedAvg, "aggregate_train", aggregate)
    results = run(tmp_path, method="none", scenario="class", lr=0.04)
    assert all(lrs == [0.04] for lrs in plays.values())
    assert sorted(r for phase, r in plays if phase == "pretrain") == [1, 2]
    assert sorted(r for phase, r in plays if phase == "retrain") == [1, 2]
    assert sorted(r for phase, r in plays if phase == "continue") == [1, 2, 3]
    cost = results["cost"]
    assert (cost["pretrain"]["rounds"], cost["retrain"]["rounds"], cost["continue"]["rounds"]) == (2, 2, 3)
    assert "original_usable" in results["validity"]["failed"] and not results["validity"]["original_valid"]


def _benchmark_module(name: str = "robustness_grid"):
    """A script of ``benchmarks/`` loaded as a module (default: the robustness grid)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_shapes_parse_and_reject_bad_input():
    grid = _benchmark_module()
    assert grid.parse_shapes("10:0.5,7:0.1") == [(10, 0.5), (7, 0.1)]
    for bad in ("10", "1:0.5", "7:0", "x:0.1"):
        with pytest.raises(SystemExit, match="--shapes"):
            grid.parse_shapes(bad)


def test_every_grid_config_error_is_one_line_and_status_2_before_any_run(tmp_path, monkeypatch, capsys):
    grid = _benchmark_module()
    ran = []
    monkeypatch.setattr(grid, "run_inprocess", lambda config, clients: ran.append(config))
    work = ["--work", str(tmp_path / "work"), "--seeds", "1", "--shapes", "4:0.5", "--scenarios", "class"]
    for argv, fragment in ((["--run-config", "nosuch=1"], "unknown run-config key(s) nosuch"),
                           (["--run-config", "continue-rounds=-1"], "'continue-rounds'=-1"),
                           (["--run-config", "forget-client=7"], "forget-client"),  # beyond the shape's 4 clients
                           (["--run-config", "continue-rounds="], "TOML syntax"),
                           (["--seeds", "1,x"], "--seeds"), (["--shapes", "1:0.5"], "--shapes"),
                           (["--methods", "lethe@nosuch"], "no recipe 'nosuch'"),
                           (["--scenarios", "all"], "--scenarios"),
                           (["--retrain-draws", "0"], "--retrain-draws"), (["--shapes", "x"], "--shapes"),
                           (["--rejudge", str(tmp_path / "none.csv")], "--rejudge: no file"),
                           (["--bogus"], "unrecognized arguments: --bogus")):
        with pytest.raises(SystemExit) as info:
            grid.main(work + argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and err.count("\n") == 1 and err.startswith("error: ") and fragment in err, err
    assert ran == [] and not (tmp_path / "work").exists()


def test_the_grids_run_config_adds_to_its_continued_rounds_key_by_key():
    """A probe's own --run-config keeps the grid's 60 continued rounds unless it sets them itself."""
    grid = _benchmark_module()
    assert grid.grid_run_config("") == {"continue-rounds": 60}
    assert grid.grid_run_config("lethe-stop-loss=8.0") == {"continue-rounds": 60, "lethe-stop-loss": 8.0}
    assert grid.grid_run_config("presets=false continue-rounds=20") == {"continue-rounds": 20, "presets": False}


def _fake_results(test_acc, forget_acc, retain_acc, ct_kr, valid=True, diverged=None, original_test=0.95):
    block = validity(original={"test_acc": 0.95 if valid else 0.08, "forget_acc": 0.9 if valid else 0.0},
                     unlearned={"test_acc": test_acc}, retrain=RETRAIN, num_classes=10, diverged_at_round=diverged)
    resurfacing = {"ct_kr": None if diverged else ct_kr, "rr": None if diverged else 0.0, "kr_retrain": 0.07}
    if diverged:
        resurfacing["diverged_at_round"] = diverged
    return {"models": {"original": {"test_acc": original_test},
                       "unlearned": {"test_acc": test_acc, "forget_acc": forget_acc, "retain_acc": retain_acc}},
            "resurfacing": resurfacing, "validity": block}


def _serve(grid, monkeypatch, tmp_path, outcomes: dict) -> None:
    """The grid's runs answered from ``outcomes`` (method -> results.json), each in its own folder."""
    def fake_run(config, clients):
        folder = tmp_path / config["method"]
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps(outcomes[config["method"]]))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)


def test_grid_cell_judges_bars_flags_invalid_originals_and_survives_a_crash(tmp_path, monkeypatch):
    grid = _benchmark_module()
    outcomes = {}

    def fake_run(config, clients):
        outcome = outcomes[config["method"]]
        if isinstance(outcome, Exception):
            raise outcome
        folder = tmp_path / f"{config['method']}-{config['seed']}-{len(os.listdir(tmp_path))}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(outcome))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    outcomes.update(retrain=_fake_results(0.95, 0.0, 0.99, 0.0), fedup=_fake_results(0.95, 0.01, 0.98, 0.0),
                    lethe=_fake_results(0.90, 0.02, 0.97, 0.0, diverged=4))
    rows = {r["method"]: r for r in grid.run_cell(11, 7, 0.1, "class", ["retrain", "fedup", "lethe"], {})}
    assert rows["fedup"]["holds"] is True
    assert rows["lethe"]["holds"] is False and rows["lethe"]["ct_kr"] == "diverged@4" and rows["lethe"]["rr"] is None
    assert "continued_finite" in rows["lethe"]["validity"] and rows["lethe"]["kr_ok"] is False

    outcomes.update(retrain=_fake_results(0.95, 0.0, 0.99, 0.0, valid=False), fedup=RuntimeError("boom\nsecond line"),
                    lethe=_fake_results(0.95, 0.0, 0.99, 0.0, valid=False))
    rows = {r["method"]: r for r in grid.run_cell(12, 7, 0.1, "class", ["retrain", "fedup", "lethe"], {})}
    assert rows["fedup"]["error"] == "RuntimeError: boom second line" and rows["fedup"]["holds"] is False
    assert rows["lethe"]["bar"].startswith("flagged") and rows["lethe"]["test_acc"] is None
    assert "original_usable" in rows["lethe"]["validity"]
    lines = grid.totals(list(rows.values()))
    assert lines[-1] == "runs that failed: 1; cells flagged (original invalid): 1"


def test_grid_reads_within_on_both_sides_and_keeps_the_one_sided_reading(tmp_path, monkeypatch):
    """A method far *above* retrain misses a "within" bar (and the miss says so); the one-sided
    reading (``no_worse``) still counts it; saved rows judged again give the same verdicts."""
    grid = _benchmark_module()
    outcomes = {"retrain": _fake_results(0.85, 0.0, 0.90, 0.0), "fedup": _fake_results(0.95, 0.0, 0.99, 0.0),
                "lethe": _fake_results(0.95, 0.0, 0.99, 0.0)}

    def fake_run(config, clients):
        folder = tmp_path / f"{config['method']}-{config['scenario']}"
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps(outcomes[config["method"]]))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    rows = grid.run_cell(11, 7, 0.1, "class", ["retrain", "fedup", "lethe"], {})
    by = {r["method"]: r for r in rows}
    assert by["fedup"]["holds"] is False and by["fedup"]["no_worse"] is True
    assert "retain+-0.02:MISS above" in by["fedup"]["bar"]
    assert by["lethe"]["holds"] is False and by["lethe"]["no_worse"] is True and "MISS above" in by["lethe"]["bar"]
    lines = grid.totals(rows)
    assert "0/1 valid cells" in lines[0] and "not more than 0.03 below it: 1/1" in lines[0]
    assert "0/1 valid cells" in lines[-2] and "retain not more than 0.02 below: 1/1" in lines[-2]
    assert by["lethe"]["d_orig"] == pytest.approx(0.10)  # the original (0.95) is itself 0.10 above retrain
    assert ("more than 0.03 from retrain's test accuracy: 1/1; test misses of Lethe (paper) there: 1, elsewhere: 0"
            in lines[1])

    outcomes["retrain"] = _fake_results(0.85, 0.0, 0.90, 0.0, original_test=0.86)  # an original near retrain
    outcomes["lethe"] = _fake_results(0.80, 0.0, 0.85, 0.0, original_test=0.86)  # below: misses both readings
    rows += grid.run_cell(12, 7, 0.1, "class", ["retrain", "lethe"], {})
    assert rows[-1]["holds"] is False and rows[-1]["no_worse"] is False and "MISS below" in rows[-1]["bar"]
    assert ("from retrain's test accuracy: 1/2; test misses of Lethe (paper) there: 1, elsewhere: 1"
            in grid.totals(rows)[1])
    grid.write_outputs(str(tmp_path / "grid"), rows)
    again = grid.rejudge([str(tmp_path / "grid.csv")], {})
    assert [(r["method"], r["holds"], r["no_worse"] if "no_worse" in r else None) for r in again] == \
        [(r["method"], r["holds"], r.get("no_worse")) for r in rows]
    assert grid.totals(again) == grid.totals(rows)


def _serve_by_seed(monkeypatch, grid, tmp_path, results_by_seed):
    """The grid's runs answered with ``results_by_seed[seed][method]`` as a results.json in a folder of its own."""

    def fake_run(config, clients):
        folder = tmp_path / f"{config['seed']}-{config['method']}"
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps(results_by_seed[config["seed"]][config["method"]]))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)


def test_grid_runs_a_paper_and_its_recipe_as_two_rows_each_held_to_the_methods_bars(tmp_path, monkeypatch):
    """``--methods retrain,lethe,lethe@lethe-robust``: the recipe's run gets ``recipe='lethe-robust'``,
    its row says so (``recipe``), both Lethe rows are judged by Lethe's bars and counted apart in the
    totals; a run that did not carry the request out says so beside its bar; there is no exact-fallback
    column; saved rows (and a CSV from before the recipe column: the paper) judged again say the same."""
    grid = _benchmark_module()
    configs = []
    outcomes = {"retrain": _fake_results(0.85, 0.0, 0.90, 0.0), "lethe": _fake_results(0.86, 0.0, 0.90, 0.0),
                "lethe-robust": {**_fake_results(0.70, 0.0, 0.80, 0.0), "method": {"carried_out": False}}}

    def fake_run(config, clients):
        configs.append(dict(config))
        name = config.get("recipe", config["method"])
        folder = tmp_path / f"{config['seed']}-{name}"
        folder.mkdir(exist_ok=True)
        results = {**outcomes[name], "run": {"recipe": config.get("recipe", "paper")}}
        results["method"] = {**results.get("method", {}), "exact_fallback": {"share": 0.8, "classes": {"1": 0.9}}}
        (folder / "results.json").write_text(json.dumps(results))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    rows = grid.run_cell(11, 7, 0.1, "class", ["retrain", "lethe", "lethe@lethe-robust"], {})
    assert [(c["method"], c.get("recipe")) for c in configs] == [
        ("retrain", None), ("lethe", None), ("lethe", "lethe-robust")]
    paper, robust = (r for r in rows if r["method"] == "lethe")
    assert (paper["recipe"], paper["holds"], paper["carried_out"]) == ("paper", True, None)
    assert (robust["recipe"], robust["holds"], robust["carried_out"]) == ("lethe-robust", False, False)
    assert robust["bar"].startswith("test+-0.03:MISS below") and robust["bar"].endswith("(not carried out)")
    assert "| lethe | lethe-robust | NO |" in grid._markdown(robust)
    assert "| lethe | paper | — |" in grid._markdown(paper)
    assert "exact" not in grid.COLUMNS and not any("exact" in key for r in rows for key in r)
    lines = grid.totals(rows)
    assert lines[0].startswith("Lethe (paper) test_acc within 0.03 of retrain: 1/1 valid cells (holds")
    assert "Lethe (lethe-robust) test_acc within 0.03 of retrain: 0/1 valid cells (MISSED" in "\n".join(lines)
    assert "Lethe (lethe-robust) did not carry the request out in 1/1 valid cells" in "\n".join(lines)
    assert not [x for x in lines if "exact" in x or "Lethe (paper) did not carry" in x]
    grid.write_outputs(str(tmp_path / "grid"), rows)
    with open(tmp_path / "grid.csv", newline="") as handle:
        saved = list(csv.DictReader(handle))
    assert [(r["method"], r["recipe"], r["carried_out"]) for r in saved] == [
        ("retrain", "paper", "—"), ("lethe", "paper", "—"), ("lethe", "lethe-robust", "NO")]
    again = grid.rejudge([str(tmp_path / "grid.csv")], {})
    assert [(r["method"], r["recipe"], r["holds"]) for r in again] == \
        [(r["method"], r["recipe"], r["holds"]) for r in rows]
    assert grid.totals(again) == lines
    # a CSV from before the recipe and carried_out columns: its rows are the paper's
    old = tmp_path / "old.csv"
    with open(old, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[k for k in saved[0] if k not in ("recipe", "carried_out")])
        writer.writeheader()
        writer.writerows({k: v for k, v in r.items() if k in writer.fieldnames} for r in saved[:2])
    assert [r["recipe"] for r in grid.rejudge([str(old)], {})] == ["paper", "paper"]
    with pytest.raises(SystemExit, match="is not METHOD or METHOD@RECIPE"):
        grid.run_cell(11, 7, 0.1, "class", ["retrain", "lethe@"], {})


def test_grid_shows_a_flagged_rows_figures_marked_not_blanked(tmp_path, monkeypatch):
    """A row of a cell whose original is invalid is judged by no bar, but its figures are shown beside
    the flag (table) or its validity flags (CSV), never a bare dash or "flagged"; judged again, the same."""
    grid = _benchmark_module()
    outcomes = {"retrain": _fake_results(0.95, 0.0, 0.99, 0.0, valid=False),
                "lethe": _fake_results(0.61, 0.25, 0.97, 0.0, valid=False)}

    _serve(grid, monkeypatch, tmp_path, outcomes)
    lethe = {r["method"]: r for r in grid.run_cell(12, 7, 0.1, "class", ["retrain", "lethe"], {})}["lethe"]
    assert lethe["bar"].startswith("flagged") and lethe["holds"] is None and lethe["test_acc"] is None
    line = grid._markdown(lethe)
    assert "| 0.610 (flagged) |" in line and "| 0.250 (flagged) |" in line and "| 0.970 (flagged) |" in line
    grid.write_outputs(str(tmp_path / "grid"), [lethe])
    with open(tmp_path / "grid.csv", newline="") as handle:
        saved = next(csv.DictReader(handle))
    assert saved["test_acc"] == "0.61" and "original_usable" in saved["validity"].split(";")
    again = grid.rejudge([str(tmp_path / "grid.csv")], {})[0]
    assert again["holds"] is None and again["test_acc"] is None and again.get("d_test") is None  # no bar reads it
    assert "| 0.610 (flagged) |" in grid._markdown(again)


def test_grid_rejudge_gives_a_method_run_again_alone_its_cells_d_orig(tmp_path, monkeypatch):
    """A Lethe row run again without retrain (``--methods lethe``) has no reference, so no ``d_test``
    or ``d_orig``; judged again together with the first grid's file, it is judged against that file's
    retrain and gets both back from its own figures (original 0.86 against retrain 0.90)."""
    grid = _benchmark_module()
    outcomes = {"retrain": _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.86),
                "lethe": _fake_results(0.80, 0.0, 0.90, 0.0, original_test=0.86)}

    def fake_run(config, clients):
        folder = tmp_path / f"{config['method']}-{len(os.listdir(tmp_path))}"
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(outcomes[config["method"]]))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    grid.write_outputs(str(tmp_path / "first"), grid.run_cell(12, 7, 0.1, "class", ["retrain", "lethe"], {}))
    outcomes["lethe"] = _fake_results(0.89, 0.0, 0.94, 0.0, original_test=0.86)  # the method changed
    alone = grid.run_cell(12, 7, 0.1, "class", ["lethe"], {})
    assert alone[0].get("d_orig") is None and alone[0]["holds"] is None
    grid.write_outputs(str(tmp_path / "again"), alone)
    rows = {r["method"]: r for r in grid.rejudge([str(tmp_path / "first.csv"), str(tmp_path / "again.csv")], {})}
    assert rows["lethe"]["test_acc"] == pytest.approx(0.89) and rows["lethe"]["holds"] is True
    assert rows["lethe"]["d_orig"] == pytest.approx(-0.04) and rows["lethe"]["d_test"] == pytest.approx(-0.01)


def test_grid_judges_retrain_draws_by_lethes_bars_against_the_first_retrain(tmp_path, monkeypatch):
    """``--retrain-draws``: the later draws run retrain with their own ``init-seed`` and are judged by
    Lethe's bars; a draw whose own original fails validity is flagged, not counted; saved rows judged
    again count the same."""
    grid = _benchmark_module()
    calls = []
    draws = {1011: _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.97),  # 0.05 below: misses, original near
             2011: _fake_results(0.94, 0.0, 0.98, 0.0, original_test=0.90),  # within; its original 0.05 off
             3011: _fake_results(0.94, 0.0, 0.98, 0.0, valid=False),
             1012: _fake_results(0.94, 0.0, 0.98, 0.0, valid=False)}  # seed 12's only draw: flagged

    def fake_run(config, clients):
        calls.append((config["method"], config.get("init-seed")))
        outcome = draws[config["init-seed"]] if "init-seed" in config else \
            _fake_results(0.91 if config["method"] == "lethe" else 0.95, 0.0, 0.99, 0.0)
        folder = tmp_path / f"{config['method']}-{config.get('init-seed')}"
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps(outcome))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    rows = grid.run_cell(11, 7, 0.1, "class", ["retrain", "lethe"], {}, retrain_draws=4)
    assert calls == [("retrain", None), ("lethe", None), ("retrain", 1011), ("retrain", 2011), ("retrain", 3011)]
    by = {r["method"]: r for r in rows}
    assert by["retrain@init1011"]["holds"] is False and "MISS below" in by["retrain@init1011"]["bar"]
    assert by["retrain@init2011"]["holds"] is True and by["retrain@init2011"]["kr_ok"] is True
    assert by["retrain@init3011"]["holds"] is None and "draw:original_usable" in by["retrain@init3011"]["validity"]
    line, band, shape = grid.totals(rows)[-4:-1]
    assert "test within 0.03 of the grid's retrain in 1/2 draws (not more than 0.03 below: 1/2)" in line
    assert "U-KR and CT-KR within 0.05: 2/2; the draw's original within 0.03 of the grid's original: 1/2" in line
    assert line.endswith("class cells, retain within 0.02 (FedUP's bar): 1/2")  # 0.95 and 0.98 against 0.99
    assert by["lethe"]["holds"] is False  # 0.04 below the grid's retrain, but within 0.03 of draw 1011's 0.90
    assert band == ("Lethe (paper) test_acc within 0.03 of the grid's retrain or of a retrain draw: 1/1 valid cells "
                    "with a draw")
    assert shape == ("7 clients alpha 0.1, both sides, same cells: Lethe's test within 0.03: retrain drawn again "
                     "1/2 draws, Lethe (paper) 0/1 cells")  # the flagged draw is not counted
    # a cell whose every draw is flagged has no reference drawn again: it leaves the per-shape line alone
    more = rows + grid.run_cell(12, 7, 0.1, "class", ["retrain", "lethe"], {}, retrain_draws=2)
    assert [x for x in grid.totals(more) if "same cells" in x] == [shape]
    assert grid.totals(rows)[-1].endswith("cells flagged (original invalid): 0")
    grid.write_outputs(str(tmp_path / "grid"), rows)
    assert grid.totals(grid.rejudge([str(tmp_path / "grid.csv")], {})) == grid.totals(rows)


def test_grid_flags_a_method_whose_own_original_is_invalid_not_the_cell(tmp_path, monkeypatch):
    """A method that trains its own original (``run.own_original``, e.g. FedAU) is flagged by that
    original's failed checks (``own:<check>``, numbers hidden); the cell, whose shared original is
    valid, stays valid for the others, and a saved grid judged again says the same. Measured on seed
    97, 7 clients alpha 0.1, sample: FedAU's own original had test accuracy 0.186 and the grid showed
    its row as a number flagged only ``unlearned_utility``."""
    grid = _benchmark_module()
    outcomes = {"retrain": _fake_results(0.95, 0.0, 0.99, 0.0), "lethe": _fake_results(0.95, 0.0, 0.99, 0.0),
                "fedau": {**_fake_results(0.14, 0.0, 0.11, 0.0, valid=False), "run": {"own_original": {"aux": 1}}},
                "pga": {**_fake_results(0.93, 1.0, 0.99, 1.0), "run": {}}}

    _serve(grid, monkeypatch, tmp_path, outcomes)
    rows = grid.run_cell(97, 7, 0.1, "sample", ["fedau", "retrain", "lethe", "pga"], {})
    by = {r["method"]: r for r in rows}
    assert "own:original_usable" in by["fedau"]["validity"].split(";")
    assert by["fedau"]["bar"] == "flagged (original invalid)" and by["fedau"]["test_acc"] is None
    assert by["fedau"]["test_acc_raw"] == pytest.approx(0.14)
    assert all(r["cell_valid"] for r in rows)  # the shared original decides the cell, not FedAU's own
    assert by["lethe"]["holds"] is True and by["pga"]["validity"] == "ok" and by["pga"]["test_acc"] == 0.93
    assert grid.totals(rows)[-1].endswith("cells flagged (original invalid): 0")
    grid.write_outputs(str(tmp_path / "grid"), rows)
    again = {r["method"]: r for r in grid.rejudge([str(tmp_path / "grid.csv")], {})}
    assert again["fedau"]["own_flagged"] and again["lethe"]["holds"] is True and again["lethe"]["cell_valid"]


def test_grid_states_the_facts_beside_every_miss_and_counts_them(tmp_path, monkeypatch):
    """Beside a miss the grid states what the cell shows (``context``) and the totals count Lethe's
    test misses by those facts: here one miss from an original 0.10 above retrain whose draw misses
    the same way, one whose original and draw are near retrain (none of the facts), and a KR miss,
    whose figures it names; a row that meets its bars has no context; judged again, the same."""
    grid = _benchmark_module()
    cells = {11: {"retrain": _fake_results(0.85, 0.0, 0.90, 0.0, original_test=0.95),
                  "lethe": _fake_results(0.95, 0.0, 0.99, 0.0, original_test=0.95),
                  "fedup": _fake_results(0.95, 0.0, 0.99, 0.0, original_test=0.95),
                  1011: _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.95)},  # the draw: also above
             12: {"retrain": _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.91),
                  "lethe": _fake_results(0.95, 0.0, 0.99, 0.0, original_test=0.91),  # moved +0.04
                  "fedup": _fake_results(0.90, 0.0, 0.96, 0.0, original_test=0.91),  # holds
                  1012: _fake_results(0.91, 0.0, 0.95, 0.0, original_test=0.91)},
             13: {"retrain": _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.90),
                  "lethe": _fake_results(0.90, 0.0, 0.95, 0.3, original_test=0.90),  # comes back
                  1013: _fake_results(0.90, 0.0, 0.95, 0.0, original_test=0.90)},
             14: {"retrain": _fake_results(0.95, 0.0, 0.99, 0.0), "lethe": _fake_results(0.96, 0.0, 0.99, 0.0),
                  1014: _fake_results(0.94, 0.0, 0.99, 0.0)}}  # another shape, every bar met

    def fake_run(config, clients):
        outcome = cells[config["seed"]][config.get("init-seed", config["method"])]
        folder = tmp_path / f"{config['seed']}-{config['method']}-{config.get('init-seed')}"
        folder.mkdir(exist_ok=True)
        (folder / "results.json").write_text(json.dumps(outcome))
        return str(folder)

    monkeypatch.setattr(grid, "run_inprocess", fake_run)
    rows = [r for seed in (11, 12, 13) for r in grid.run_cell(
        seed, 7, 0.1, "class", ["retrain", "lethe"] + (["fedup"] if seed < 13 else []), {}, retrain_draws=2)]
    rows += grid.run_cell(14, 10, 0.5, "sample", ["retrain", "lethe"], {}, retrain_draws=2)
    by = {(r["seed"], r["method"]): r for r in rows}
    assert by[(11, "lethe")]["context"] == "original +0.100; moved +0.000 from its original; draw 0.900 also above"
    assert by[(11, "lethe")]["miss_kinds"] == ["draw", "original"]
    assert by[(11, "fedup")]["context"] == "draw 0.950 also above"  # its retain bar: 0.99 and 0.95 against 0.90
    assert by[(12, "lethe")]["context"] == "moved +0.040 from its original; draw 0.910"
    assert by[(12, "lethe")]["miss_kinds"] == [] and by[(12, "fedup")]["context"] == ""
    assert by[(13, "lethe")]["holds"] is True
    assert by[(13, "lethe")]["context"] == "U-KR / CT-KR 0.000 / 0.300 against 0.000 / 0.000"
    line = next(x for x in grid.totals(rows) if x.startswith("test misses of Lethe (paper)"))
    assert line == ("test misses of Lethe (paper): 2 above (original outside the tolerance: 1, a retrain draw misses "
                    "on the "
                    "same side: 1, the leaving client holds most of a class: 0, within the tolerance outside those "
                    "classes: 0; none of these: 1)")
    # per shape, in the same cells, the reference drawn again beside the method (FedUP: class cells 11, 12)
    assert [x for x in grid.totals(rows) if "same cells" in x] == [
        "10 clients alpha 0.5, both sides, same cells: Lethe's test within 0.03: retrain drawn again 1/1 draws, "
        "Lethe (paper) 1/1 cells",
        "7 clients alpha 0.1, both sides, same cells: Lethe's test within 0.03: retrain drawn again 2/3 draws, "
        "Lethe (paper) 1/3 cells; FedUP's class bar: retrain drawn again 1/2 draws, FedUP (paper) 1/2 cells"]
    grid.write_outputs(str(tmp_path / "grid"), rows)
    again = {(int(r["seed"]), r["method"]): r for r in grid.rejudge([str(tmp_path / "grid.csv")], {})}
    assert all(again[k]["context"] == r["context"] for k, r in by.items())
    assert grid.totals(list(again.values())) == grid.totals(rows)


def test_grid_shows_the_test_accuracy_on_the_classes_the_leaving_client_holds(tmp_path, monkeypatch):
    """In a client cell whose leaving client holds most of a class, every row shows its unlearned
    model's test accuracy on that class (``held_test``) and on the others (``outside_held``), and a
    test miss names both beside retrain's, counted as a miss within the tolerance outside that class;
    a flagged row shows none, and judged again from the CSV the context is the same."""
    grid = _benchmark_module()

    def with_classes(results, by_class):
        results["models"]["unlearned"]["test_acc_by_class"] = by_class
        return results

    cells = {21: {"retrain": with_classes(_fake_results(0.94, 0.0, 0.99, 0.0), [0.9] * 6 + [0.72] + [0.9] * 3),
                  "lethe": with_classes(_fake_results(0.87, 0.0, 0.99, 0.0), [0.9] * 6 + [0.0] + [0.9] * 3)},
             22: {"retrain": with_classes(_fake_results(0.94, 0.0, 0.99, 0.0, valid=False), [0.9] * 10),
                  "lethe": with_classes(_fake_results(0.87, 0.0, 0.99, 0.0, valid=False), [0.9] * 10)}}

    _serve_by_seed(monkeypatch, grid, tmp_path, cells)
    monkeypatch.setattr(grid, "leaving_holds", lambda config, clients: "6:0.99")
    monkeypatch.setattr(grid, "test_class_counts", lambda config, clients: [36] * 10)  # 360 test samples
    rows = {(r["seed"], r["method"]): r for seed in (21, 22)
            for r in grid.run_cell(seed, 7, 0.1, "client", ["retrain", "lethe"], {})}
    assert rows[(21, "retrain")]["held_test"] == "6:0.720" and rows[(21, "lethe")]["held_test"] == "6:0.000"
    assert rows[(21, "lethe")]["holds"] is False
    # outside class 6: (0.94 * 360 - 0.72 * 36) / 324 for retrain, 0.87 * 360 / 324 for Lethe
    assert rows[(21, "retrain")]["outside_held"] == pytest.approx(0.964444, abs=1e-6)
    assert rows[(21, "lethe")]["context"].endswith(
        "leaving client holds 6:0.99; test on those classes 6:0.000 against retrain's 6:0.720; "
        "outside those classes 0.967 against retrain's 0.964")
    assert "held_only" in rows[(21, "lethe")]["miss_kinds"]
    assert rows[(22, "lethe")]["held_test"] is None and rows[(22, "lethe")]["outside_held"] is None  # flagged
    line = next(x for x in grid.totals(list(rows.values())) if x.startswith("test misses of Lethe (paper)"))
    assert "the leaving client holds most of a class: 1, within the tolerance outside those classes: 1" in line
    grid.write_outputs(str(tmp_path / "grid"), list(rows.values()))
    again = {(int(r["seed"]), r["method"]): r for r in grid.rejudge([str(tmp_path / "grid.csv")], {})}
    assert again[(21, "lethe")]["context"] == rows[(21, "lethe")]["context"]


def test_grid_names_the_classes_the_leaving_client_holds():
    """At alpha 0.05 over 2 clients the leaving (largest) client holds most of some classes; at
    alpha 1000 (near IID) it holds about half of each, so none is named."""
    grid = _benchmark_module()
    held = grid.leaving_holds({"seed": 3, "dirichlet-alpha": 0.05}, 2)
    assert held and all(float(item.split(":")[1]) >= grid.HELD_SHARE for item in held.split())
    assert grid.leaving_holds({"seed": 3, "dirichlet-alpha": 1000.0}, 2) == ""


def test_backdoor_client_pretrains_on_clean_copies_and_label_flip_on_poison_epochs():
    """The client scenario's poisoning keeps the original usable: a backdoor client trains its
    triggered samples together with clean copies (true labels) at the federation's epochs; only a
    label-flip client runs poison-epochs, and only while the original is trained."""
    from strategies.run_config import parse_config
    from tasks.registry import task_for
    from tasks.requests import build_client_data

    images = task_for("digits-lenet5").load_images()
    backdoor = parse_config({"scenario": "client", "poison": "backdoor", "forget-client": 2, "backdoor-share": 1.0},
                            num_clients=5)
    leaving, other = build_client_data(backdoor, images, 2, 5), build_client_data(backdoor, images, 0, 5)
    n_clean, n_zero = len(leaving.pretrain_only_y), int((leaving.pretrain_only_y == 0).sum())
    assert len(leaving.forget_y) == n_clean - n_zero > 0 and len(other.pretrain_only_y) == 0
    assert torch.all(leaving.forget_y == 0) and not torch.all(leaving.pretrain_only_y == 0)
    assert not torch.equal(leaving.pretrain_only_x[leaving.pretrain_only_y != 0], leaving.forget_x)  # clean copies
    x, y = leaving.split("all")
    assert len(y) == len(leaving.forget_y) + n_clean and torch.equal(leaving.split("forget")[1], leaving.forget_y)
    assert leaving.local_epochs("all", backdoor, 3) == 3
    flip = parse_config({"scenario": "client", "poison": "label-flip", "forget-client": 2, "poison-epochs": 15},
                        num_clients=5)
    flipped = build_client_data(flip, images, 2, 5)
    assert len(flipped.pretrain_only_y) == 0
    assert flipped.local_epochs("all", flip, 3) == 15 and flipped.local_epochs("forget", flip, 3) == 3
    assert build_client_data(flip, images, 0, 5).local_epochs("all", flip, 3) == 3
    no_boost = parse_config({"scenario": "client", "poison": "label-flip", "forget-client": 2, "poison-epochs": 0},
                            num_clients=5)
    assert flipped.local_epochs("all", no_boost, 3) == 3


def test_request_check_names_a_destroyed_a_weak_and_an_unlearned_original(tmp_path):
    """``benchmarks/request_check.py``: the verdict of each original against its clean reference,
    and one real row (smoke settings) whose figures come from the run."""
    check = _benchmark_module("request_check")
    assert check.verdict(0.10, 1.0, 0.97, chance=0.1, margin=0.03) == "destroyed"
    assert check.verdict(0.90, 1.0, 0.97, chance=0.1, margin=0.03) == "below clean"
    assert check.verdict(0.96, 0.3, 0.97, chance=0.1, margin=0.03) == "not learned"
    assert check.verdict(0.96, 0.9, 0.97, chance=0.1, margin=0.03) == "ok"
    row = check.check(3, 3, 1.0, 3, {"smoke": True}, str(tmp_path), 0.03)
    assert row["init_seed"] == 3 and 0.0 <= row["test_acc"] <= 1.0 and 0.0 <= row["clean_test_acc"] <= 1.0
    assert row["target_rate"] is not None and row["verdict"] in ("ok", "not learned", "below clean", "destroyed")
