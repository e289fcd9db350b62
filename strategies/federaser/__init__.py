"""FedEraser — "FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models" (Liu et al.).

The server keeps pretraining's global and client models every ``federaser.interval`` rounds and
rebuilds the model without the leaving client, calibrating short retraining rounds by the old
updates' step lengths (``maths.py``, ``strategy.py``). Client scenario, vision tasks.
"""

from strategies.federaser.settings import SETTINGS
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "federaser",
        "replays the kept pretraining rounds without the leaving client: the remaining clients train "
        "ceil(`federaser.epoch-ratio` x local epochs) epochs per kept round and the server gives each layer the old "
        "round's step length in the new direction",
        "strategies.federaser.strategy:FedEraser",
        paper="FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models "
              "(Liu et al.; `docs/federaser.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        scenarios=("client",),
        needs=("update-history",),
        smoke={"federaser.interval": 1},
        style=("#e377c2", "h"),
    ),
)
