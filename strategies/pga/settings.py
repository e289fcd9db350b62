"""PGA's run-config keys (``pga.*``); defaults are the public notebook's (MNIST, 5 parties)."""

from __future__ import annotations

from core.config import Setting, at_least, finite, open_unit, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("pga.lr", float, 0.01, "SGD learning rate (momentum 0.9) of the leaving client's projected ascent",
            positive()),
    setting("pga.epochs", int, 5, "most epochs of projected gradient ascent on the leaving client's data", positive()),
    setting("pga.batch-size", int, 128, "mini-batch size of the ascent", positive()),
    setting("pga.clip", float, 5.0, "gradient L2-norm clip of each ascent step; 0 = off", at_least(0)),
    setting("pga.radius-fraction", float, 1 / 3,
            "ball radius^2 around the reference model = this x the mean squared distance from the reference to "
            "freshly initialised models", open_unit(True)),
    setting("pga.random-models", int, 10, "fresh models averaged for that mean distance", positive()),
    setting("pga.stop-factor", float, 1.1,
            "ascent stops once the squared L2 distance from the client's own model exceeds this x the reference "
            "model's (where the ascent starts)", finite(1, False)),
    setting("pga.post-rounds", int, 3, "FedAvg rounds on the retained clients after the ascent (0 = none)",
            at_least(0)),
)
