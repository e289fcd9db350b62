"""FedOSD — "Federated Unlearning with Gradient Descent and Conflict Mitigation" (Pan et al., AAAI 2025;
a Lethe baseline). Public code: ``zibinpan/FedOSD``.

The leaving client descends the unlearning cross-entropy ``-log(1 - p_y/2)``; the server steps along
its gradient made orthogonal to the retained clients' gradients (``maths.py``), then post-training
rounds on the retained clients drop each update's component along ``w - w_start`` (``strategy.py``).
Client scenario (as Lethe runs it), vision tasks. Settings: ``settings.py``.
"""

from strategies.fedosd.settings import SETTINGS
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "fedosd",
        "the leaving client descends the unlearning cross-entropy; the server steps along its gradient made "
        "orthogonal to the retained clients' gradients, then post-training rounds drop each update's "
        "component along w - w_start",
        "strategies.fedosd.strategy:FedOSD",
        paper="Federated Unlearning with Gradient Descent and Conflict Mitigation (Pan et al.; `docs/fedosd.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        scenarios=("client",),
        queries={"fedosd": "strategies.fedosd.client:fedosd_query"},
        smoke={"fedosd.unlearn-rounds": 1, "fedosd.recovery-rounds": 1},
        style=("#a8a800", "D"),
    ),
)
