"""Settings of the one-round LLM objectives (NPO's beta, SimNPO's beta and margin)."""

from __future__ import annotations

from core.config import Setting, at_least, positive, setting

NPO: tuple[Setting, ...] = (
    setting("npo.beta", float, 0.1, "NPO beta", positive()),
)
SIMNPO: tuple[Setting, ...] = (
    setting("simnpo.beta", float, 2.5, "SimNPO beta", positive()),
    setting("simnpo.gamma", float, 0.0, "SimNPO reward margin gamma", at_least(0)),
)
