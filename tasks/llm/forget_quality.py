"""Forget quality of every evaluated LLM model, once the retrain oracle has been evaluated.

Kept apart from ``federation_metrics`` so the ServerApp can call it for any task without importing
the LLM stack: entries without per-sample truth ratios (vision tasks) are left as they are.
"""

from __future__ import annotations

import math

TRUTH_RATIOS_KEY = "_forget_truth_ratios"
"""Entry key of the pooled per-sample forget truth ratios; removed before results are written."""


def attach_forget_quality(entries: list[dict], retrain_entry: dict) -> None:
    """Add ``forget_quality`` to every entry that has forget truth ratios: TOFU's KS two-sample
    p-value against the retrain model's ratios (``tasks.llm.metrics.forget_quality``; the retrain
    model itself gets 1.0); then drop the per-sample lists from all entries."""
    everything = [*entries, retrain_entry]
    reference = retrain_entry.get(TRUTH_RATIOS_KEY)
    for entry in everything:
        if TRUTH_RATIOS_KEY not in entry:
            continue
        from tasks.llm.metrics import forget_quality

        ratios = entry[TRUTH_RATIOS_KEY]
        entry["forget_quality"] = forget_quality(ratios, reference) if ratios and reference else math.nan
    for entry in everything:
        entry.pop(TRUTH_RATIOS_KEY, None)
