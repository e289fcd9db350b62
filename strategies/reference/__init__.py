"""``none`` and ``retrain``: the origin and the oracle every comparison is read against (any task)."""

from strategies.registry import MethodSpec

METHODS = (
    MethodSpec("none", "the original model (the origin row of every table)",
               "strategies.reference.strategy:NoUnlearning", task_kinds=("vision", "llm", "text"),
               style=("#8c564b", "X")),
    MethodSpec("retrain", "FedAvg from scratch on retained data: the exact-unlearning oracle (cached; also the RR "
               "reference)", "strategies.reference.strategy:Retrain", task_kinds=("vision", "llm", "text"),
               style=("#000000", "s")),
)
