"""PGA — "Federated Unlearning: How to Efficiently Erase a Client in FL?" (Halimi et al.; FedUP's baseline).

The leaving client reverses its learning by gradient ascent inside an L2 ball around the reference
model of the other clients (``client.py``, ``maths.py``); FedAvg rounds without it follow
(``strategy.py``). Client scenario, vision tasks. Settings: ``settings.py``.
"""

from strategies.pga.settings import SETTINGS
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "pga",
        "the leaving client runs projected gradient ascent on its data inside an L2 ball around the other clients' "
        "reference model, then FedAvg rounds without it (`pga-post-rounds`)",
        "strategies.pga.strategy:PGA",
        paper="Federated Unlearning: How to Efficiently Erase a Client in FL? (Halimi et al.; `docs/pga.md`)",
        settings=SETTINGS,
        task_kinds=("vision",),
        scenarios=("client",),
        queries={"pga": "strategies.pga.client:pga_query"},
        smoke={"pga-epochs": 1, "pga-post-rounds": 1, "pga-random-models": 2},
    ),
)
