"""FedUP — "FedUP: One-Shot Federated Unlearning via Centroid-Guided Plug-in Filters".

Clients send DP class centroids of their retained features, the class scenario's forgotten class
relabelled (``query.centroids``, ``client.py``);
the server trains a plug-in filter between the frozen extractor and head on them (``filter.py``,
``strategy.py``); one round, reversible by unplugging. Pure math: ``maths.py`` (DP calibration,
centroid checks) and ``centroids.py`` (clipping, KMeans, noise). Settings: ``settings.py``.
"""

from strategies.fedup.settings import SETTINGS, check_settings
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "fedup",
        "DP class centroids of the clients' retained data (class scenario: the forgotten class relabelled) → a "
        "plug-in filter between extractor and head, trained on the server; one round; unplug to restore",
        "strategies.fedup.strategy:FedUP",
        paper="FedUP: One-Shot Federated Unlearning via Centroid-Guided Plug-in Filters (`docs/fedup.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        reversible=True,
        queries={"centroids": "strategies.fedup.client:centroid_query"},
        plugins={"fedup-filter": "strategies.fedup.filter:build_plugin"},
        smoke={"fedup.epochs": 5},
        check=check_settings,
        default=True,
        style=("#d62728", "^"),
    ),
)
