"""Lethe's run-config keys (``lethe-*``): amplify, rectify (and its stop and guard), restore."""

from __future__ import annotations

from tasks.config import Setting, at_least, one_of, positive, setting

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
    setting("lethe-rectify-rounds", int, 10, "most dual-stream rectification rounds", at_least(0)),
    setting("lethe-stop-loss", float, 12.0,
        "rectification stops once the forget clients' mean forget loss (nats, backbone without the "
        "adapter) reaches this; inf = always lethe-rectify-rounds", positive(), allow_inf=True),
    setting("lethe-max-retain-rise", float, 0.5,
        "rectification guard: a step after which the retained clients' reported loss is more than this many "
        "nats above their loss on the starting model is rolled back (and rectification stops)", positive()),
    setting("lethe-restore-rounds", int, 5, "utility-recovery rounds after the adapter is dropped", at_least(0)),
    setting("lethe-restore-mode", str, "rectified",
        "fedavg: FedAvg on retained clients (paper); rectified: forget clients also train and the "
        "retain update's component along their update is removed where they align",
        one_of(("fedavg", "rectified"))),
)


def check_settings(cfg) -> None:
    """The LLM task has no plug-in point: Lethe rectifies the LoRA adapter directly there."""
    from tasks.config import ConfigError

    if cfg.task.kind == "llm" and cfg["lethe-adapter-steps"] != 0:
        raise ConfigError(f"run-config 'lethe-adapter-steps'={cfg['lethe-adapter-steps']} is not allowed for task "
                          f"'{cfg['task']}': must be 0 (Lethe rectifies the LoRA adapter directly)")
