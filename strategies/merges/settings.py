"""The merge baselines' run-config keys: each merge's scale, TIES' density, FULM's clustering."""

from __future__ import annotations

from core.config import Setting, finite, in_range, open_unit, setting

AVG: tuple[Setting, ...] = (
    setting("avg.scale", float, 1.0, "AVG merge: scale x mean of forget and retain task vectors", finite(0, False)),
)
SUM: tuple[Setting, ...] = (
    setting("sum.scale", float, 1.0, "SUM merge: scale x sum of forget task vectors", finite(0, False)),
)
TIES: tuple[Setting, ...] = (
    setting("ties.scale", float, 1.0, "TIES merge of forget task vectors: scale", finite(0, False)),
    setting("ties.density", float, 0.2, "TIES: share of each task vector's entries kept (per tensor)", open_unit(True)),
)
FULM: tuple[Setting, ...] = (
    setting("fulm.scale", float, 1.0, "FULM merge of forget and retain task vectors: scale", finite(0, False)),
    setting("fulm.threshold", float, 0.6, "FULM: cosine similarity that links two task vectors into one cluster",
            in_range(-1, 1)),
    setting("fulm.density", float, 0.3, "FULM: TIES density inside each cluster", open_unit(True)),
)
