"""FedAU — "Unlearning during Learning: An Efficient Federated Machine Unlearning Method" (Gu et al., IJCAI 2024).

During pretraining each client holding forget data trains a linear auxiliary head beside the
classifier on auxiliary labels and keeps it (``client.py``); unlearning combines the classifier
head with the mean auxiliary head linearly (``maths.py``, ``strategy.py``). Its original is its own.
Client, class and sample scenarios; vision tasks. Settings: ``settings.py``; ``docs/fedau.md``.
"""

from strategies.fedau.settings import SETTINGS
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "fedau",
        "its own original: each forget holder trains a linear auxiliary head beside the classifier during "
        "pretraining (class: labels = the forget class; sample/client: random labels on the forget samples) and "
        "keeps it on its disk; unlearning replaces the head: W1 - mean W2 (class), (1 - a) W1 + a mean W2 "
        "(sample/client, `fedau.alpha`)",
        "strategies.fedau.strategy:FedAU",
        paper="Unlearning during Learning: An Efficient Federated Machine Unlearning Method (Gu et al., IJCAI 2024; "
              "`docs/fedau.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        scenarios=("client", "class", "sample"),
        queries={"fedau": "strategies.fedau.client:head_query"},
        objectives={"fedau-aux": "strategies.fedau.client:aux_training"},
        style=("#9467bd", "P"),
    ),
)
