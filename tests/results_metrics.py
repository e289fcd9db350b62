"""Shared by the tests that compare two engines' runs: the numbers a results.json is judged by."""


def flat_metrics(results: dict) -> dict[str, float]:
    """Every number a method is compared by: each model's metrics and the resurfacing figures."""
    flat = {f"{model}.{key}": value for model, entry in results["models"].items()
            for key, value in entry.items() if isinstance(value, (int, float)) and not isinstance(value, bool)}
    flat.update({f"resurfacing.{key}": value for key, value in results["resurfacing"].items()
                 if isinstance(value, (int, float))})
    return flat
