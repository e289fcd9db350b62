"""FedEraser's run-config keys (``federaser.*``); defaults are its public code's."""

from __future__ import annotations

from core.config import Setting, open_unit, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("federaser.interval", int, 1,
            "pretraining keeps the global model and the client models of every this-many-th round (1 = every round)",
            positive()),
    setting("federaser.epoch-ratio", float, 0.5,
            "calibration training runs ceil(this x local-epochs) epochs on each remaining client", open_unit(True)),
)
