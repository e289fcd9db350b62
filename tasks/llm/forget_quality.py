"""Forget quality and privleak of every evaluated LLM model, once the retrain oracle has been evaluated.

Kept apart from ``federation_metrics`` so the ServerApp can call it for any task without importing
the LLM stack: entries without per-sample truth ratios (vision tasks) are left as they are.
"""

from __future__ import annotations

import math

TRUTH_RATIOS_KEY = "_forget_truth_ratios"
"""Entry key of the pooled per-sample forget truth ratios; removed before results are written."""


def attach_forget_quality(entries: list[dict], retrain_entry: dict) -> None:
    """Add ``forget_quality`` and ``privleak`` to every entry that has forget truth ratios, then drop
    the per-sample lists from all entries.

    ``forget_quality``: TOFU's KS two-sample p-value against the retrain model's forget truth ratios
    (``tasks.llm.metrics.forget_quality``; the retrain model itself gets 1.0). ``privleak``:
    open-unlearning's (MUSE's) relative min-k% AUC difference to the retrain model
    (``tasks.llm.metrics.privleak`` of ``mia_min_k``; 0 for the retrain model, NaN without a holdout set).
    """
    everything = [*entries, retrain_entry]
    reference = retrain_entry.get(TRUTH_RATIOS_KEY)
    auc_retrain = retrain_entry.get("mia_min_k", math.nan)
    for entry in everything:
        if TRUTH_RATIOS_KEY not in entry:
            continue
        from tasks.llm.metrics import forget_quality, privleak

        ratios = entry[TRUTH_RATIOS_KEY]
        entry["forget_quality"] = forget_quality(ratios, reference) if ratios and reference else math.nan
        auc = entry.get("mia_min_k", math.nan)
        entry["privleak"] = math.nan if math.isnan(auc) or math.isnan(auc_retrain) else privleak(auc, auc_retrain)
    for entry in everything:
        entry.pop(TRUTH_RATIOS_KEY, None)
