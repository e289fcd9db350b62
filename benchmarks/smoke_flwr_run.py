"""The smoke setting under the real ``flwr run . --stream``: seconds per registered method.

A federation's own CI runs ``flwr run . --stream --run-config "smoke=true method=..."``; this
prints, per method (on the first task kind it declares, in its sample scenario or else its first
one), the wall seconds of that command with ``--supernodes`` nodes — Ray
start, the managed local SuperLink, every phase — and whether it finished with a results folder.
Each run uses its own Flower home and free local ports, and stops the SuperLink it started by pid.

    python benchmarks/smoke_flwr_run.py [--methods fedup,lethe] [--supernodes 3]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from launch_federation import LocalSimulation  # noqa: E402
from strategies.registry import all_methods  # noqa: E402

TASK_OF_KIND = {"vision": "digits-lenet5", "llm": "llm-tofu"}


def smoke_run(method: str, task: str, scenario: str, supernodes: int, folder: Path) -> tuple[float, bool, str]:
    """(seconds, finished with a results folder, last log line) of one smoke ``flwr run``."""
    run_config = (f"smoke=true task='{task}' method='{method}' scenario='{scenario}' cache-dir='{folder / 'cache'}' "
                  f"outputs-dir='{folder / 'out'}'")
    started = time.perf_counter()
    try:
        with LocalSimulation(folder / "flwr-home") as simulation:
            proc = simulation.flwr("run", ".", "--stream", "--federation-config",
                                   f"num-supernodes={supernodes} client-resources-num-cpus=1", "--run-config", run_config)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as err:
        log = f"timed out after {err.timeout}s"
    seconds = time.perf_counter() - started
    done = re.search(r"fedunlearn results folder: (\S+)", log) is not None
    return seconds, done, (log.strip().splitlines() or [""])[-1][:120]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="", help="comma-separated; default: every registered method")
    parser.add_argument("--supernodes", type=int, default=3)
    args = parser.parse_args()
    wanted = [m for m in args.methods.split(",") if m]
    print("| method | task | scenario | seconds | finished |\n| --- | --- | --- | --- | --- |", flush=True)
    for spec in all_methods():
        if wanted and spec.name not in wanted:
            continue
        task = TASK_OF_KIND[spec.task_kinds[0]]
        scenario = "sample" if "sample" in spec.scenarios else spec.scenarios[0]
        with tempfile.TemporaryDirectory() as tmp:
            seconds, done, last = smoke_run(spec.name, task, scenario, args.supernodes, Path(tmp))
        print(f"| {spec.name} | {task} | {scenario} | {seconds:.1f} | {'yes' if done else 'NO: ' + last} |", flush=True)


if __name__ == "__main__":
    main()
