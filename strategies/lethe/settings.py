"""Lethe's run-config keys (``lethe-*``): amplify, rectify (and its stop and guard), restore."""

from __future__ import annotations

from tasks.config import Setting, at_least, in_range, one_of, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("lethe-gamma", float, 0.2, "rectification penalty gamma of eq. 10", positive()),
    setting("lethe-adapter-steps", int, 50, "gradient-ascent steps of the temporary adapter; 0 = no adapter",
        at_least(0)),
    setting("lethe-adapter-lr", float, 0.05,
        "length of each normalised adapter ascent step (global L2 norm of the adapter's change)", positive()),
    setting("lethe-adapter-max-loss", float, 10.0,
        "adapter ascent stops once a batch's forget loss reaches this (bounded amplification)", positive()),
    setting("lethe-lr", float, 0.01,
        "local learning rate of both streams during rectification (client and sample scenarios; the paper "
        "uses 1e-3 for CV)", positive()),
    setting("lethe-lr-class", float, 0.02, "lethe-lr of the class scenario", positive()),
    setting("lethe-epochs", int, 1, "local epochs of both streams per rectification round (paper: 1)", positive()),
    setting("lethe-gamma-mode", str, "upper",
        "fixed: lethe-gamma in every layer (paper); clamp: clipped into each layer's Prop. IV.1 bounds; "
        "upper: each layer's upper Prop. IV.1 bound (strongest forgetting it allows)",
        one_of(("fixed", "clamp", "upper"))),
    setting("lethe-step-clip", float, 1.0,
        "each rectified update is scaled to at most this x the retain stream's L2 norm (client and sample "
        "scenarios); 0 = off", at_least(0)),
    setting("lethe-step-clip-class", float, 5.0,
        "lethe-step-clip of the class scenario; 0 = off",
        at_least(0)),
    setting("lethe-clip-floor", float, 0.1,
            "lethe-step-clip is a multiple of the larger of the retain stream's norm and this x the forget stream's "
            "norm, so the bound does not vanish with the retain stream (client and sample scenarios); 0 = the "
            "retain stream alone", at_least(0)),
    setting("lethe-lift-retain", bool, True,
            "a retain stream shorter than lethe-clip-floor x the forget stream is scaled up to that length before "
            "eq. 10, so the rectified step itself (not only its bound) does not vanish when the original fits the "
            "retained data (client and sample scenarios); false = only the bound is raised"),
    setting("lethe-clip-floor-class", float, 0.0, "lethe-clip-floor of the class scenario", at_least(0)),
    setting("lethe-verify-lift", float, 0.1,
            "a verify pass (lethe-verify-passes) lifts the retain stream to at least this x the forget stream "
            "wherever lethe-lift-retain is on, whatever the scenario's lethe-clip-floor: restore has just fit the "
            "retained data, so their stream vanishes and without a lift the pass's steps do too; 0 = the "
            "scenario's floor", at_least(0)),
    setting("lethe-stop-forget-acc", float, 0.05,
            "rectification stops only once the backbone (adapter bypassed) also predicts at most this share of the "
            "forget set as its label (one evaluate message to the forget clients at the stop); 1 = not asked",
            in_range(0, 1)),
    setting("lethe-stop-at-reference-client", bool, False,
            "client scenario: rectification also stops once the backbone predicts no larger share of the forget set "
            "as the backdoor target than of the forget clients' clean local test data of the other classes (one "
            "evaluate message a round), and the verify check allows that share plus a one-sided 95 % margin"),
    setting("lethe-client-forget-stream", str, "all-data",
            "client scenario: all-data: the forget stream is all the leaving client's training data, the clean copies "
            "a backdoor client also trained included (the paper's client-level streams); forget-set: only the "
            "request's forget set (the triggered samples); the forget checks read the forget set either way, and where "
            "all-data leaves the request undone the run is made again with forget-set",
            one_of(("all-data", "forget-set"))),
    setting("lethe-max-backbone-rise", float, 0.5,
            "restore guard: while the first restore round's retained loss (the adapter-free backbone) is more than "
            "this many nats above the retained loss on the model rectification started from, one rectification step "
            "is undone", positive()),
    setting("lethe-max-backbone-rise-client", float, 2.0,
            "lethe-max-backbone-rise where the client scenario's forget stream is all the leaving client's data "
            "(lethe-client-forget-stream=all-data; vision and text tasks)", positive()),
    setting("lethe-backbone-search", int, 3,
            "restore guard: after the walk-back undid a rectification step, this many bisection probes (one round "
            "each) for the largest fraction of that step whose backbone retained loss is still within "
            "lethe-max-backbone-rise; 0 = whole steps only", at_least(0)),
    setting("lethe-backbone-search-rise", float, 0.05,
            "restore guard: a lethe-backbone-search probe passes if its retained loss is at most this many nats above "
            "the retained loss of the step the walk-back went back to (and within lethe-max-backbone-rise)",
            positive()),
    setting("lethe-retry-backbone-rise", float, 2.0,
            "where an attempt leaves the request not carried out (the original returned, or the kept model still "
            "knows the forget set), one more attempt from the original with the walk-back bound "
            "(lethe-max-backbone-rise) at this value (both keys read as their -client twins where the client "
            "scenario widens its stream), kept where it carries the request out or else knows less of the forget "
            "set than the first; at most that bound = no retry", positive()),
    setting("lethe-retry-backbone-rise-client", float, 4.0,
            "lethe-retry-backbone-rise where the client scenario's forget stream is all the leaving client's data "
            "(lethe-client-forget-stream=all-data; vision and text tasks); above that stream's walk-back bound "
            "(lethe-max-backbone-rise-client), so its retry loosens it", positive()),
    setting("lethe-restore-retries", int, 2,
            "restore guard: when restore's own guard acts (a restore step rolled back or refused), restore again from "
            "the backbone one rectification step earlier, at most this many times", at_least(0)),
    setting("lethe-verify-passes", int, 3,
            "after restore the forget clients check the restored model (it predicts at most lethe-verify-forget-acc "
            "of the forget set as its label; see lethe-stop-at-reference-client for the client scenario's "
            "alternative); while it fails, at most this many more passes of "
            "amplify, rectify and restore from it; 0 = one pass (the paper)", at_least(0)),
    setting("lethe-verify-forget-acc", float, 0.02,
            "the share of the forget set the restored model may still predict as its label "
            "(lethe-verify-passes' check), and the share a verify pass rectifies down to (a first pass stops at "
            "lethe-stop-forget-acc)", in_range(0, 1)),
    setting("lethe-rectify-rounds", int, 10, "most dual-stream rectification rounds", at_least(0)),
    setting("lethe-stop-loss", float, 12.0,
        "rectification stops once the forget clients' mean forget loss (nats, backbone without the "
        "adapter) reaches this; inf = always lethe-rectify-rounds", positive(), allow_inf=True),
    setting("lethe-max-retain-rise", float, 0.5,
        "rectification guard: a step after which the retained clients' reported loss is more than this many "
        "nats above their loss on the starting model is rolled back (and rectification stops; a pass's first step is "
        "halved first, like an overshooting one); a restore whose kept "
        "model they rate this much worse than the original runs again at half, then a quarter of the lr; a later "
        "verify pass still above it is not kept, a first pass still above it returns the original model (the "
        "request not carried out)", positive()),
    setting("lethe-max-retain-rise-client", float, 2.0,
            "lethe-max-retain-rise where the client scenario's forget stream is all the leaving client's data "
            "(lethe-client-forget-stream=all-data; vision and text tasks)", positive()),
    setting("lethe-max-fit-drop", float, 0.05,
            "utility bound beside the retained loss's: a pass whose restored model predicts its label for a share of the "
            "retained clients' training data more than this below the original's share is broken as one past "
            "lethe-max-retain-rise is (restore runs again at half the lr; a first pass still past it returns the "
            "original, a later one is not kept); one evaluate message to the retained clients per restore (rectified "
            "restore, tasks with classes); 1 = not judged", in_range(0, 1)),
    setting("lethe-restore-rounds", int, 5, "utility-recovery rounds after the adapter is dropped", at_least(0)),
    setting("lethe-restore-extra-rounds", int, 30,
        "rectified restore: while no model restore may keep (one after at least two restore steps) has a retained "
        "loss within lethe-restore-target-rise of the retained clients' loss on the model rectification started "
        "from (each the received model's loss before training, the temporary adapter bypassed), up to this many "
        "more restore rounds, each applying half its update (0 = exactly lethe-restore-rounds)", at_least(0)),
    setting("lethe-restore-target-rise", float, 0.02,
        "rectified restore: the retained loss (nats above the one on the model rectification started from, both "
        "read on the received model before training) that ends lethe-restore-extra-rounds", positive()),
    setting("lethe-restore-mode", str, "rectified",
        "fedavg: FedAvg on retained clients (paper); rectified: forget clients also train and the "
        "retain update's component along their update is removed where they align",
        one_of(("fedavg", "rectified"))),
    setting("lethe-exact-share", float, 0.8,
        "exact fallback: where the request removes at least this share of a class's training samples and the "
        "retained clients hold the rest, Lethe returns exact retraining on the retained clients instead of "
        "rectifying (method.exact_fallback; tasks with classes); 1 = never", in_range(0.5, 1)),
)


def check_settings(cfg) -> None:
    """The LLM task has no plug-in point: Lethe rectifies the LoRA adapter directly there."""
    from tasks.config import ConfigError

    if cfg.task.kind == "llm" and cfg["lethe-adapter-steps"] != 0:
        raise ConfigError(f"run-config 'lethe-adapter-steps'={cfg['lethe-adapter-steps']} is not allowed for task "
                          f"'{cfg['task']}': must be 0 (Lethe rectifies the LoRA adapter directly)")


# Keys whose good value depends on the request's scenario: the base key holds the value of the
# other scenarios, its twin (declared above) replaces it in that scenario (docs/lethe.md says why).
# The client scenario's twins apply only where its forget stream is widened (widens_client_stream).
BY_SCENARIO = {
    "class": {"lethe-lr": "lethe-lr-class", "lethe-step-clip": "lethe-step-clip-class",
              "lethe-clip-floor": "lethe-clip-floor-class"},
    "client": {"lethe-max-retain-rise": "lethe-max-retain-rise-client",
               "lethe-max-backbone-rise": "lethe-max-backbone-rise-client",
               "lethe-retry-backbone-rise": "lethe-retry-backbone-rise-client"},
}


def widens_client_stream(cfg) -> bool:
    """Is Lethe's forget stream all the leaving client's training data rather than the request's forget
    set? Client scenario with ``lethe-client-forget-stream=all-data``, on a vision or text task (an
    LLM client's forget set is already all its records)."""
    return cfg["scenario"] == "client" and cfg["lethe-client-forget-stream"] == "all-data" and cfg.task.kind != "llm"


def scenario_key(cfg, key: str) -> str:
    """The key that holds ``key``'s value in this run: its scenario's twin (:data:`BY_SCENARIO`), else ``key``."""
    if cfg["scenario"] == "client" and not widens_client_stream(cfg):
        return key
    return BY_SCENARIO.get(cfg["scenario"], {}).get(key, key)


def scenario_setting(cfg, key: str):
    """``cfg[key]``, or its twin's value in a scenario that has one (:func:`scenario_key`)."""
    return cfg[scenario_key(cfg, key)]
