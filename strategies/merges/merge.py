"""The merge baselines' server rule: AVG / SUM / TIES / FULM over the uploads FIRM gets (pure, no Flower).

The uploads are validated exactly as FIRM's (``strategies.firm.aggregate.validate_uploads``; the
Fishers are checked, then unused), so a comparison differs only in the merge. Task vectors by role
as in FIRM's paper: AVG and FULM merge forget and retain vectors, SUM and TIES forget vectors only.
"""

from __future__ import annotations

from typing import Sequence

from strategies.firm.aggregate import ROLES, MergeReport, TensorDict, _norm, validate_uploads
from strategies.merges import maths as merge_baselines

BASELINES = ("avg", "sum", "ties", "fulm")
BASELINE_ROLES = {"avg": ROLES, "sum": ("forget",), "ties": ("forget",), "fulm": ROLES}


def merge_baseline(name: str, uploads: Sequence, scale: float, *, expected_shapes=None,
                   **params) -> tuple[TensorDict, MergeReport]:
    """AVG / SUM / TIES / FULM over the same uploads FIRM gets (Fishers are validated, then unused).

    ``params`` go to the merge: ``density`` for ties (default 0.2); ``threshold``, ``density``, ``inter``
    for fulm (defaults 0.6, 0.3, "sum"). Task vectors by role as in the paper: avg/fulm forget+retain,
    sum/ties forget only.
    """
    if name not in BASELINES:
        raise ValueError(f"merge baseline must be one of {list(BASELINES)}, got {name!r}")
    kept, dropped = validate_uploads(uploads, expected_shapes)
    chosen = [u for u in kept if u.role in BASELINE_ROLES[name]]
    merge = {"avg": merge_baselines.avg_merge, "sum": merge_baselines.sum_merge,
             "ties": merge_baselines.ties_merge, "fulm": merge_baselines.fulm_merge}[name]
    try:
        merged = merge([u.task_vector for u in chosen], scale, **params)
    except TypeError as error:
        raise ValueError(f"merge baseline {name!r} does not take parameters {sorted(params)}: {error}") from None
    settings = {"scale": scale, **params}
    return merged, MergeReport(name, settings, [u.client_id for u in chosen], dropped, _norm(merged))
