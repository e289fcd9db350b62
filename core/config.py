"""The run config's building blocks: typed keys, their rules, the parsed :class:`Config`, the parser.

Flower hands the ServerApp and every ClientApp the same flat run config (``pyproject.toml``'s
``[tool.flwr.app.config]`` merged with ``--run-config`` overrides). A :class:`Setting` declares one
key (type, default, what is allowed, what it means); :func:`parse` turns a run config into values
and rejects bad input with a one-line :class:`ConfigError` that names the key and what is allowed,
before any training starts.

This is the lowest layer: it knows no task, no method and no app. Which keys exist and which
presets fill them is told to :func:`parse` by its caller (``strategies.run_config`` joins the
general keys, each task kind's and each registered method's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

SCENARIOS = ("client", "class", "sample")
POISONS = ("label-flip", "backdoor")


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message is one line naming the key."""


@dataclass(frozen=True)
class Setting:
    """One run-config key: ``check`` returns the description of what is allowed when the value fails.

    ``allow_inf``: a float whose ``inf`` is a documented choice (no DP noise, no projection, no
    early stop); every other float must be finite. ``choices``: a callable giving the allowed
    values of a key whose choices are registered elsewhere (``task``, ``method``).
    """

    key: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    allowed: str = ""
    allow_inf: bool = False
    choices: Callable[[], tuple[str, ...]] | None = None

    def problem(self, value: Any) -> str | None:
        """What is wrong with ``value`` (already coerced), or None."""
        if isinstance(value, float) and math.isnan(value):
            return f"run-config '{self.key}' is NaN"
        if isinstance(value, float) and math.isinf(value) and not self.allow_inf:
            return f"run-config '{self.key}'={value!r} is not allowed: must be finite"
        if self.choices is not None and value not in self.choices():
            allowed = ", ".join("'' (none)" if c == "" else c for c in self.choices())
            return f"run-config '{self.key}'={value!r} is not allowed: must be one of {allowed}"
        if self.check is not None and not self.check(value):
            return f"run-config '{self.key}'={value!r} is not allowed: must be {self.allowed}"
        return None


Rule = tuple[Callable[[Any], bool], str]


def one_of(values: tuple[str, ...]) -> Rule:
    return (lambda v: v in values), "one of " + ", ".join(values)


def positive() -> Rule:
    return (lambda v: v > 0), "> 0"


def at_least(low: float) -> Rule:
    return (lambda v: v >= low), f">= {low:g}"


def in_range(low: float, high: float, text: str | None = None) -> Rule:
    return (lambda v: low <= v <= high), text or f"in [{low:g}, {high:g}]"


def open_unit(include_one: bool) -> Rule:
    if include_one:
        return (lambda v: 0 < v <= 1), "in (0, 1]"
    return (lambda v: 0 < v < 1), "in (0, 1)"


def finite(low: float, include_low: bool) -> Rule:
    if include_low:
        return (lambda v: low <= v < math.inf), f">= {low:g} and finite"
    return (lambda v: low < v < math.inf), f"> {low:g} and finite"


def setting(key: str, kind: type, default: Any, help: str, rule: Rule | None = None, *,
            allow_inf: bool = False, choices: Callable[[], tuple[str, ...]] | None = None) -> Setting:
    """A :class:`Setting` from a ``(check, allowed)`` rule (the helpers above)."""
    check, allowed = rule if rule else (None, "")
    return Setting(key, kind, default, help, check, allowed, allow_inf, choices)



class Config:
    """Typed, validated run config; read values as ``cfg["pretrain-rounds"]`` or ``cfg.pretrain_rounds``.

    ``presets``: the keys a method/task preset, the recipe or the smoke setting filled, with their
    values; ``recipe_settings``: those the recipe filled; ``defaults``: every key's declared default.
    """

    def __init__(self, values: dict[str, Any], presets: dict[str, Any] | None = None,
                 recipe_settings: dict[str, Any] | None = None, *, task: Any = None,
                 defaults: dict[str, Any] | None = None):
        self._values = dict(values)
        self.presets = dict(presets or {})
        self.recipe_settings = dict(recipe_settings or {})
        self._task = task
        self.defaults = dict(defaults or {})

    def with_values(self, changes: dict[str, Any]) -> "Config":
        """This config with ``changes`` applied (a method's second attempt under other settings). The
        task object and the presets belong to this config's task, so ``changes`` may not change it."""
        if "task" in changes and changes["task"] != self._values.get("task"):
            raise ValueError(f"with_values cannot change 'task' ({self._values.get('task')!r} -> "
                             f"{changes['task']!r}): its task object and presets would be stale; parse a new config")
        return Config({**self._values, **changes}, self.presets, self.recipe_settings, task=self._task,
                      defaults=self.defaults)

    @property
    def recipe(self) -> str:
        """The recipe this run uses, ``"paper"`` where none."""
        return self._values.get("recipe") or "paper"

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name.replace("_", "-")]
        except KeyError as err:
            raise AttributeError(name) from err

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @property
    def task(self):
        """The run's task object (``tasks.base.Task``), given by the parser that built this config."""
        return self._task

    @property
    def num_classes(self) -> int:
        """Classes of a classification task; 0 where there are none (class settings do not apply)."""
        return self.task.num_classes

    @property
    def rounds_of_retrain(self) -> int:
        return self["retrain-rounds"] or self["pretrain-rounds"]

    @property
    def init_seed(self) -> int:
        """Seed of the original's and the retrain oracle's initial weights: ``init-seed``, else ``seed``."""
        return self["seed"] if self["init-seed"] < 0 else self["init-seed"]


def coerce(setting: Setting, value: Any) -> Any:
    """Flower gives TOML/CLI scalars; accept ints for floats and 'true'/'false' strings for bools."""
    kind = setting.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(value, kind):
        return value
    raise ConfigError(f"run-config '{setting.key}' must be a {kind.__name__}, got {value!r}")



def valid(setting: Setting, raw: Any) -> Any:
    """``raw`` coerced to the setting's type and checked; ``ConfigError`` when it is not allowed."""
    value = coerce(setting, raw)
    problem = setting.problem(value)
    if problem:
        raise ConfigError(problem)
    return value




def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys, as Flower flattens a run config: ``{"method": {"key": 0.2}}`` ->
    ``{"method.key": 0.2}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, dict):
            flat.update(flatten(value, name))
        else:
            flat[name] = value
    return flat


#: Fills keys from the leading values: ``fill(values) -> (presets, keys whose value is the recipe's)``.
Filler = Callable[[dict[str, Any]], tuple[dict[str, Any], set[str]]]


def parse(run_config: dict[str, Any], settings: tuple[Setting, ...], leading: tuple[str, ...], fill: Filler,
          task_for: Callable[[str], Any], given: Iterable[str] | None = None) -> Config:
    """Validate ``run_config`` against ``settings`` into a :class:`Config`: unknown keys rejected,
    missing keys defaulted. The ``leading`` keys are read first; ``fill`` gives the presets they
    imply, which fill the keys the user did not set: a key the user set always wins, whatever its
    value. ``given``: the keys the user set, where ``run_config`` holds every key (Flower merges
    pyproject's defaults with the user's ``--run-config``); None: every key in ``run_config`` (a run
    config of only what the user set: the in-process runner, the benchmarks, the tests).
    ``task_for`` turns the ``task`` value into the run's task object."""
    by_key = {s.key: s for s in settings}
    user_set = set(run_config if given is None else given)
    unknown = sorted(set(run_config) - set(by_key))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)}; see docs/settings.md")
    values = {key: valid(by_key[key], run_config.get(key, by_key[key].default)) for key in leading}
    applied = {}
    presets, recipe_keys = fill(values)
    for key, preset in presets.items():
        if key not in by_key:
            raise ConfigError(f"a task, method or smoke preset sets unknown run-config key {key!r}; "
                              "see docs/settings.md")
        if key not in user_set:
            applied[key] = valid(by_key[key], preset)
    for setting in settings:
        if setting.key not in values:
            values[setting.key] = applied.get(setting.key, valid(setting, run_config.get(setting.key, setting.default)))
    return Config(values, applied, {k: v for k, v in applied.items() if k in recipe_keys},
                  task=task_for(values["task"]), defaults={s.key: s.default for s in settings})
