"""Shared by the tests that compare two engines' runs: the numbers a results.json is judged by."""

import math


def flat_metrics(results: dict) -> dict[str, float]:
    """Every number a method is compared by: each model's metrics and the resurfacing figures."""
    flat = {f"{model}.{key}": value for model, entry in results["models"].items()
            for key, value in entry.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    flat.update({f"resurfacing.{key}": value for key, value in results["resurfacing"].items()
                 if isinstance(value, (int, float))})
    return flat


def metric_differences(ours: dict, theirs: dict) -> dict[str, float]:
    """|ours - theirs| per metric of two results.json (a NaN in both, e.g. both diverged alike, is
    left out); asserts both runs report the same, non-trivial set of metrics."""
    a, b = flat_metrics(ours), flat_metrics(theirs)
    assert a.keys() == b.keys() and len(a) > 10, sorted(a.keys() ^ b.keys())
    return {k: abs(a[k] - b[k]) for k in a if not (math.isnan(a[k]) and math.isnan(b[k]))}
