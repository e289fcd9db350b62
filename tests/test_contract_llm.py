"""The results contract (``tests/results_contract.py``) for every registered method of the llm task kind."""

from __future__ import annotations

import pytest

from results_contract import cells, check_contract, shared_cache  # noqa: F401 (this module's model cache)


@pytest.mark.parametrize("spec,scenario", cells("llm"))
def test_registered_method_keeps_the_results_contract(spec, scenario, shared_cache, tmp_path):
    check_contract(spec, "llm", scenario, shared_cache, str(tmp_path))
