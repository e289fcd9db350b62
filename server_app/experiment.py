"""One run = phases: hello -> pretrain -> unlearn -> restore -> continue -> evaluate -> report.

This module orchestrates and records; every method's internals live behind
``strategies.common.base.UnlearningMethod``.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from typing import Any, Iterable

from flwr.app import ArrayRecord, ConfigRecord

from client_app.state import GIVEN_KEYS
from core.config import Config, ConfigError
from core.files import folder_problem
from server_app import cache, history
from server_app.evaluation import ReceivedModelMeasure, evaluate_models
from server_app.model_files import (
    load_state_file,
    match_state,
    same_model,
    sha256_of,
    write_models,
)
from server_app.receipt import request_record, write_receipt
from server_app.report import (
    append_csv,
    package_versions,
    plot_kr_curve,
    run_folder,
    saw_fewer_clients,
    write_results,
)
from strategies.common.base import ModelState, UnlearnContext
from strategies.common.fedavg_rounds import (
    ModelDiverged,
    RoleFedAvg,
    require_finite,
    run_rounds,
    scheduled_lr,
)
from strategies.common.federation import Federation
from strategies.registry import method_for, method_spec, pretraining_keeps
from strategies.run_config import inapplicable_settings, parse_config
from tasks.diagnostics import (
    forgetting_dispersion,
    pca_scatter_png,
    resurfacing_summary,
    rollback_tendency,
)
from tasks.plugins import specs_to_json
from tasks.stream import is_stream
from tasks.validity import validity

log = logging.getLogger("fedunlearn")


class Experiment:
    """Holds the federation, config and clock of one run; each phase is a method."""

    def __init__(self, fed: Federation, run_config: dict[str, Any], given: Iterable[str] | None = None):
        """``given``: the keys the user set where ``run_config`` holds every key (``flwr run``); the
        nodes learn them in hello, so that they parse the run config as the server does."""
        self.fed = fed
        self.run_config = run_config
        self.given = None if given is None else tuple(sorted(given))
        self.cfg: Config = parse_config(run_config, given=self.given)
        self.method = method_for(self.cfg["method"])
        self.started = time.perf_counter()
        self._retrain: ModelState | None = None
        self.built_cost: dict[str, dict] = {}
        self.model_ids: dict[str, str] = {}
        self.pretraining: dict = {}  # what pretraining kept on the server for the method (``history``)
        self.given_original: tuple[ModelState, dict] | None = None  # original-model: the model and its file

    def say(self, text: str) -> None:
        log.info("[%7.1fs] %s", time.perf_counter() - self.started, text)

    # --- phases -------------------------------------------------------------------------
    def setup(self) -> None:
        """Checks before any work — folders writable, settings that do not apply named, task files,
        the data read, identified and partitioned as the clients will — then hello: node ids,
        client ids and counts; then the checks that need the federation."""
        self.fed.start_phase("setup")
        for key, folder in (("outputs-dir", self.cfg["outputs-dir"]), ("cache-dir", cache.cache_dir(self.cfg))):
            problem = folder_problem(folder)
            if problem:
                raise ConfigError(f"run-config '{key}': {problem}; it must be a writable folder")
        if self.cfg.presets:
            self.say("presets of task '%s' and method '%s'%s: %s" % (
                self.cfg["task"], self.cfg["method"], " (smoke run)" if self.cfg["smoke"] else "",
                ", ".join(f"{k}={v!r}" for k, v in self.cfg.presets.items())))
        unused = inapplicable_settings(self.cfg)
        if unused:
            log.warning("run-config key(s) set but not used by task '%s' / method '%s', ignored: %s",
                        self.cfg["task"], self.cfg["method"], ", ".join(unused))
        self.given_original = self.load_given_original()
        num_nodes = len(list(self.fed.grid.get_node_ids()))
        self.cfg.task.check_setup(self.cfg, num_nodes)
        self.data_id = self.identify_data(num_nodes)
        self.fed.hello(ConfigRecord({} if self.given is None else {GIVEN_KEYS: " ".join(self.given)}))
        self.cfg = parse_config(self.run_config, num_clients=self.fed.num_clients, given=self.given)
        if not is_stream(self.cfg):  # a stream checks each of its requests (server_app.stream)
            self.check_request(f"the request (scenario '{self.cfg['scenario']}')")

    def check_request(self, request: str) -> None:
        """After hello: the request selects forget data somewhere and leaves retained data somewhere."""
        if not self.fed.nodes_with("n-forget"):
            raise ConfigError(f"{request} selects no forget data on any client: nothing to unlearn")
        if not self.fed.nodes_with("n-retain"):
            raise ConfigError(f"{request}: no client keeps any retained data: nothing to train on after unlearning")
        forget = [self.fed.client_id(n) for n in self.fed.nodes_with("n-forget")]
        self.say(f"federation: {self.fed.num_clients} clients; {request}: forget data on clients {forget}")

    def identify_data(self, num_nodes: int) -> str | None:
        """The training data's fingerprint (part of the cache key), read on the server as every
        client reads it; for a vision task the Dirichlet split over ``num_nodes`` clients is tried
        too where every node partitions that same pool (one machine; a SuperNode elsewhere may read
        its own files, and reports an impossible split itself, in one line, in hello). A bad file or
        an impossible split is a one-line ``ConfigError`` before any node works.
        Missing data stops the run too when every node runs on this machine (simulation); with
        SuperNodes elsewhere the server may well lack it: then the identity is None and the models
        are neither taken from nor written to the cache, since nothing identifies them."""
        data_key = self.cfg.task.data_key
        try:
            fingerprint = cache.data_fingerprint(self.cfg)
        except FileNotFoundError as err:
            if self.fed.on_one_machine:
                raise ConfigError(f"run-config '{data_key}': {err}") from None
            log.warning("%s; the server cannot identify the data, so models are not cached", err)
            return None
        except ValueError as err:
            raise ConfigError(f"run-config '{data_key}': {err}") from None
        if num_nodes >= 2 and self.fed.on_one_machine:
            self.cfg.task.check_partition(self.cfg, num_nodes)
        return fingerprint

    def train_config(self, **extra) -> ConfigRecord:
        return ConfigRecord({"epochs": self.cfg["local-epochs"], "lr": self.cfg["lr"], **extra})

    def fedavg(self, arrays: ArrayRecord, role: str, rounds: int, label: str, *, plugins: list[dict] = (),
               seed_offset: int = 0, after_round=None, last_round_config: dict | None = None,
               on_replies=None, aggregate=None, extra_config: dict | None = None,
               measure_received: ReceivedModelMeasure | None = None, round_lr=None) -> ArrayRecord:
        """``rounds`` of plain FedAvg over the clients holding ``role`` data (0 rounds: ``arrays`` unchanged),
        each round played once (``run_rounds``); ``extra_config`` adds entries to every round's ``train``
        config, ``round_lr(r)`` sets round r's lr."""
        strategy = RoleFedAvg(self.fed, role, fraction_train=self.cfg["fraction-train"],
                              seed=self.cfg["seed"] + seed_offset)
        return run_rounds(self.fed, strategy, arrays, rounds=rounds,
                          config=self.train_config(plugins=specs_to_json(list(plugins)), **(extra_config or {})),
                          label=label, method=self.cfg["method"], after_round=after_round,
                          last_round_config=last_round_config, on_replies=on_replies, aggregate=aggregate,
                          measure_received=measure_received, round_lr=round_lr)

    def load_given_original(self) -> tuple[ModelState, dict] | None:
        """``original-model``: the operator's trained model, checked against the task's model (keys,
        shapes) before any node works, and ``{"path", "sha256"}`` of its file; None where not given."""
        path = os.path.abspath(os.path.expanduser(self.cfg["original-model"])) if self.cfg["original-model"] else ""
        if not path:
            return None
        if self.method.own_original(self.cfg):
            raise ConfigError(f"run-config 'original-model': method '{self.cfg['method']}' trains its own original "
                              "(its pretraining differs from FedAvg), so it cannot start from a given model")
        expected = self.cfg.task.server_model(self.cfg, []).state_dict()
        try:
            state, digest = self.cfg.task.read_original(self.cfg, path) or (load_state_file(path), sha256_of(path))
            state = expected if state is None else match_state(state, expected)
        except ValueError as err:
            raise ConfigError(f"run-config 'original-model'={self.cfg['original-model']!r} {err}") from None
        record = {"path": path, "sha256": digest}
        self.say(f"original: the given model {path} (sha256 {record['sha256'][:16]}…); nothing is pretrained")
        return ModelState(ArrayRecord(state)), record

    def original(self) -> ModelState:
        """The original model: the given one (``original-model``; pretraining costs nothing), else
        ``pretrain-rounds`` of FedAvg on all clients (cached)."""
        if self.given_original is None:
            return self.cached_fedavg("original", "all", self.cfg["pretrain-rounds"])
        model, record = self.given_original
        self.model_ids["original"] = "given-" + record["sha256"][:32]  # what anything keyed by it is built on
        self.built_cost["original"] = self.fed.start_phase("pretrain").as_dict()
        return model

    def fresh_model(self) -> ArrayRecord:
        """The starting weights of the original and the retrain oracle, seeded by ``init-seed``."""
        return ArrayRecord(self.cfg.task.server_model(self.cfg, [], seed=self.cfg.init_seed).state_dict())

    def cached_fedavg(self, kind: str, role: str, rounds: int) -> ModelState:
        """Original (role all) or retrain (role retain) model: from the cache, else trained and stored.

        The phase cost is what it took this run; ``built_cost[kind]`` is what building the model
        cost when it was trained (read back from the cache), which comparisons against it use.
        A model trained while clients failed is ``degraded`` (its cost lists the failures) and is
        not cached: a later run builds it again instead of reusing a model that missed clients.
        """
        federation = [{"client-id": n.client_id, **n.counts, **({"data-id": n.data_id} if n.data_id else {})}
                      for n in sorted(self.fed.nodes.values(), key=lambda n: n.client_id)]
        key = {**cache.model_key(kind, self.cfg, federation, self.data_id), **self.cfg.task.cache_key(self.cfg),
               **(self.method.own_original(self.cfg) if kind == "original" else {})}
        self.model_ids[kind] = cache.entry_id(key)
        cost = self.fed.start_phase("pretrain" if kind == "original" else "retrain")
        started = time.perf_counter()
        cached = cache.load(self.cfg, key) if self.data_id else None
        recorder, previous = self.history_recorder(kind), None
        if cached is not None and recorder is not None and not self.load_history(kind, recorder.interval):
            self.say(f"{kind} model cached without the update history method '{self.cfg['method']}' needs: "
                     "pretraining again to record it")
            previous, cached = cached[0], None
        if cached is not None:
            arrays, self.built_cost[kind] = cached
            self.say(f"{kind} model found in the cache")
        else:
            self.say(f"{kind}: {rounds} FedAvg rounds on '{role}' data")
            failed_before = len(cost.failures)
            arrays = self.fedavg(self.fresh_model(), role, rounds, kind,
                                 round_lr=scheduled_lr(self.cfg["lr-schedule"], self.cfg["lr"], rounds),
                                 last_round_config=self.keep_config(kind),
                                 on_replies=recorder.record if recorder else None,
                                 aggregate=self.method.pretraining_aggregate(self.cfg) if kind == "original" else None,
                                 extra_config=self.method.pretraining_config(self.cfg, self.model_ids[kind])
                                 if kind == "original" else None)
            cost.seconds += time.perf_counter() - started
            self.built_cost[kind] = cost.as_dict()
            if recorder is not None:
                self.pretraining.update({"update-history": recorder.rounds, "history_bytes": None})
            if len(cost.failures) > failed_before:
                log.warning("%s model is degraded (trained while client(s) %s failed): not cached", kind,
                            self.fed.describe(cost.failures[failed_before:]))
            elif self.data_id:
                if previous is not None and not same_model(ModelState(previous), ModelState(arrays)):
                    log.warning("%s model trained again for its history differs from the cached one; the cache "
                                "now holds the new one, which the history belongs to", kind)
                self.say(f"{kind} model cached at {cache.store(self.cfg, key, arrays, self.built_cost[kind])}")
                if recorder is not None:
                    self.pretraining["history_bytes"] = history.store(cache.cache_dir(self.cfg),
                                                                      self.model_ids[kind], recorder)
            return ModelState(arrays)
        cost.seconds += time.perf_counter() - started
        return ModelState(arrays)

    def seconds_outside(self, phase: str) -> float:
        return sum(cost.seconds for name, cost in self.fed.costs.items() if name != phase)

    def load_history(self, kind: str, interval: int) -> bool:
        """Load the cached update history of the ``kind`` model into ``pretraining``; False if there is none."""
        found = history.load(cache.cache_dir(self.cfg), self.model_ids[kind], interval)
        if found is not None:
            self.pretraining["update-history"], self.pretraining["history_bytes"] = found
        return found is not None

    def history_recorder(self, kind: str) -> history.UpdateHistory | None:
        """A recorder of pretraining's rounds when the run's method needs ``update-history``
        (only then: the history is as large as ``rounds / interval`` x clients models)."""
        if kind != "original" or "update-history" not in method_spec(self.cfg["method"]).needs:
            return None
        return history.UpdateHistory(self.method.history_interval(self.cfg), self.fed.client_id)

    def keep_config(self, kind: str) -> dict | None:
        """What the last pretraining round asks clients to keep (``strategies.registry.pretraining_keeps``):
        ``keep-model-as`` = the original's id, under which each client stores its last local model."""
        keeps = pretraining_keeps(self.cfg.task.kind) if kind == "original" else ()
        return {"keep-model-as": self.model_ids[kind]} if "last-local-model" in keeps else None

    def retrain(self) -> ModelState:
        if self._retrain is None:
            previous = self.fed.phase
            self._retrain = self.cached_fedavg("retrain", "retain", self.cfg.rounds_of_retrain)
            self.fed.start_phase(previous)
        return self._retrain

    def continue_training(self, start: ModelState) -> tuple[ModelState | None, list[float], list[dict], int | None]:
        """``continue-rounds`` of FedAvg on retained data, the model measured after each round.

        Round r's model is measured inside round r + 1 (:class:`ReceivedModelMeasure`: the nodes
        evaluate the model they receive), and the last round's model is returned, not evaluated:
        the run evaluates it with its final models, in their one round. So continued training
        adds no evaluation round (on Flower's Deployment Engine every round is a fresh ClientApp
        process per node). The last model is ``None`` when there were no rounds or training
        diverged. Also returns the KR curve of the rounds before the last, the state after every
        round (for RT) and the round at which training diverged (``None`` if it did not). A round
        that produces a non-finite model ends the curve there: the curve holds the rounds before
        it, so no figure is ever computed from a dead model.
        """
        cost = self.fed.start_phase("continue")
        started, states, last = time.perf_counter(), [], []
        rounds, measure = self.cfg["continue-rounds"], ReceivedModelMeasure(self.fed, self.cfg, start.plugins)

        def keep(round_no: int, arrays: ArrayRecord) -> None:
            states.append(arrays.to_torch_state_dict())
            if round_no == rounds:
                last.append(ModelState(arrays, start.plugins))

        diverged_at = None
        try:
            self.fedavg(start.arrays, "retain", rounds, "continue", plugins=start.plugins, seed_offset=1,
                        after_round=keep, measure_received=measure,
                        extra_config={"scope": "base"} if start.plugins and self.cfg["continue-plugins"] == "frozen"
                        else None)
        except ModelDiverged as err:
            diverged_at = err.round_no
            log.warning("validity: %s; the KR curve ends with a diverged mark at round %d, CT-KR and RR are "
                        "not computed", err, diverged_at)
        cost.seconds += time.perf_counter() - started
        return (last[0] if last else None), [entry["forget_acc"] for entry in measure.entries], states, diverged_at

    # --- the whole run --------------------------------------------------------------------
    def unlearn_context(self, start: ModelState, start_id: str) -> UnlearnContext:
        """What a method unlearns from: ``start`` (cached as ``start_id``), this run's federation,
        config and pretraining; server models are built from the config current when called."""
        return UnlearnContext(self.fed, self.cfg, start, original_id=start_id, pretraining=self.pretraining,
                              model_factory=lambda plugins: self.cfg.task.server_model(self.cfg, plugins),
                              retrain=self.retrain)

    def run(self) -> str:
        if is_stream(self.cfg):
            from server_app.stream import run_stream

            return run_stream(self)
        self.setup()
        original = self.original()
        require_finite(original.arrays, phase="pretrain", round_no=self.cfg["pretrain-rounds"], method="original")
        ctx = self.unlearn_context(original, self.model_ids["original"])

        self.say(f"unlearn: method '{self.method.name}'")
        cost = self.fed.start_phase("unlearn")
        started, elsewhere = time.perf_counter(), self.seconds_outside("unlearn")
        result = self.method.unlearn(ctx)
        require_finite(result.model.arrays, phase="unlearn", round_no=cost.rounds, method=self.method.name)
        # seconds a method spent in another phase meanwhile (Exact-Fun's "verify") are that phase's
        cost.seconds += time.perf_counter() - started - (self.seconds_outside("unlearn") - elsewhere)
        if result.built:  # the unlearned model is a cached build: its unlearning cost is what building it cost
            cost.seconds, cost.rounds, cost.bytes_up, cost.bytes_down = (
                self.built_cost[result.built][k] for k in ("seconds", "rounds", "bytes_up", "bytes_down"))
        self.say(f"unlearn done in {cost.seconds:.1f}s, {cost.bytes_up + cost.bytes_down} bytes")

        oracle = self.cfg["retrain-oracle"] or result.built == "retrain"
        if oracle:
            retrain = self.retrain()
            require_finite(retrain.arrays, phase="retrain", round_no=self.cfg.rounds_of_retrain, method="retrain")
        else:
            self.say("retrain oracle: off (retrain-oracle=false); the figures that compare with it are not given")
        final = {"original": original, "unlearned": result.model}
        if oracle and result.built != "retrain":  # else the unlearned model is the retrain model: evaluated once
            final["retrain"] = retrain
        if self.method.reversible:
            self.say("restore: unplugging")
            self.fed.start_phase("restore")
            final["restored"] = self.method.restore(result.model, ctx)

        self.say(f"continue: {self.cfg['continue-rounds']} rounds on retained data")
        continued, curve, states, diverged_at = self.continue_training(result.model)
        if continued is not None:
            final["continued"] = continued
        self.say(f"evaluate: {', '.join(final)} models, in one round")
        feats = {name: {} if self.cfg["diagnostic-samples"] and (oracle or name != "retrain") else None
                 for name in ("original", "retrain", "unlearned")}
        evaluated = evaluate_models(self.fed, self.cfg, final, feats)
        retrain_entry = evaluated.get("retrain")
        if retrain_entry is None and oracle:
            retrain_entry = copy.deepcopy(evaluated["unlearned"])
            if feats["retrain"] is not None:
                feats["retrain"].update(feats["unlearned"])
        models = {"original": evaluated["original"], "unlearned": evaluated["unlearned"]}
        if diverged_at is not None:
            models["continued"] = {"diverged_at_round": diverged_at}
        elif continued is None:  # no continued rounds: the continued model is the unlearned one
            models["continued"] = copy.deepcopy(evaluated["unlearned"])
        else:
            models["continued"] = evaluated["continued"]
            curve.append(models["continued"]["forget_acc"])
        if "restored" in evaluated:
            models["restored"] = evaluated["restored"]
            models["restored"]["equals_original"] = same_model(final["restored"], original)
        kr_retrain = retrain_entry["forget_acc"] if oracle else None
        rollback = rollback_tendency(original.arrays.to_torch_state_dict(),
                                     result.model.arrays.to_torch_state_dict(), states) if states else []
        self.cfg.task.finish_entries(list(models.values()), retrain_entry if oracle else {})

        resurfacing = resurfacing_summary(kr_original=models["original"]["forget_acc"],
                                          kr_unlearned=models["unlearned"]["forget_acc"],
                                          kr_retrain=kr_retrain, kr_curve=curve, diverged_at_round=diverged_at)
        checks = validity(original=models["original"], unlearned=models["unlearned"], retrain=retrain_entry,
                          num_classes=self.cfg.num_classes, diverged_at_round=diverged_at)
        for reason in checks["reasons"]:
            log.warning("validity: %s", reason)
        kept = {name: final[name] for name in ("original", "unlearned", "continued") if name in final}
        return self.report(models, resurfacing, result.details, rollback, feats, checks, kept)

    def report(self, models: dict, resurfacing: dict, details: dict, rollback: list[float],
               feats: dict, checks: dict, kept: dict[str, ModelState]) -> str:
        """Write the run's folder: results.json, receipt.json, the CSV row, the plots, and every model the
        run made (``kept``: original, unlearned, continued) as safetensors under ``models/``."""
        cfg = self.cfg.as_dict()
        folder = run_folder(cfg["outputs-dir"], cfg)
        os.makedirs(folder, exist_ok=True)
        model_files = write_models(folder, kept, self.method.reversible)
        diagnostics = {"rollback_tendency": rollback}
        if all(f and len(f["forget"]) for f in feats.values()):
            diagnostics["forgetting_dispersion"] = {name: forgetting_dispersion(f["forget"])
                                                    for name, f in feats.items()}
            pca_scatter_png(os.path.join(folder, "features_pca.png"),
                            {name: (f["retain"], f["forget"]) for name, f in feats.items()})
        results = {
            "run": {"task": cfg["task"], "method": cfg["method"], "scenario": cfg["scenario"],
                    "own_original": self.method.own_original(self.cfg) or None,
                    "original_model": self.given_original[1] if self.given_original else None,
                    "seed": cfg["seed"], "init_seed": self.cfg.init_seed, "num_clients": self.fed.num_clients,
                    "forget_clients": [self.fed.client_id(n) for n in self.fed.nodes_with("n-forget")],
                    "config": cfg, "presets": self.cfg.presets, "recipe": self.cfg.recipe,
                    "recipe_settings": self.cfg.recipe_settings, "versions": package_versions()},
            "request": request_record(self.fed, self.cfg),
            "models": models,
            "resurfacing": resurfacing,
            "validity": checks,
            "failures": [failure for cost in self.fed.costs.values() for failure in cost.failures],
            "saw_fewer_clients": saw_fewer_clients(self.fed),
            "cost": {**{name: self.fed.cost(name).as_dict()
                        for name in ("pretrain", "retrain", "unlearn", "continue", "evaluate")},
                     **{name: cost.as_dict() for name, cost in self.fed.costs.items() if name == "verify"},
                     "built": self.built_cost},
            "diagnostics": diagnostics,
            "method": details,
            "model_files": model_files,
            "seconds_total": round(time.perf_counter() - self.started, 3),
        }
        path = write_results(folder, results)
        write_receipt(folder, results)
        append_csv(cfg["outputs-dir"], results, folder)
        plot_kr_curve(folder, resurfacing, f"{cfg['method']} / {cfg['scenario']} / {cfg['task']}")
        self.say(f"results: {path}")
        return folder
