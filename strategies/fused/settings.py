"""FUSED's run-config keys (``fused.*``): the public code's LoRA config, learning rate (MNIST) and local
epoch; 10 rounds instead of its 2 (``docs/fused.md`` says why)."""

from __future__ import annotations

from core.config import Setting, at_least, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("fused.layers", str, "auto",
            "layers that get a LoRA adapter: auto = the per-model table of docs/fused.md, cli = the paper's "
            "critical-layer identification (one round), or comma-separated module names (nn.Linear / nn.Conv2d)"),
    setting("fused.cli-layers", int, 0,
            "with fused.layers=cli: how many of the most sensitive layers get adapters; 0 = as many as the auto table "
            "has for the model", at_least(0)),
    setting("fused.rank", int, 16, "LoRA rank r of each adapter", positive()),
    setting("fused.alpha", float, 32.0, "LoRA alpha (the update is scaled by alpha / r)", positive()),
    setting("fused.dropout", float, 0.1, "LoRA dropout on each adapted layer's input",
            ((lambda v: 0 <= v < 1), "in [0, 1)")),
    setting("fused.rounds", int, 10, "FedAvg rounds that train the adapters", positive()),
    setting("fused.epochs", int, 1, "local epochs per round on the adapters", positive()),
    setting("fused.lr", float, 0.01, "local SGD learning rate of the adapters (the run's momentum)", positive()),
)


def check_settings(cfg) -> None:
    """The adapted layers must exist in the run's model and be Linear / Conv2d (one-line error).

    The model is the task's outline (``Task.model_outline``): every ClientApp process parses the run config."""
    from core.config import ConfigError
    from strategies.fused.adapter import ADAPTABLE, check_targets
    from strategies.fused.maths import target_layers

    try:
        model = cfg.task.model_outline(cfg)
        if cfg["fused.layers"].strip() == "cli":
            adaptable = sum(isinstance(m, ADAPTABLE) for m in model.modules())
            if cfg["fused.cli-layers"] > adaptable:
                raise ValueError(f"run-config 'fused.cli-layers'={cfg['fused.cli-layers']} is not allowed: must be "
                                 f"in 0..{adaptable} (the model's Linear / Conv2d layers)")
            return
        check_targets(model, target_layers(cfg.task.arch, cfg["fused.layers"], model))
    except ValueError as err:
        raise ConfigError(f"{err} (task '{cfg['task']}')") from None
