"""The one registration point of methods: each method package declares a :class:`MethodSpec`.

A method lives in its own package under ``strategies/`` (its server rule, pure math, client-side
work and settings). Its ``__init__.py`` lists what it registers in ``METHODS``, a tuple of
:class:`MethodSpec`; this module finds every such package (no list to edit here), and the method
list, the run-config keys and their validation (``strategies.run_config``), the ClientApp's extra queries
and local objectives (``client_app.app``), the plug-in kinds (``tasks.plugins``) and the README's
method and key tables (``python -m strategies.registry``) all come from those declarations.

The declarations stay light (no Flower, no torch at import): code is named by ``"module:attr"``
strings and imported only when a run uses it, so a ClientApp process that answers one message
imports one method's code at most.
"""

from __future__ import annotations

import importlib
import json
import math
import pkgutil
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Mapping

from core.config import Setting


@dataclass(frozen=True)
class MethodSpec:
    """What a method declares once, in its own package.

    - ``name``: the run-config value of ``method``; ``summary`` and ``paper``: its README row.
    - ``strategy``: ``"module:Class"`` of its :class:`strategies.common.base.UnlearningMethod`.
    - ``settings``: the run-config keys it owns (typed, with defaults and allowed ranges);
      ``reads``: keys owned by another method that it also reads (the merges read FIRM's release
      settings), so a warning names a key set for a method that does not read it.
    - ``task_kinds`` / ``scenarios``: what it supports; ``reversible``: it can ``restore``.
    - ``queries``: client query actions it adds (``query.<name>``) -> ``"module:function"``;
      ``objectives``: local-training objectives it adds (the ``objective`` of a ``train`` message)
      -> ``"module:function"``; ``plugins``: plug-in kinds -> ``"module:builder"``. The function
      signatures are the task kind's (``tasks.base.Task``).
    - ``needs``: what pretraining must keep for it (names in :data:`PRETRAINING_KEEPS`); a pretraining
      run keeps what any method of its task kind needs, so one cached original serves them all.
    - ``presets``: task name or task kind -> settings that replace the defaults there;
      ``smoke``: settings of a smoke run (``smoke=true``).
    - ``check``: extra combination checks, ``check(cfg)`` raising ``ConfigError``.
    - ``default``: this is the run config's default ``method`` (exactly one method says so).
    - ``style``: ``(colour, marker)`` of its curves in every plot (``tasks.plot_style``): a strong colour
      that no other method uses; empty = one picked from its name.
    """

    name: str
    summary: str
    strategy: str
    paper: str = "—"
    settings: tuple[Setting, ...] = ()
    reads: tuple[str, ...] = ()
    task_kinds: tuple[str, ...] = ("vision",)
    scenarios: tuple[str, ...] = ("client", "class", "sample")
    reversible: bool = False
    queries: Mapping[str, str] = field(default_factory=dict)
    objectives: Mapping[str, str] = field(default_factory=dict)
    plugins: Mapping[str, str] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    smoke: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any], None] | None = None
    default: bool = False
    style: tuple[str, str] | tuple[()] = ()


#: What a method may ask pretraining to keep (``MethodSpec.needs``) -> what that is.
PRETRAINING_KEEPS = {
    "last-local-model": "each client keeps its local model of the last pretraining round on its own disk "
                        "(``client_app.kept_models``), as a real client holds it",
    "update-history": "the server keeps the global model and every client's returned model of every "
                      "`federaser.interval`-th pretraining round beside the cached original (``server_app.history``); "
                      "recorded only in a run whose method needs it",
}


def load(target: str):
    """The object named by ``"package.module:attr"``."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


@lru_cache(maxsize=1)
def all_methods() -> tuple[MethodSpec, ...]:
    """Every registered method, in package order (``reference`` first, then alphabetical)."""
    import strategies

    names = sorted((m.name for m in pkgutil.iter_modules(strategies.__path__) if m.ispkg),
                   key=lambda n: (n != "reference", n))
    specs = []
    for package in names:
        specs += getattr(importlib.import_module(f"strategies.{package}"), "METHODS", ())
    if sum(s.default for s in specs) != 1:
        raise RuntimeError("exactly one method must be registered with default=True")
    seen = [s.name for s in specs]
    repeated = sorted({n for n in seen if seen.count(n) > 1})
    if repeated:
        raise RuntimeError(f"method name(s) registered twice: {', '.join(repeated)}")
    from tasks.registry import KIND_SETTINGS  # the task kinds there are

    for spec in specs:
        unknown = set(spec.task_kinds) - set(KIND_SETTINGS)
        if unknown:
            raise RuntimeError(f"method {spec.name!r} declares unknown task kind(s) {sorted(unknown)}")
        unknown = set(spec.needs) - set(PRETRAINING_KEEPS)
        if unknown:
            raise RuntimeError(f"method {spec.name!r} needs unknown pretraining record(s) {sorted(unknown)}: "
                               f"must be among {', '.join(PRETRAINING_KEEPS)}")
    return tuple(specs)


def method_names() -> tuple[str, ...]:
    return tuple(s.name for s in all_methods())


def method_spec(name: str) -> MethodSpec:
    for spec in all_methods():
        if spec.name == name:
            return spec
    raise ValueError(f"method {name!r} is not available: must be one of {', '.join(method_names())}")


def method_for(name: str):
    """A fresh instance of the method registered under ``name``."""
    return load(method_spec(name).strategy)()


def methods_for_task(task) -> tuple[str, ...]:
    """Names of the methods that support ``task`` (a ``tasks.base.Task``)."""
    return tuple(s.name for s in all_methods() if task.kind in s.task_kinds)


def pretraining_keeps(kind: str) -> tuple[str, ...]:
    """What a pretraining run on a task of ``kind`` keeps: everything a method of that kind needs."""
    return tuple(sorted({need for s in all_methods() if kind in s.task_kinds for need in s.needs}))


def _registered(field_name: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for spec in all_methods():
        for name, target in getattr(spec, field_name).items():
            if found.get(name, target) != target:
                raise RuntimeError(f"{field_name[:-1]} {name!r} is registered by two methods")
            found[name] = target
    return found


def queries() -> dict[str, tuple[str, MethodSpec]]:
    """Client query action -> (``"module:function"``, the method that registered it first)."""
    owner = {}
    for spec in all_methods():
        for action in spec.queries:
            owner.setdefault(action, spec)
    return {action: (target, owner[action]) for action, target in _registered("queries").items()}


def objective(name: str) -> Callable:
    """The local objective registered under ``name``."""
    found = _registered("objectives")
    if name not in found:
        raise ValueError(f"train objective {name!r} is unknown: must be ce or one of {', '.join(found)}")
    return load(found[name])


def plugin_builder(kind: str) -> Callable:
    """The builder of plug-in ``kind``: ``builder(spec, feature_dim) -> nn.Module``."""
    found = _registered("plugins")
    if kind not in found:
        raise ValueError(f"plug-in kind {kind!r} is unknown: must be one of {', '.join(found)}")
    return load(found[kind])


def method_styles() -> dict[str, tuple[str, str]]:
    """Each method's declared plot style, ``name -> (colour, marker)``, for ``tasks.plot_style``."""
    return {spec.name: spec.style for spec in all_methods() if spec.style}


def readers_of() -> dict[str, tuple[str, ...]]:
    """Each method-owned key -> the methods that read it (its owner and those that declare ``reads``)."""
    readers: dict[str, list[str]] = {}
    for spec in all_methods():
        for setting in spec.settings:
            readers.setdefault(setting.key, []).append(spec.name)
    for spec in all_methods():
        for key in spec.reads:
            readers[key].append(spec.name)
    return {key: tuple(names) for key, names in readers.items()}


def method_table() -> str:
    """The README's method table, from the registrations."""
    rows = ["| `method` | tasks | scenarios | what it does | paper |", "| --- | --- | --- | --- | --- |"]
    for spec in all_methods():
        name = f"`{spec.name}`" + (" (default)" if spec.default else "")
        rows.append(f"| {name} | {', '.join(spec.task_kinds)} | {', '.join(spec.scenarios)} | {spec.summary} "
                    f"| {spec.paper} |")
    return "\n".join(rows)


def key_table() -> str:
    """The README's run-config key table, from the settings of the config, the tasks and the methods."""
    from strategies.run_config import all_settings
    from tasks.registry import task_kinds

    used_by = {key: "method " + ", ".join(f"`{n}`" for n in names) for key, names in readers_of().items()}
    used_by.update({s.key: f"{kind.kind} tasks" for kind in task_kinds() for s in kind.settings})
    rows = ["| key | default | allowed | used by | meaning |", "| --- | --- | --- | --- | --- |"]
    for s in all_settings():
        allowed = s.allowed or ("one of " + ", ".join(s.choices()) if s.choices else "")
        if s.allow_inf:
            allowed += " (inf allowed)"
        default = f"'{s.default}'" if isinstance(s.default, str) else str(s.default)
        rows.append(f"| `{s.key}` | {default} | {allowed} | {used_by.get(s.key, 'every run')} | {s.help} |")
    return "\n".join(rows)


TABLES = {"methods": method_table, "keys": key_table}

#: pyproject's run-config tables: the top-level one and each namespace's (``[tool.flwr.app.config.lethe]``)
CONFIG_TABLE = "tool.flwr.app.config"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


def pyproject_config() -> str:
    """pyproject's ``[tool.flwr.app.config*]`` tables, from the declarations: the keys without a dot
    in the top-level table, a key ``NAMESPACE.NAME`` as ``NAME`` in table ``NAMESPACE`` (Flower
    flattens it back to ``NAMESPACE.NAME``)."""
    from strategies.run_config import all_settings

    tables: dict[str, list[str]] = {"": []}
    for s in all_settings():
        namespace, _, name = s.key.rpartition(".")
        tables.setdefault(namespace, []).append(f"{name} = {_toml_value(s.default)}")
    return "\n\n".join("\n".join([f"[{CONFIG_TABLE}{'.' + ns if ns else ''}]", *lines]) for ns, lines in tables.items())


def write_pyproject_config(path: str) -> bool:
    """Replace the ``[tool.flwr.app.config*]`` tables of the pyproject file at ``path`` by
    :func:`pyproject_config`, leaving every other byte as it was. True when the file changed."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    lines = text.split("\n")
    inside = [i for i, line in enumerate(lines) if line.startswith("[")]
    starts = [i for i in inside if lines[i] == f"[{CONFIG_TABLE}]" or lines[i].startswith(f"[{CONFIG_TABLE}.")]
    if not starts:
        raise ValueError(f"{path} has no [{CONFIG_TABLE}] table")
    end = next((i for i in inside if i > starts[-1] and i not in starts), len(lines))
    while end > starts[0] and lines[end - 1] == "":
        end -= 1
    updated = "\n".join([*lines[:starts[0]], pyproject_config(), *lines[end:]])
    if updated != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return updated != text


def write_readme_tables(path: str) -> bool:
    """Replace every table the file at ``path`` marks with ``<!-- <name>:begin -->`` ... ``<!-- <name>:end -->``
    (``name`` one of :data:`TABLES`: ``methods``, ``keys``) by the generated one; a file may hold any of
    them (README.md the method table, docs/settings.md the key table). ``ValueError`` when it holds
    none. True when the file changed."""
    import re

    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    updated, found = text, []
    for name, table in TABLES.items():
        pattern = re.compile(rf"(<!-- {name}:begin -->\n).*?(<!-- {name}:end -->)", re.S)
        if pattern.search(updated):
            found.append(name)
            updated = pattern.sub(lambda m, table=table: m.group(1) + table() + "\n" + m.group(2), updated)
    if not found:
        markers = ", ".join(f"<!-- {name}:begin --> ... <!-- {name}:end -->" for name in TABLES)
        raise ValueError(f"{path} has none of the generated tables' markers ({markers})")
    if updated != text:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(updated)
    return updated != text


if __name__ == "__main__":
    import sys

    if len(sys.argv) >= 3 and sys.argv[1] == "--write":
        for target in sys.argv[2:]:
            write = write_pyproject_config if target.endswith("pyproject.toml") else write_readme_tables
            print("updated" if write(target) else "unchanged", target)
    elif len(sys.argv) == 1:
        print(method_table(), "", key_table(), sep="\n")
    else:
        sys.exit("usage: python -m strategies.registry [--write FILE ...]  "
                 "(e.g. --write pyproject.toml README.md docs/settings.md)")
