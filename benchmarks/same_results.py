"""Does a change keep behaviour? The same runs in two checkouts, their results.json metrics side by side.

Each checkout runs every configuration in process (``server_app.inprocess``, its own fresh model
cache, so pretraining is compared too) in a subprocess with that checkout first on the path; then
every number under ``models`` and ``resurfacing`` of the two results.json files is compared
(seconds excluded). Prints one row per configuration: ``same`` or the keys that differ.

    git worktree add /tmp/before <old commit> --detach
    python benchmarks/same_results.py --before /tmp/before --after . [--only fedup]
    python benchmarks/same_results.py --before /tmp/before --config "10:method='fedup' scenario='class'"

The default configurations are the README's main command and each method's documented command:
every vision method in every scenario it supports (10 clients) and every LLM method (4 clients).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

RUNNER = r"""
import json, os, sys
sys.path.insert(0, sys.argv[1]); os.chdir(sys.argv[1])
from server_app.inprocess import parse_overrides, run_inprocess
clients, text, out = int(sys.argv[2]), sys.argv[3], sys.argv[4]
rc = {**parse_overrides(text), "cache-dir": os.path.join(out, "cache"), "outputs-dir": os.path.join(out, "outputs")}
folder = run_inprocess(rc, clients)
results = json.load(open(os.path.join(folder, "results.json")))
print("RESULTS " + json.dumps({"models": results["models"], "resurfacing": results["resurfacing"]}))
"""


def default_runs() -> list[tuple[int, str]]:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from strategies.registry import all_methods

    runs = []
    for spec in all_methods():
        if "vision" in spec.task_kinds:
            runs += [(10, f"method='{spec.name}' scenario='{s}'") for s in spec.scenarios]
        if "llm" in spec.task_kinds:  # a preset is spelled out, so a checkout without presets runs the same
            preset = " ".join(f"{k}={_toml(v)}" for k, v in spec.presets.get("llm", {}).items())
            runs.append((4, f"task='llm-tofu' method='{spec.name}' scenario='sample' {preset}".strip()))
    return runs


def _toml(value) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"'{value}'" if isinstance(value, str) else str(value)


def numbers(tree, prefix: str = "") -> dict:
    """Every number in ``tree`` by its dotted path (list items as ``key.0``, ``key.1``...), seconds left out."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, list):
            value = {str(i): item for i, item in enumerate(value)}
        if isinstance(value, dict):
            out.update(numbers(value, f"{prefix}{key}."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and not key.endswith("seconds"):
            out[prefix + key] = value
    return out


def run(checkout: str, clients: int, text: str, out: str) -> dict | str:
    proc = subprocess.run([sys.executable, "-c", RUNNER, os.path.abspath(checkout), str(clients), text, out],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULTS "):
            return numbers(json.loads(line[len("RESULTS "):]))
    return (proc.stderr.strip().splitlines() or ["no output"])[-1]


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--after", default=".")
    parser.add_argument("--only", default="", help="run only configurations containing this text")
    parser.add_argument("--config", action="append", default=[], metavar="CLIENTS:RUN_CONFIG",
                        help="run this configuration instead of the defaults (repeatable), e.g. "
                             "\"10:method='fedup' scenario='class' continue-rounds=0\"")
    args = parser.parse_args()
    runs = [(int(c), text) for c, _, text in (item.partition(":") for item in args.config)] or default_runs()
    with tempfile.TemporaryDirectory() as before_out, tempfile.TemporaryDirectory() as after_out:
        for clients, text in runs:
            if args.only and args.only not in text:
                continue
            a, b = run(args.before, clients, text, before_out), run(args.after, clients, text, after_out)
            if isinstance(a, str) or isinstance(b, str):
                print(f"{text} | error | before: {a if isinstance(a, str) else 'ok'} | after: {b if isinstance(b, str) else 'ok'}")
                continue
            differ = sorted(k for k in set(a) | set(b) if not same(a.get(k), b.get(k)))
            shown = ", ".join(f"{k} {a.get(k)} -> {b.get(k)}" for k in differ[:3])
            print(f"{text} | {'same' if not differ else f'{len(differ)} differ: {shown}'} | {len(a)} numbers", flush=True)


if __name__ == "__main__":
    main()
