"""Exact-Fun — "Exact-Fun: an exact and efficient federated unlearning approach" (Xiong et al.).

Quantised federated training with every round's client models kept; unlearning recomputes only
the rounds from the first one the leaving client's removal changes, and equals quantised
retraining without it bit for bit (``maths.py``, ``strategy.py``). Client scenario, vision tasks.
"""

from strategies.exactfun.settings import SETTINGS, check_settings
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "exact-fun",
        "its own original, trained by FedAvg with a quantised global model (`exactfun.step`), every round's client "
        "models kept; unlearning recomputes the rounds from the first one that dropping the leaving client "
        "changes: exactly quantised retraining without it",
        "strategies.exactfun.strategy:ExactFun",
        paper="Exact-Fun: an exact and efficient federated unlearning approach (Xiong et al.; `docs/exact-fun.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        scenarios=("client",),
        needs=("update-history",),
        smoke={"exactfun.verify": True},
        check=check_settings,
        style=("#17becf", "*"),
    ),
)
