"""``receipt.json``: the record of each deletion request a run answered, and its check.

The receipt sits beside ``results.json`` and holds, per request: what was asked (scenario, target,
how many samples each client removed, and the hash of each forget set's sample ids that the client
made on its node, ``tasks.forget_ids``), the method with every setting and the recipe, the sha256
of the model before and after and of each plug-in file, the evidence (forget accuracy, MIA
efficacy, KR against the retrain oracle where it ran, resurfacing under continued training), how to
undo a reversible method's answer, and its time and bytes. Every file it names comes with its
sha256 (a folder, such as an LLM adapter given as ``original-model``, with ``core.files.folder_sha256``),
so ``verify`` can tell whether any of them changed since::

    python -m server_app.receipt verify RESULTS_FOLDER

exits 0 when every file matches, 1 with one line naming the first file that is missing or differs,
2 with one line when the folder holds no readable receipt.

A run's results hold one request (top-level ``request``, ``models`` ...) or a ``requests`` list with
one entry per request; :func:`build_receipt` reads either. An entry's ``model_files`` names
``before`` (default: the run's ``original``), ``unlearned`` (the model after), ``restored`` and
``continued`` where made; every other file in it is a plug-in the method added.
"""

from __future__ import annotations

import json
import os
import sys

from core.files import sha256_of, write_text
from server_app.report import replace_nonfinite

NAME = "receipt.json"
FORMAT = 1
MODEL_ROLES = ("original", "before", "unlearned", "restored", "continued")
EVIDENCE = ("forget_acc", "test_acc", "retain_acc", "mia_efficacy")


def request_record(fed, cfg) -> dict:
    """What the run was asked (results.json ``request``): the scenario, its target (the class, or the
    leaving client(s)) and, per client, the samples it removed and the hash of their ids made on the node."""
    forget_clients = [fed.client_id(n) for n in fed.nodes_with("n-forget")]
    if cfg["scenario"] == "class":
        target = cfg["forget-class"]
    else:
        target = forget_clients[0] if len(forget_clients) == 1 else forget_clients
    clients = []
    for node in sorted(fed.nodes.values(), key=lambda n: n.client_id):
        removed = node.class_counts.get("removed")
        entry = {"client_id": node.client_id, "node_id": node.node_id,
                 "removed": int(sum(removed)) if removed is not None else node.counts.get("n-forget", 0)}
        if removed is not None:
            entry["removed_per_class"] = list(removed)
        if node.forget_set:
            entry["forget_ids_sha256"] = node.forget_set.get("ids-sha256")
            entry["forget_ids"] = node.forget_set.get("ids")
        clients.append(entry)
    return {"scenario": cfg["scenario"], "target": target, "clients": clients}


def _file(files: dict, name: str) -> dict | None:
    entry = files.get(name)
    return {"path": entry["path"], "sha256": entry["sha256"]} if entry else None


def _entry(part: dict, results: dict) -> dict:
    """One request's receipt entry from its part of the results (``part``; the run's own where a key is
    not in it)."""
    def get(key):
        return part.get(key, results.get(key))

    run, files, models = results.get("run", {}), get("model_files") or {}, get("models") or {}
    resurfacing, missing = get("resurfacing") or {}, (get("validity") or {}).get("missing", [])
    plugins = {name: _file(files, name) for name in files if name not in MODEL_ROLES}
    before = _file(files, "before") or _file(files, "original")
    undo = None
    if plugins or "restored" in models:
        undo = {"drop_plugins": [p["path"] for p in plugins.values()],
                "restored_model": (_file(files, "restored") or before or {}).get("path"),
                "restored_equals_before": models.get("restored", {}).get("equals_original")}
    return {
        "request": get("request"),
        "method": {"name": run.get("method"), "recipe": run.get("recipe"), "settings": run.get("config"),
                   "presets": run.get("presets"), "recipe_settings": run.get("recipe_settings"),
                   "details": get("method")},
        "models": {"given_original": run.get("original_model"), "before": before,
                   "after": _file(files, "unlearned"), "continued": _file(files, "continued"),
                   "plugins": plugins},
        "evidence": {"models": {name: {k: entry.get(k) for k in EVIDENCE if k in entry}
                                for name, entry in models.items() if isinstance(entry, dict)},
                     "kr_retrain": resurfacing.get("kr_retrain"),
                     "resurfacing": {k: resurfacing.get(k) for k in ("kr_curve", "ct_kr", "rr")},
                     "missing": missing},
        "undo": undo,
        "cost": {phase: {"seconds": c.get("seconds"), "bytes": c.get("bytes_up", 0) + c.get("bytes_down", 0)}
                 for phase, c in (get("cost") or {}).items() if isinstance(c, dict) and "seconds" in c},
    }


def build_receipt(results: dict, folder: str) -> dict:
    """The receipt of the run whose results are ``results`` (written to ``folder``): one entry per request."""
    parts = results.get("requests") or [results]
    path = os.path.join(folder, "results.json")
    return {"format": FORMAT,
            "results": {"path": "results.json", "sha256": sha256_of(path)} if os.path.isfile(path) else None,
            "seconds_total": results.get("seconds_total"),
            "requests": [_entry(part, results) for part in parts]}


def write_receipt(folder: str, results: dict) -> str:
    """Write ``folder/receipt.json`` (atomically, after results.json so it holds its hash); its path."""
    path = os.path.join(folder, NAME)
    # a setting of inf (no DP noise, no projection) is written "inf"
    write_text(path, json.dumps(replace_nonfinite(build_receipt(results, folder), str), indent=2, allow_nan=False))
    return path


def named_files(receipt) -> list[tuple[str, str]]:
    """Every ``(path, sha256)`` the receipt names, in order, each once."""
    found: list[tuple[str, str]] = []

    def walk(value):
        if isinstance(value, dict):
            named = (value.get("path"), value.get("sha256"))
            if all(isinstance(part, str) for part in named) and named not in found:
                found.append(named)
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(receipt)
    return found


def verify(folder: str) -> tuple[int, str]:
    """``(exit code, one line)``: 0 all files match, 1 the first that is missing or differs, 2 no receipt."""
    path = os.path.join(folder, NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            receipt = json.load(handle)
    except (OSError, ValueError) as err:
        return 2, f"{folder}: no readable {NAME} ({type(err).__name__}: {str(err).splitlines()[0]})"
    if not isinstance(receipt, dict) or not isinstance(receipt.get("requests"), list):
        return 2, f"{path}: not a receipt (no 'requests' list)"
    files = named_files(receipt)
    for name, expected in files:
        full = name if os.path.isabs(name) else os.path.join(folder, name)
        if not os.path.exists(full):
            return 1, f"{name}: missing"
        actual = sha256_of(full)
        if actual != expected:
            return 1, f"{name}: sha256 {actual} differs from the receipt's {expected}"
    return 0, f"{path}: all {len(files)} files match"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m server_app.receipt", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser("verify", help="recompute the sha256 of every file the receipt names")
    check.add_argument("folder", help="a run's results folder (holds receipt.json)")
    args = parser.parse_args(argv)
    code, line = verify(args.folder)
    print(line, file=sys.stdout if code == 0 else sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
