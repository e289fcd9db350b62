"""Lethe's run-config keys (``lethe.*``): the paper's Algorithm 1 and nothing else.

The paper (section IV, Algorithm 1) names γ, S_φ, T and R and the local training of the two streams;
it gives no values for γ, S_φ, T, R or η_φ, and one learning rate (1e-3) for every CV training it
runs. ``docs/lethe.md`` ("Paper / here") lists how each default here was set. The project's own
guards around Lethe are not Lethe's keys: they are ``guard.*`` keys (``strategies.common.guards``),
off by default and switched on together by ``recipe='lethe-robust'`` (``recipes/lethe-robust.toml``).
"""

from __future__ import annotations

from core.config import ConfigError, Setting, at_least, positive, setting
from strategies.common.guards import GUARD_SETTINGS

LETHE_SETTINGS: tuple[Setting, ...] = (
    setting("lethe.gamma", float, 0.2,
            "γ of eq. 10: the rectified update is Δr − γ·Δu in every layer where the streams align", positive()),
    setting("lethe.adapter-steps", int, 50, "S_φ: gradient-ascent steps of the temporary adapter (eq. 6); 0 = no adapter",
            at_least(0)),
    setting("lethe.adapter-lr", float, 0.0, "η_φ: the adapter's ascent step size (eq. 6); 0 = the run's lr", at_least(0)),
    setting("lethe.lr", float, 0.0,
            "local learning rate of both streams during rectification; 0 = the run's lr (the paper trains and "
            "unlearns at one lr)", at_least(0)),
    setting("lethe.epochs", int, 1, "local epochs of both streams per rectification round (paper: 1)", positive()),
    setting("lethe.rectify-rounds", int, 10, "T: dual-stream rectification rounds", at_least(0)),
    setting("lethe.restore-rounds", int, 5, "R: FedAvg rounds on the retained clients after the adapter is dropped",
            at_least(0)),
)

#: what Lethe registers: its own keys, then the guards it honours
SETTINGS: tuple[Setting, ...] = LETHE_SETTINGS + GUARD_SETTINGS


def check_settings(cfg) -> None:
    """The LLM task has no plug-in point: Lethe rectifies the LoRA adapter directly there."""
    if cfg.task.kind == "llm" and cfg["lethe.adapter-steps"] != 0:
        raise ConfigError(f"run-config 'lethe.adapter-steps'={cfg['lethe.adapter-steps']} is not allowed for task "
                          f"'{cfg['task']}': must be 0 (Lethe rectifies the LoRA adapter directly)")


def rectify_lr(cfg) -> float:
    """The streams' local lr: ``lethe.lr``, or the run's ``lr`` where it is 0."""
    return cfg["lethe.lr"] or cfg["lr"]


def adapter_lr(cfg) -> float:
    """The adapter's ascent step: ``lethe.adapter-lr``, or the run's ``lr`` where it is 0."""
    return cfg["lethe.adapter-lr"] or cfg["lr"]


def widens_client_stream(cfg) -> bool:
    """Is Lethe's forget stream all the leaving client's training data rather than the request's forget
    set? The client scenario on a vision or text task: the paper builds the client-level forget stream
    from all the unlearning client's data; an LLM client's forget set is already all its records."""
    return cfg["scenario"] == "client" and cfg.task.kind != "llm"
