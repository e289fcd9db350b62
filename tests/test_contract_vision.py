"""The results contract (``tests/results_contract.py``) for every registered method of the vision task kind."""

from __future__ import annotations

import pytest

from results_contract import cells, check_contract, recipe_cells, shared_cache  # noqa: F401 (this module's model cache)


@pytest.mark.parametrize("spec,scenario", cells("vision"))
def test_registered_method_keeps_the_results_contract(spec, scenario, shared_cache, tmp_path):
    check_contract(spec, "vision", scenario, shared_cache, str(tmp_path))


@pytest.mark.parametrize("spec,scenario,recipe", recipe_cells("vision"))
def test_every_recipe_keeps_the_results_contract(spec, scenario, recipe, shared_cache, tmp_path):
    check_contract(spec, "vision", scenario, shared_cache, str(tmp_path), recipe)
