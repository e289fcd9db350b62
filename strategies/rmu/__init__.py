"""RMU — Representation Misdirection for Unlearning (Li et al., "The WMDP Benchmark", 2024).

Each forget client steers the output of decoder layer l on its forget data towards ``c u`` (u a
fixed random unit vector from the run's seed) and keeps it at the original model's on its retained
data: ``MSE(h_l(x_f), c u) + alpha MSE(h_l(x_r), h_l^frozen(x_r))``, training the LoRA factors of the
MLP down-projections of the layers up to l (``train.py``, loss in ``strategies.objectives.losses``);
the server applies the mean update (``strategy.py``). The paper's values and the rule that scales
them to the run's model: ``settings.py``; ``docs/rmu.md``.
"""

from strategies.registry import MethodSpec
from strategies.rmu.settings import SETTINGS, UPDATED_MODULE


def check(cfg) -> None:
    """RMU trains ``down_proj`` adapters, and an explicit ``rmu.layer`` must exist in the run's base model
    (``llm.model``, or a merged ``original-model``) (one line, before any work)."""
    import json
    import os

    from core.config import ConfigError
    from strategies.rmu.settings import steered_layer
    from tasks.llm.federation_model import base_model, target_modules
    from tasks.llm.model import TINY_LAYERS, TINY_MODEL

    if UPDATED_MODULE not in target_modules(cfg):
        raise ConfigError(f"run-config 'llm.target-modules'={cfg['llm.target-modules']!r}: method 'rmu' trains the "
                          f"LoRA of {UPDATED_MODULE}: must include {UPDATED_MODULE}")
    if cfg["rmu.layer"] < 0:
        return
    base, layers = base_model(cfg), TINY_LAYERS
    if base != TINY_MODEL:
        path = os.path.join(os.path.expanduser(base), "config.json")
        if not os.path.isfile(path):
            return  # the model's own loading error names the folder
        with open(path, encoding="utf-8") as handle:
            layers = int(json.load(handle).get("num_hidden_layers", cfg["rmu.layer"] + 1))
    try:
        steered_layer(layers, cfg["rmu.layer"], f"model {base!r}")
    except ValueError as err:
        raise ConfigError(str(err)) from None


METHODS = (
    MethodSpec(
        "rmu",
        "each forget client steers decoder layer l's output on its forget data to c u (u a seeded random unit "
        "vector) and keeps it on its retained data (`rmu.alpha`), training the down_proj LoRA of the layers up to "
        "l; the server applies the mean update (one round)",
        "strategies.rmu.strategy:RMU",
        paper="The WMDP Benchmark: Measuring and Reducing Malicious Use With Unlearning (Li et al., 2024; "
              "`docs/rmu.md`)",
        settings=SETTINGS,
        task_kinds=("llm",),
        scenarios=("client", "sample"),
        objectives={"rmu": "strategies.rmu.client:rmu"},
        check=check,
        style=("#bcbd22", "s"),
    ),
)
