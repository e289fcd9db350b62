"""NoT — "NoT: Federated Unlearning via Weight Negation" (Khalil et al., CVPR 2025; a Lethe baseline).

The package is ``negation`` because ``not`` is a Python keyword; the method's name is ``not``.
The server negates the parameters of chosen layers (default: the first) of the global model
(``maths.py``), then FedAvg rounds on the retained data refine it (``strategy.py``). Every scenario,
vision tasks. Settings: ``settings.py``.
"""

from strategies.negation.settings import SETTINGS
from strategies.registry import MethodSpec


def check(cfg) -> None:
    """``not.layers`` must name layers of this task's model (one-line error before any work)."""
    from core.config import ConfigError
    from strategies.negation.maths import parameter_keys

    try:
        parameter_keys(cfg.task.model_outline(cfg), cfg["not.layers"])
    except ValueError as error:
        raise ConfigError(f"{error} (task '{cfg['task']}')") from None


METHODS = (
    MethodSpec(
        "not",
        "the server negates the parameters of the chosen layers (`not.layers`, default the first layer), then "
        "FedAvg rounds on the retained data refine the model (`not.rounds`)",
        "strategies.negation.strategy:NoT",
        paper="NoT: Federated Unlearning via Weight Negation (Khalil et al.; `docs/not.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        scenarios=("client", "class", "sample"),
        smoke={"not.rounds": 1},
        check=check,
        style=("#1b9e77", "8"),
    ),
)
