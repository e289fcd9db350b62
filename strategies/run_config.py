"""The app's run config: the general keys, and the join of every task kind's and method's keys.

:data:`GENERAL_SETTINGS` here (what to run, the federation, local training, folders), each task
kind's settings (``tasks.registry.KIND_SETTINGS``, e.g. the LLM task's ``llm.*``) and each registered
method's settings (``MethodSpec.settings`` in its own package under ``strategies/``) are the only
keys; :func:`all_settings` joins them, and :func:`parse_config` parses a run config against them with
``core.config.parse``. The key table of `docs/settings.md` and pyproject's defaults are checked
against them by the tests, so they never drift apart. This module sits above ``tasks/`` and the
method packages (it sees both); ``core.config`` below them knows neither.

Presets and recipes. Where a task needs its own settings (``Task.presets``) or a method's paper
settings differ by task (``MethodSpec.presets``), the registration says so; a named recipe
(``recipe``, ``tasks.recipes``) adds the project's own settings on top; ``smoke=true`` shrinks every
phase to a few steps (``MethodSpec.smoke``, ``Task.smoke`` and :data:`SMOKE`). Each fills a key the
user did not set, in that rank; a key the user set always wins. ``presets=false`` turns the method's
and the task's presets off.
"""

from __future__ import annotations

import dataclasses
import os
from functools import lru_cache
from typing import Any, Iterable

from core.config import (POISONS, SCENARIOS, Config, ConfigError, Setting, at_least, one_of, open_unit, parse,
                         positive, setting)
from strategies import registry
from tasks.recipes import RecipeError, load_recipe, recipe_names
from tasks.registry import task_for, task_kinds, task_names
from tasks.stream import check_requests, is_stream

GENERAL_SETTINGS: tuple[Setting, ...] = (
    # what to run
    setting("task", str, "digits-lenet5", "dataset + model", choices=task_names),
    setting("method", str, None, "unlearning method (default: the method registered with default=True)",
            choices=registry.method_names),
    setting("scenario", str, "sample", "what is forgotten: one client, one class, or some samples",
       one_of(SCENARIOS)),
    setting("poison", str, "backdoor",
       "how the leaving client's data is made measurable (client scenario): backdoor triggers its samples (at "
       "most backdoor-share of the federation's); label-flip (a Byzantine client) costs the original clean "
       "accuracy, which the validity checks flag",
       one_of(POISONS)),
    setting("forget-client", int, -1,
       "client whose data (client/sample scenario) is forgotten; -1 = the client with the most samples",
       at_least(-1)),
    setting("poison-epochs", int, 15,
       "local epochs of the leaving client on its flipped labels while the original model is trained "
       "(client scenario, poison label-flip; a Byzantine client works harder); 0 = local-epochs", at_least(0)),
    setting("backdoor-share", float, 0.1,
       "largest share of the federation's training samples that the leaving client's triggered samples may make "
       "up (client scenario, backdoor): a larger client triggers a seeded draw of its samples; 1 = all of them",
       open_unit(True)),
    setting("forget-class", int, 3, "class removed in the class scenario", at_least(0)),
    setting("requests", str, "",
       "a stream of deletion requests answered in order over one federation, ';'-separated, each 'scenario' or "
       "'scenario:id' (the class for class, the client for client and sample), e.g. 'class:3; client:4'; "
       "empty = the one request that scenario describes (docs/architecture.md, 'A stream of requests')"),
    setting("sample-fraction", float, 0.2,
       "share of the forget client's samples that carry the backdoor (sample scenario)", open_unit(True)),
    setting("backdoor-target", int, 0, "label the backdoor trigger maps to", at_least(0)),
    setting("trigger-size", int, 8, "side in pixels of the white bottom-right trigger square", positive()),
    setting("seed", int, 42, "seed of every random choice: partitions, requests, init, sampling",
       ((lambda v: 0 <= v < 2**32), "in 0..4294967295")),  # numpy needs >= 0; torch overflows past 64 bits
    setting("init-seed", int, -1,
       "seed of the initial weights of the original and the retrain oracle; -1 = seed. Another value draws "
       "other models from the same data, partition and request (vision and text tasks)",
       ((lambda v: -1 <= v < 2**32), "-1 or in 0..4294967295")),
    setting("original-model", str, "",
            "start from this trained model instead of pretraining one: a safetensors file (or a weights-only PyTorch "
            "state dict) of the task's model, e.g. an earlier run's models/original.safetensors (vision and text "
            "tasks); a PEFT adapter folder or a merged Hugging Face model folder (LLM task); empty = pretrain the "
            "original with the task's FedAvg recipe"),
    # federation and training
    setting("dirichlet-alpha", float, 0.5, "Dirichlet concentration of the non-IID label split", positive()),
    setting("test-fraction", float, 0.2, "share of each client's partition kept as its local test split",
       open_unit(False)),
    setting("pretrain-rounds", int, 20, "FedAvg rounds that train the original model", positive()),
    setting("retrain-rounds", int, 0, "FedAvg rounds of the retrain oracle; 0 = pretrain-rounds", at_least(0)),
    setting("retrain-oracle", bool, True,
       "train the retrain oracle (FedAvg from scratch on the retained data) as the reference; false = skip it (an "
       "operator rarely can afford it): results.json validity.missing lists the figures that compare with it"),
    setting("continue-rounds", int, 10, "FedAvg rounds on retained data after unlearning (resurfacing)",
       at_least(0)),
    setting("continue-plugins", str, "frozen",
       "a method's plug-ins (FedUP's filter, FUSED's adapters) in continued rounds: 'frozen' = kept as the "
       "method left them, the base trains; 'trained' = trained with the base", one_of(("frozen", "trained"))),
    setting("local-epochs", int, 3, "local epochs per training round", positive()),
    setting("lr-schedule", str, "constant",
       "client lr over the rounds that build the original and the retrain oracle: 'constant' = lr in every "
       "round; 'cosine' = lr * (1 + cos(pi * (r - 1) / R)) / 2 in round r of R (vision and text tasks)",
       one_of(("constant", "cosine"))),
    setting("batch-size", int, 32, "local mini-batch size", positive()),
    setting("lr", float, 0.05, "local SGD learning rate", positive()),
    setting("momentum", float, 0.9, "local SGD momentum", at_least(0)),
    setting("max-grad-norm", float, 100.0,
       "clip of the gradient norm in local cross-entropy training (pretraining, the retrain oracle, continued "
       "rounds; vision and text tasks); 0 = no clip", at_least(0)),
    setting("fraction-train", float, 1.0, "share of eligible clients sampled per training round",
       open_unit(True)),
    setting("min-reply-fraction", float, 0.5,
       "a round goes on when at least this share of the nodes it asked replied", open_unit(True)),
    setting("round-timeout", float, 600.0, "seconds to wait for the replies of one round", positive()),
    # where things go
    setting("data-dir", str, "", "folder of real datasets (MNIST/CIFAR); empty = ~/.cache/fedunlearn/data"),
    setting("download", bool, False, "allow torchvision to download missing datasets"),
    setting("cache-dir", str, "", "cache of original/retrained models; empty = ~/.cache/fedunlearn/models"),
    setting("outputs-dir", str, "outputs", "folder that receives results.json, results.csv and plots"),
    setting("mia-max-samples", int, 200, "per client and set, samples whose confidence feeds the MIA",
       positive()),
    setting("diagnostic-samples", int, 50,
       "per client and set, penultimate features sent for the FD/PCA diagnostics; 0 = off",
       at_least(0)),
    setting("recipe", str, "",
            "a named recipe of the project's own settings on top of the method's paper defaults "
            "(recipes/<name>.toml, e.g. lethe-robust); empty = the paper's method",
            choices=lambda: ("", *recipe_names())),
    setting("presets", bool, True,
            "apply the presets the task and the method registered (their measured settings there; digits-lenet5: "
            "pretrain-rounds=60 local-epochs=1 continue-rounds=30) to the keys the user did not set; false = the "
            "global defaults"),
    setting("smoke", bool, False,
       "smoke run for CI: every phase runs, with a few rounds, epochs and steps (presets of each method and task); "
       "keys given explicitly still win"),
)

# What ``smoke=true`` sets for every run (methods and tasks add their own: ``MethodSpec.smoke``, ``Task.smoke``).
SMOKE: dict[str, Any] = {"pretrain-rounds": 2, "continue-rounds": 1, "local-epochs": 1, "mia-max-samples": 50,
                         "diagnostic-samples": 0}



@lru_cache(maxsize=1)
def all_settings() -> tuple[Setting, ...]:
    """Every key: the general ones, each task kind's, each registered method's (in that order)."""
    default_method = next(spec.name for spec in registry.all_methods() if spec.default)
    found = [dataclasses.replace(s, default=default_method) if s.key == "method" else s for s in GENERAL_SETTINGS]
    for kind in task_kinds():
        found += kind.settings
    for spec in registry.all_methods():
        found += spec.settings
    keys = [s.key for s in found]
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    if repeated:
        raise RuntimeError(f"run-config key(s) declared twice: {', '.join(repeated)}")
    return tuple(found)


def settings_by_key() -> dict[str, Setting]:
    return {s.key: s for s in all_settings()}



def _presets(values: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The values that fill the keys the user did not set, in rising rank: the task's presets
    (``Task.presets``) and the method's, the recipe's (for this scenario and task kind), the smoke
    settings when ``smoke`` is on. Returns them and the keys whose value is the recipe's."""
    task, spec = task_for(values["task"]), registry.method_spec(values["method"])
    presets: dict[str, Any] = {}
    if values["presets"]:
        presets = {**task.presets, **spec.presets.get(task.name, spec.presets.get(task.kind, {}))}
    recipe_keys: set[str] = set()
    if values["recipe"]:
        try:
            recipe = load_recipe(values["recipe"])
        except RecipeError as err:
            raise ConfigError(f"run-config 'recipe'={values['recipe']!r}: {err}") from None
        if values["method"] not in recipe.methods:
            raise ConfigError(f"run-config 'recipe'={values['recipe']!r} is for method {', '.join(recipe.methods)}, "
                              f"not {values['method']!r}")
        filled = recipe.values_for(values["scenario"], task.kind)
        unknown = sorted(set(filled) - set(settings_by_key()))
        if unknown:
            raise ConfigError(f"run-config 'recipe'={values['recipe']!r} sets unknown key {unknown[0]!r}")
        presets.update(filled)
        recipe_keys = set(filled)
    if values["smoke"]:
        smoke = {**SMOKE, **task.smoke, **spec.smoke}
        presets.update(smoke)
        recipe_keys -= set(smoke)
    return presets, recipe_keys



def parse_config(run_config: dict[str, Any], num_clients: int | None = None,
                 given: Iterable[str] | None = None, on_node: bool = False) -> Config:
    """Validate ``run_config`` (unknown keys rejected, missing keys defaulted, presets filled into
    keys the user did not set) into a :class:`Config`.

    ``num_clients`` enables the checks that need the federation size (the forget client).
    ``given``: the keys the user set where ``run_config`` holds every key (``core.config.parse``).
    ``on_node``: parsed by a client, which skips the checks of files only the server reads.
    """
    cfg = parse(run_config, all_settings(), ("task", "method", "presets", "smoke", "recipe", "scenario"), _presets,
                task_for, given)
    _check_combinations(cfg, num_clients, on_node)
    return cfg


def _check_combinations(cfg: Config, num_clients: int | None, on_node: bool = False) -> None:
    """What the task, the method and the federation allow together (each a one-line error)."""
    task, spec = cfg.task, registry.method_spec(cfg["method"])
    task.check_config(cfg)
    if task.kind not in spec.task_kinds:
        needed = [f"{k.kind} ({', '.join(k.names)})" for k in task_kinds() if k.kind in spec.task_kinds]
        fitting = ", ".join(registry.methods_for_task(task))
        raise ConfigError(f"run-config 'method'={cfg['method']!r} needs a task of kind {' or '.join(needed)}, not "
                          f"task '{task.name}': for it, method must be one of {fitting}")
    if cfg["scenario"] not in spec.scenarios and not is_stream(cfg):  # a stream checks its own
        raise ConfigError(f"run-config 'scenario'={cfg['scenario']!r} is not supported by method "
                          f"'{cfg['method']}': must be one of {', '.join(spec.scenarios)}")
    if cfg["lr-schedule"] != "constant" and "update-history" in spec.needs:
        raise ConfigError(f"run-config 'lr-schedule'={cfg['lr-schedule']!r}: method '{cfg['method']}' replays "
                          "pretraining's rounds at the constant lr; it takes 'constant'")
    if cfg["original-model"]:
        if spec.needs:
            raise ConfigError(f"run-config 'original-model': method '{cfg['method']}' needs what its own pretraining "
                              f"kept ({', '.join(spec.needs)}), which a model trained elsewhere does not bring")
        if not on_node or task.original_model_on_nodes:  # a path on the server's host, unless nodes read it too
            task.check_original_model(cfg, os.path.abspath(os.path.expanduser(cfg["original-model"])))
    if spec.check is not None:
        spec.check(cfg)
    if is_stream(cfg) and task.kind == "llm":
        raise ConfigError(f"run-config 'requests' (a stream of requests) is not supported on task '{task.name}' "
                          "yet: it takes a vision or text task")
    check_requests(cfg, spec.scenarios, cfg.num_classes, num_clients)
    if num_clients is not None:
        if num_clients < 2:
            raise ConfigError(f"the federation has {num_clients} client(s): at least 2 are needed")
        if cfg["forget-client"] >= num_clients:
            raise ConfigError(f"run-config 'forget-client'={cfg['forget-client']} is outside the "
                              f"federation: must be -1 (largest) or in 0..{num_clients - 1}")


def inapplicable_settings(cfg: Config) -> list[str]:
    """Keys set away from their default that this run's task or method never reads, each as
    ``key (<owner> only)``, e.g. ``llm.lr (task llm-tofu only)`` on a vision task."""
    kind_of_key = {s.key: kind for kind in task_kinds() for s in kind.settings}
    readers = registry.readers_of()
    out = []
    for declared in all_settings():
        key = declared.key
        if cfg[key] == declared.default:
            continue
        if key in kind_of_key and kind_of_key[key].kind != cfg.task.kind:
            out.append(f"{key} (task {'/'.join(kind_of_key[key].names)} only)")
        elif key in readers and cfg["method"] not in readers[key]:
            out.append(f"{key} (method {'/'.join(readers[key])} only)")
    return out

