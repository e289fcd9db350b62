"""Is a run's result a result? Pure checks on model states and the models' metrics (no Flower).

A number measured on a broken model reads like a result: a NaN model whose forget accuracy is 0
looks like perfect forgetting, and a method applied to an original model that never learned the
forget knowledge (or learned nothing at all) "forgets" trivially. ``validity`` turns the metrics of
one run into the ``validity`` block of results.json: one boolean per check, the names of the failed
ones and a one-line reason for each, so that a table can flag the run instead of printing its
numbers as if they meant something.

Checks and their bounds (vision tasks have ``test_acc``; the LLM task has none, so ``utility``
takes its place and the chance bound is skipped):

- ``original_finite``: every tensor of the original model is finite (the phases also stop on a
  non-finite model, see ``nonfinite_tensors``).
- ``original_usable``: the original's test accuracy is at least ``max(2 / classes,
  ORIGINAL_MIN_ACC)`` (twice chance, and at least 0.5 — a trained 10-class digits model scores
  0.93–0.98, a poisoned one that learned nothing 0.08) and at most
  ``ORIGINAL_MAX_DROP`` below the retrain model's (an original trained on *more* data than the
  oracle that is much worse than it was broken by the poisoning, not by the data).
- ``retrain_usable``: the retrain oracle passes the same floor (it is the reference of every
  comparison: on a very skewed partition FedAvg on the retained data can collapse to about chance,
  and every method would then "keep utility" against it), and, on a task with classes, fits its
  own training data (the retained data) at most ``RETRAIN_MAX_FIT_DROP`` (0.10, the bound of the
  original's drop) worse than the original does (``retain_acc``), which trained on that data and
  more. An oracle that fits its own data far worse was unlucky in its initial weights (drawn again,
  the same oracle fits it), and every method would read as better than it; a drop beyond 0.10 is
  rare in a healthy oracle. A test accuracy far below the original's is no such sign: where the
  leaving client held most of a class, retrain loses that class by design. The LLM task (no
  classes) is left out: no bound is known for its retained-fact accuracy.
- ``original_learned``: ``KR_original - KR_retrain >= KR_MARGIN`` (0.2): the original holds forget
  knowledge the oracle does not, so forgetting it is measurable (RR's denominator, eq. 5 of Lethe).
- ``unlearned_utility``: the unlearned model's test accuracy is at most ``UTILITY_TOLERANCE``
  (0.05) below retrain's.
- ``continued_finite``: continued training never produced a non-finite model.

The first four say whether the *cell* (the original of a request and its reference) is valid; the
last two judge the method's outcome. ``original_valid`` is the conjunction of the first four.

Without the retrain oracle (``retrain-oracle=false``) the checks against it are not made (``None``,
neither passed nor failed), ``original_valid`` covers the checks that were, and ``missing`` lists
every figure of results.json the run therefore cannot give, each with the reason
(:data:`WITHOUT_ORACLE`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

ORIGINAL_MIN_ACC = 0.5
ORIGINAL_MAX_DROP = 0.10
RETRAIN_MAX_FIT_DROP = 0.10
KR_MARGIN = 0.2
UTILITY_TOLERANCE = 0.05
ORIGINAL_CHECKS = ("original_finite", "original_usable", "retrain_usable", "original_learned")
ORACLE_CHECKS = ("retrain_usable", "original_learned")
NO_ORACLE = "retrain-oracle=false: the retrain reference was not trained"
#: the figures a run without the retrain oracle cannot give, and what each needed of it
WITHOUT_ORACLE = (
    ("resurfacing.kr_retrain", "the retrain model's forget accuracy (KR)"),
    ("resurfacing.rr", "RR (Lethe eq. 5) is relative to the retrain model's KR"),
    ("validity.checks.retrain_usable", "checks the retrain model"),
    ("validity.checks.original_learned", "compares the original's KR with the retrain model's"),
    ("models.*.forget_quality, models.*.privleak", "a task's figures against the retrain model (LLM task)"),
    ("diagnostics.forgetting_dispersion", "needs the retrain model's features"),
)


def nonfinite_tensors(state: Mapping[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors of ``state`` that hold a NaN or an infinity."""
    return [name for name, tensor in state.items()
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())]


def utility_of(entry: Mapping) -> float:
    """The utility figure of a results entry: ``test_acc`` (vision), else ``utility`` (LLM task)."""
    value = entry.get("test_acc")
    if value is None or not math.isfinite(float(value)):
        value = entry.get("utility", math.nan)
    return math.nan if value is None else float(value)


def _finite(*values: float) -> bool:
    return all(v is not None and math.isfinite(v) for v in values)


def validity(*, original: Mapping, unlearned: Mapping | None, retrain: Mapping | None, num_classes: int,
             original_finite: bool = True, diverged_at_round: int | None = None) -> dict:
    """The ``validity`` block: ``checks`` (name -> bool, None where not made), ``failed`` (names),
    ``reasons`` (one line per failed check), ``original_valid``, the ``bounds`` used and ``missing``
    (``{figure, reason}`` of each figure the run cannot give).

    ``num_classes`` is 0 for the LLM task (no chance bound). ``unlearned`` is ``None`` when no
    unlearned model exists (its check is then skipped, i.e. passes); ``retrain`` is ``None`` when no
    retrain oracle ran (module docstring)."""
    oracle = retrain is not None
    retrain = retrain if oracle else {}
    orig_u, re_u = utility_of(original), utility_of(retrain)
    floor = max(2.0 / num_classes, ORIGINAL_MIN_ACC) if num_classes else -math.inf
    reasons: dict[str, str] = {}
    if not original_finite:
        reasons["original_finite"] = "the original model has non-finite weights"
    usable_misses = (["is not a number"] if not _finite(orig_u) else
                     ([f"is below max(2/classes, {ORIGINAL_MIN_ACC}) = {floor:.3f}"] if orig_u < floor else [])
                     + ([f"is more than {ORIGINAL_MAX_DROP} below retrain's {re_u:.3f}"]
                        if _finite(re_u) and orig_u < re_u - ORIGINAL_MAX_DROP else []))
    if usable_misses:  # only the condition(s) that failed
        reasons["original_usable"] = (f"the original model's test accuracy {orig_u:.3f} "
                                      + " and ".join(usable_misses))
    if oracle:  # ORACLE_CHECKS compare with the retrain oracle; without it they are not made
        kr_o, kr_r = float(original.get("forget_acc", math.nan)), float(retrain.get("forget_acc", math.nan))
        fit_o, fit_r = (float(entry.get("retain_acc", math.nan)) for entry in (original, retrain))
        if not (_finite(re_u) and re_u >= floor):
            reasons["retrain_usable"] = (f"the retrain model's test accuracy {re_u:.3f} "
                                         + (f"is below max(2/classes, {ORIGINAL_MIN_ACC}) = {floor:.3f}"
                                            if _finite(re_u) else "is not a number")
                                         + ": no reference to compare with")
        elif num_classes and _finite(fit_o, fit_r) and fit_r < fit_o - RETRAIN_MAX_FIT_DROP:
            reasons["retrain_usable"] = ("the retrain model fits its own training data (retained accuracy "
                                         f"{fit_r:.3f}) more than {RETRAIN_MAX_FIT_DROP} worse than the original "
                                         f"({fit_o:.3f}): no reference to compare with")
        if not (_finite(kr_o, kr_r) and kr_o - kr_r >= KR_MARGIN):
            reasons["original_learned"] = (f"the original's forget accuracy {kr_o:.3f} is not {KR_MARGIN} above "
                                           f"retrain's {kr_r:.3f}: there is no forget knowledge to remove")
    if unlearned is not None:
        un_u = utility_of(unlearned)
        if not (_finite(un_u) and (not _finite(re_u) or un_u >= re_u - UTILITY_TOLERANCE)):
            reasons["unlearned_utility"] = (f"the unlearned model's test accuracy {un_u:.3f} " +
                                            (f"is more than {UTILITY_TOLERANCE} below retrain's {re_u:.3f}"
                                             if _finite(un_u) else "is not a number"))
    if diverged_at_round is not None:
        reasons["continued_finite"] = f"continued training diverged (non-finite model) at round {diverged_at_round}"
    names = ORIGINAL_CHECKS + ("unlearned_utility", "continued_finite")
    unmade = () if oracle else ORACLE_CHECKS
    return {
        "checks": {name: None if name in unmade else name not in reasons for name in names},
        "failed": [name for name in names if name in reasons],
        "reasons": [reasons[name] for name in names if name in reasons],
        "original_valid": not any(name in reasons for name in ORIGINAL_CHECKS),
        "bounds": {"original_min_acc": floor if num_classes else None, "original_max_drop": ORIGINAL_MAX_DROP,
                   "retrain_max_fit_drop": RETRAIN_MAX_FIT_DROP if num_classes else None,
                   "kr_margin": KR_MARGIN, "utility_tolerance": UTILITY_TOLERANCE},
        "missing": [] if oracle else [{"figure": figure, "reason": f"{NO_ORACLE}; {why}"}
                                      for figure, why in WITHOUT_ORACLE],
    }
