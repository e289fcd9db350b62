"""Named recipes: the project's own, opt-in compositions of settings (``recipes/<name>.toml``).

A method's defaults are its paper's. A recipe is a named set of settings that the project found
useful on top of them (``recipe='NAME'`` reads ``recipes/NAME.toml``); each recipe's
doc page shows what it buys. A recipe fills keys after the task's and the method's presets and before
the smoke settings and the keys given explicitly, which always win. ``results.json`` records the
recipe (``run.recipe``, ``"paper"`` where none) and the keys it filled (``run.recipe_settings``).

File format (TOML)::

    description = "one line: what it is for"
    methods = ["METHOD"]                    # the methods it is written for
    [settings]                              # every run
    "KEY" = 12.0
    [settings.TABLE]                        # the keys TABLE.NAME, as in pyproject's run config
    NAME = 1.0
    [scenario.class]                        # runs of that scenario (over [settings])
    "KEY" = 0.02
    "TABLE.NAME" = 2.0                      # a dotted key, quoted: the same key as in a table
    [task-kind.llm]                         # runs on a task of that kind (over both)
    "KEY" = inf

A file is read once per process (the run config is parsed several times in a run).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from core.config import flatten

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

#: where the recipe files are (the app bundle keeps the repository's layout and ships ``*.toml``)
RECIPES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


class RecipeError(ValueError):
    """A recipe file that cannot be used; the message is one line naming the file."""


@dataclass(frozen=True)
class Recipe:
    """One recipe file: its settings for every run, and those of a scenario or a task kind."""

    name: str
    description: str
    methods: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)
    scenario: dict[str, dict[str, Any]] = field(default_factory=dict)
    task_kind: dict[str, dict[str, Any]] = field(default_factory=dict)

    def values_for(self, scenario: str, kind: str) -> dict[str, Any]:
        """The keys this recipe sets in a run of ``scenario`` on a task of ``kind``."""
        return {**self.settings, **self.scenario.get(scenario, {}), **self.task_kind.get(kind, {})}


def recipe_names() -> tuple[str, ...]:
    """The recipes there are, by file name."""
    if not os.path.isdir(RECIPES_DIR):
        return ()
    return tuple(sorted(f[:-5] for f in os.listdir(RECIPES_DIR) if f.endswith(".toml")))


def load_recipe(name: str) -> Recipe:
    """``recipes/<name>.toml`` as a :class:`Recipe` (its keys are checked by ``strategies.run_config``)."""
    return _read_recipe(name, os.path.join(RECIPES_DIR, f"{name}.toml"))


@lru_cache(maxsize=None)
def _read_recipe(name: str, path: str) -> Recipe:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise RecipeError(f"recipe file {path} cannot be read: {err}") from None
    known = {"description", "methods", "settings", "scenario", "task-kind"}
    if set(data) - known or not isinstance(data.get("methods"), list):
        raise RecipeError(f"recipe file {path}: top-level keys must be among {', '.join(sorted(known))}, "
                          f"with 'methods' a list of method names")
    return Recipe(name, str(data.get("description", "")), tuple(data["methods"]), flatten(data.get("settings", {})),
                  {k: flatten(v) for k, v in data.get("scenario", {}).items()},
                  {k: flatten(v) for k, v in data.get("task-kind", {}).items()})
