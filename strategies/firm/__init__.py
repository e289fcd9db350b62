"""FIRM — "FIRM: Fisher-Informed Retention Merging for Federated LLM Unlearning" (LLM task).

Forget and retain clients each send once a LoRA task vector and a diagonal Fisher
(``query.fisher``: ``client.py``, ``fisher.py``); the server merges them Fisher-normalised with a
per-tensor retention projection (``maths.py``, ``aggregate.py``), driven by ``strategy.py``.
"""

from strategies.firm.settings import SETTINGS
from strategies.registry import MethodSpec
from strategies.rmu.settings import KEYS as RMU_KEYS

METHODS = (
    MethodSpec(
        "firm",
        "forget and retain clients each send once a LoRA task vector + diagonal Fisher (`query.fisher`); "
        "Fisher-normalised Top-alpha merge, per-tensor retention projection (`firm.epsilon`); original adapter + "
        "merged update",
        "strategies.firm.strategy:FIRMMethod",
        paper="FIRM: Fisher-Informed Retention Merging for Federated LLM Unlearning (`docs/firm.md`)",
        settings=SETTINGS,
        reads=RMU_KEYS,  # firm.forget-objective='rmu' runs the rmu method's update (forget term)
        task_kinds=("llm",), scenarios=("client", "sample"),
        queries={"fisher": "strategies.firm.client:fisher_query"},
        smoke={"firm.fisher-batches": 2},
        style=("#2ca02c", "D"),
    ),
)
