"""FIRM's run-config keys (``firm.*``): the merge, the projection and the clients' release."""

from __future__ import annotations

import math

from core.config import Setting, finite, one_of, open_unit, positive, setting

SETTINGS: tuple[Setting, ...] = (
    setting("firm.gamma", float, 1.0, "FIRM base-merge scale gamma of gamma * (D_F + D_R) (paper: 1)", finite(0, True)),
    setting("firm.alpha", float, 0.1, "share of each normalised Fisher kept (Top-alpha sparsification)", open_unit(True)),
    setting("firm.eps0", float, 1e-8, "Fisher normalisation / merge denominator epsilon_0", finite(0, False)),
    setting("firm.epsilon", float, math.inf,
        "retention budget per tensor and retain client of the projection; inf = FIRM-base (no projection)",
        positive(), allow_inf=True),
    setting("firm.forget-objective", str, "ascent", "forget clients' local objective (retain clients: ce)",
        one_of(("ascent", "rmu"))),
    setting("firm.fisher-batches", int, 20, "single sequences per client the diagonal Fisher is averaged over",
        positive()),
)
