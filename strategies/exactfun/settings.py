"""Exact-Fun's run-config keys (``exactfun.*``). No public code is known: the defaults are this project's."""

from __future__ import annotations

from core.config import Setting, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("exactfun.step", float, 1e-3,
            "quantisation grid of Exact-Fun's global model: every weight is rounded to a multiple of this after "
            "each aggregation (its own original model is trained so)", positive()),
    setting("exactfun.verify", bool, False,
            "also retrain the quantised model from scratch without the client (phase 'verify', not charged to "
            "unlearning) and report whether the unlearned model equals it bit for bit"),
)


def check_settings(cfg) -> None:
    """Exactness needs every round to train the same clients: FedAvg must sample all of them."""
    from core.config import ConfigError

    if cfg["fraction-train"] != 1.0:
        raise ConfigError(f"run-config 'fraction-train'={cfg['fraction-train']} is not allowed for method 'exact-fun': "
                          "must be 1.0 (a sampled round would train other clients without the leaving one)")
