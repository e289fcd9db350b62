"""A stream of deletion requests (run-config ``requests``) answered in order over one federation.

The federation is set up once (``tasks.stream``: every requested client poisoned, every requested
sample set triggered, before the original is trained or given). Then for each request ``k``: the
method unlearns it from the current model; ``continue-rounds`` of plain FedAvg train on the data
retained so far; the next request starts from the continued model (from the unlearned one where
no round ran or training diverged). Every message names its request (``Federation.request_index``),
so each client answers with its view of that request.

``results.json`` gets ``requests``: one entry per request with the request, the method's details,
its ``models`` (``start``: the model it started from, ``unlearned``, ``continued``, and for a method
that stacks its plug-ins ``restored``: the stream's last model with this request's plug-ins removed
alone, its ``forget_acc_by_request`` showing what stays removed), its ``resurfacing`` (its own KR
curve, and ``after``: its forget accuracy measured after this and every later phase), ``cost``,
``validity``, ``saw_fewer_clients`` (its models whose phase lost a node) and ``model_files``. The run's single-request keys (``models``, ``resurfacing``,
``validity``, ``method``) are the last request's (``models.original``: the model it started from);
``cost`` sums every request's phases; ``saw_fewer_clients`` names the original and every request's models
that lost a node (``request k unlearned``).
"""

from __future__ import annotations

import copy
import os
import time

from flwr.app import ArrayRecord, ConfigRecord

from core.config import ConfigError
from server_app.evaluation import evaluate_models
from server_app.model_files import FOLDER, same_model, write_model, write_models
from server_app.receipt import request_record, write_receipt
from server_app.report import (
    append_csv,
    package_versions,
    plot_kr_curve,
    run_folder,
    saw_fewer_clients,
    write_results,
)
from strategies.common.base import ModelState
from strategies.common.fedavg_rounds import require_finite
from strategies.common.federation import PhaseCost
from strategies.registry import method_spec
from tasks.diagnostics import resurfacing_summary
from tasks.model import PLUGIN_PREFIX
from tasks.stream import Request, parse_requests, request_config
from tasks.validity import validity

PHASES = ("pretrain", "retrain", "unlearn", "continue", "evaluate")


def _add(total: PhaseCost, part: PhaseCost) -> None:
    total.seconds += part.seconds
    total.rounds += part.rounds
    total.bytes_up += part.bytes_up
    total.bytes_down += part.bytes_down
    total.failures += part.failures


class Stream:
    """The requests of one run and what answering each gave; drives an ``Experiment``'s phases."""

    def __init__(self, exp):
        self.exp, self.fed = exp, exp.fed
        self.base = exp.cfg
        self.requests: list[Request] = parse_requests(self.base)
        self.views: dict[int, dict] = {}  # request index -> the nodes' hello (counts of that view)
        self.entries: list[dict] = []
        self.added: list[list[int]] = []  # the plug-in indices each request added
        self.unlearned: list[ModelState] = []
        self.totals: dict[str, PhaseCost] = {}

    def use(self, index: int) -> None:
        """Make request ``index`` (0: before any request) the one messages, counts and config are about."""
        self.fed.request_index = index
        self.fed.nodes = self.views[index]
        self.exp.cfg = request_config(self.base, index)

    def name(self, index: int) -> str:
        return f"request {index} ({self.requests[index - 1].label()})"

    # --- before any work ----------------------------------------------------------------------
    def setup(self) -> None:
        """The run's setup with the federation as set up, then one hello per request: each must select
        forget data and leave retained data (one ConfigError line before any training)."""
        exp = self.exp
        if exp.method.own_original(self.base) or method_spec(self.base["method"]).needs:
            raise ConfigError(f"run-config 'requests': method '{self.base['method']}' needs what the original's own "
                              "pretraining kept, which a later request's starting model does not have: it answers "
                              "one request per run")
        self.fed.request_index = 0
        exp.setup()
        self.base = exp.cfg  # parsed with the federation's size
        self.views[0] = dict(self.fed.nodes)
        for index in range(1, len(self.requests) + 1):
            self.fed.request_index = index
            self.exp.cfg = request_config(self.base, index)
            self.fed.hello(ConfigRecord({}))
            self.views[index] = dict(self.fed.nodes)
            exp.check_request(self.name(index))
        self.use(0)

    # --- one request ------------------------------------------------------------------------
    def answer(self, index: int, start: ModelState, start_id: str) -> ModelState:
        """Unlearn request ``index`` from ``start``, continue training, evaluate; the next start."""
        exp, fed = self.exp, self.fed
        self.use(index)
        asked = request_record(fed, exp.cfg)  # this request's view: each client's removed samples and their hash
        exp._retrain = None
        outer, fed.costs = fed.costs, {}
        ctx = exp.unlearn_context(start, start_id)
        exp.say(f"unlearn {self.name(index)}: method '{exp.method.name}'")
        cost = fed.start_phase("unlearn")
        started = time.perf_counter()
        result = exp.method.unlearn(ctx)
        require_finite(result.model.arrays, phase="unlearn", round_no=cost.rounds, method=exp.method.name)
        cost.seconds += time.perf_counter() - started
        self.added.append(list(range(len(start.plugins), len(result.model.plugins))))
        self.unlearned.append(result.model)
        final = {"start": start, "unlearned": result.model}
        if exp.cfg["retrain-oracle"] or result.built == "retrain":
            final["retrain"] = exp.retrain()
        else:
            exp.say("retrain oracle: off (retrain-oracle=false); the figures that compare with it are not given")
        exp.say(f"continue {self.name(index)}: {exp.cfg['continue-rounds']} rounds on the data retained so far")
        continued, curve, _, diverged_at = exp.continue_training(result.model)
        if continued is not None:
            final["continued"] = continued
        evaluated = evaluate_models(fed, exp.cfg, final)
        models = {name: evaluated[name] for name in ("start", "unlearned")}
        if diverged_at is not None:
            models["continued"] = {"diverged_at_round": diverged_at}
        else:
            models["continued"] = copy.deepcopy(evaluated.get("continued", evaluated["unlearned"]))
            if continued is not None:
                curve.append(models["continued"]["forget_acc"])
        if exp.method.reversible:  # undoing it at once gives the model it started from, bit for bit
            models["unlearned"]["restore_equals_start"] = same_model(exp.method.restore(result.model, ctx), start)
        retrain = evaluated.get("retrain")  # None without the oracle
        exp.cfg.task.finish_entries(list(models.values()), retrain or {})
        resurfacing = resurfacing_summary(kr_original=models["start"]["forget_acc"],
                                          kr_unlearned=models["unlearned"]["forget_acc"],
                                          kr_retrain=retrain["forget_acc"] if retrain else None, kr_curve=curve,
                                          diverged_at_round=diverged_at)
        resurfacing["after"] = [{"request": index, "phase": "unlearn", "forget_acc": models["unlearned"]["forget_acc"]}]
        if "forget_acc" in models["continued"]:
            resurfacing["after"].append({"request": index, "phase": "continue",
                                         "forget_acc": models["continued"]["forget_acc"]})
        checks = validity(original=models["start"], unlearned=models["unlearned"], retrain=retrain,
                          num_classes=exp.cfg.num_classes, diverged_at_round=diverged_at)
        nxt = continued if continued is not None else result.model
        self.measure_earlier(index, {"unlearn": result.model, "continue": continued})
        self.entries.append({"request": asked, "method": result.details,
                             "models": models, "resurfacing": resurfacing, "validity": checks,
                             "saw_fewer_clients": saw_fewer_clients(fed, ("retrain", "unlearned", "continued")),
                             "cost": {name: c.as_dict() for name, c in fed.costs.items()},
                             "kept": {"unlearned": result.model, **({"continued": continued} if continued else {})}})
        for name, part in fed.costs.items():
            _add(outer.setdefault(name, PhaseCost()), part)
        fed.costs = outer
        return nxt

    def measure_earlier(self, index: int, after: dict[str, ModelState | None]) -> None:
        """Every earlier request's forget accuracy on the models request ``index``'s phases left
        (resurfacing of what was removed before), one evaluate round per earlier request."""
        models = {phase: model for phase, model in after.items() if model is not None}
        for earlier in range(1, index):
            self.use(earlier)
            evaluated = evaluate_models(self.fed, self.exp.cfg, models)
            self.entries[earlier - 1]["resurfacing"]["after"] += [
                {"request": index, "phase": phase, "forget_acc": entry["forget_acc"]} for phase, entry in evaluated.items()]
        self.use(index)

    def restore_each(self, last: ModelState) -> dict[int, ModelState]:
        """For a method that stacks: the stream's last model with each request's plug-ins removed
        alone, measured on every request (``forget_acc_by_request``)."""
        restored = {k: self.exp.method.unplug(last, self.added[k - 1]) for k in range(1, len(self.requests) + 1)}
        for view in range(1, len(self.requests) + 1):
            self.use(view)
            evaluated = evaluate_models(self.fed, self.exp.cfg, {f"restored-{k}": m for k, m in restored.items()})
            for k in restored:
                models = self.entries[k - 1]["models"]
                entry = evaluated[f"restored-{k}"]
                if k == view:
                    models["restored"] = {**entry, **models.get("restored", {})}
                models.setdefault("restored", {}).setdefault("forget_acc_by_request", {})[str(view)] = \
                    entry["forget_acc"]
        return restored

    def plugins_of(self, index: int) -> list[tuple[str, ModelState]]:
        """The plug-ins request ``index`` added, each on its own: ``(kind, its tensors and spec)``."""
        model = self.unlearned[index - 1]
        state = model.arrays.to_torch_state_dict()
        parts = []
        for position in self.added[index - 1]:
            prefix = f"{PLUGIN_PREFIX}{position}."
            spec = model.plugins[position]
            parts.append((str(spec.get("kind", f"plugin-{position}")),
                          ModelState(ArrayRecord({k: v for k, v in state.items() if k.startswith(prefix)}), [spec])))
        return parts

    # --- the whole stream -----------------------------------------------------------------------
    def run(self) -> str:
        exp = self.exp
        self.setup()
        original = exp.original()
        require_finite(original.arrays, phase="pretrain", round_no=self.base["pretrain-rounds"], method="original")
        current, current_id = original, exp.model_ids["original"]
        for index in range(1, len(self.requests) + 1):
            current = self.answer(index, current, current_id)
            current_id = f"{exp.model_ids['original']}-request-{index}"
        restored = self.restore_each(current) if exp.method.stacks else {}
        return self.report(original, restored)

    def report(self, original: ModelState, restored: dict[int, ModelState]) -> str:
        exp = self.exp
        cfg = self.base.as_dict()
        folder = run_folder(cfg["outputs-dir"], {**cfg, "scenario": "stream"})
        os.makedirs(folder, exist_ok=True)
        last = self.entries[-1]
        model_files = write_models(folder, {"original": original, **last["kept"]}, False)
        out_dir = os.path.join(folder, FOLDER)
        # each request starts from the model the one before it left
        before = {**model_files["original"], "path": os.path.join(folder, model_files["original"]["path"])}
        for index, entry in enumerate(self.entries, 1):
            files = {"before": before}
            for name, model in entry.pop("kept").items():
                files[name] = write_model(os.path.join(out_dir, f"request-{index}-{name}.safetensors"), model,
                                          f"request {index} {name}")
            if exp.method.stacks:
                for kind, part in self.plugins_of(index):
                    files[kind] = write_model(os.path.join(out_dir, f"request-{index}-{kind}.safetensors"), part,
                                              f"request {index} plug-in {kind}")
            entry["model_files"] = {name: {**f, "path": os.path.relpath(f["path"], folder)} for name, f in files.items()}
            before = files.get("continued", files["unlearned"])
        costs = {name: self.fed.cost(name).as_dict() for name in PHASES}
        results = {
            "run": {"task": cfg["task"], "method": cfg["method"], "scenario": last["request"]["scenario"],
                    "requests": [r.as_dict() for r in self.requests], "own_original": None,
                    "original_model": exp.given_original[1] if exp.given_original else None,
                    "seed": cfg["seed"], "init_seed": self.base.init_seed, "num_clients": self.fed.num_clients,
                    "config": cfg, "presets": self.base.presets, "recipe": self.base.recipe,
                    "recipe_settings": self.base.recipe_settings, "versions": package_versions()},
            "models": {("original" if name == "start" else name): entry for name, entry in last["models"].items()},
            "resurfacing": last["resurfacing"],
            "validity": last["validity"],
            "failures": [failure for cost in self.fed.costs.values() for failure in cost.failures],
            "saw_fewer_clients": {**saw_fewer_clients(self.fed, ("original",)),
                                  **{f"request {index} {model}": missed for index, entry in enumerate(self.entries, 1)
                                     for model, missed in entry["saw_fewer_clients"].items()}},
            "cost": {**costs, "built": exp.built_cost},
            "method": last["method"],
            "model_files": model_files,
            "requests": self.entries,
            "seconds_total": round(time.perf_counter() - exp.started, 3),
        }
        path = write_results(folder, results)
        write_receipt(folder, results)
        append_csv(cfg["outputs-dir"], results, folder)
        plot_kr_curve(folder, last["resurfacing"], f"{cfg['method']} / {cfg['requests']} / {cfg['task']}")
        exp.say(f"results: {path}")
        return folder


def run_stream(exp) -> str:
    """Answer the run's stream of requests (``Experiment.run`` with ``requests`` set); the results folder."""
    return Stream(exp).run()
