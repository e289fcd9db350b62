"""PGA — "Federated Unlearning: How to Efficiently Erase a Client in FL?" (Halimi et al.; FedUP's baseline).

The leaving client reverses its learning by gradient ascent inside an L2 ball around the reference
model of the other clients (``client.py``, ``maths.py``); FedAvg rounds without it follow
(``strategy.py``). Client scenario as in its paper; class and sample as FedUP's Table 3 applies it
(the holders of the forget data ascend on it). Vision tasks. Settings: ``settings.py``.
"""

from strategies.pga.settings import SETTINGS
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "pga",
        "the leaving client (class/sample: each holder, on its forget data) runs projected gradient ascent inside "
        "an L2 ball around the other clients' model, recovered from its kept last-round local model; then FedAvg "
        "rounds on retained data (`pga.post-rounds`)",
        "strategies.pga.strategy:PGA",
        paper="Federated Unlearning: How to Efficiently Erase a Client in FL? (Halimi et al.; `docs/pga.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        needs=("last-local-model",),
        queries={"pga": "strategies.pga.client:pga_query"},
        smoke={"pga.epochs": 1, "pga.post-rounds": 1, "pga.random-models": 2},
        style=("#ff7f0e", "v"),
    ),
)
