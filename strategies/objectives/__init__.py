"""One-round LLM unlearning objectives: GA, NPO, SimNPO (Lethe's federated baselines, sec. V).

Each forget client trains the LoRA adapter once with the objective (``losses.py``, registered as
``train`` objectives in ``client.py``); the server applies the mean update (``strategy.py``).
"""

from strategies.objectives.settings import NPO, SIMNPO
from strategies.registry import MethodSpec

_COMMON = dict(paper="Lethe, sec. V baselines", task_kinds=("llm",), scenarios=("client", "sample"),
               objectives={"ascent": "strategies.objectives.client:ascent", "npo": "strategies.objectives.client:npo",
                           "simnpo": "strategies.objectives.client:simnpo"})

METHODS = (
    MethodSpec("ga", "each forget client trains the LoRA adapter once by gradient ascent, the server applies the "
               "mean update (one round)", "strategies.objectives.strategy:GradientAscent", **_COMMON,
               style=("#996600", "v")),
    MethodSpec("npo", "the same with Negative Preference Optimisation (`npo.beta`)",
               "strategies.objectives.strategy:NPO", settings=NPO, **_COMMON, style=("#4b0082", "^")),
    MethodSpec("simnpo", "the same with SimNPO (`simnpo.beta`, `simnpo.gamma`)",
               "strategies.objectives.strategy:SimNPO", settings=SIMNPO, **_COMMON, style=("#e7298a", "o")),
)
