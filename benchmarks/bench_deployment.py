"""One FedUP request end to end: Flower's Deployment Engine vs its Ray simulation, side by side.

The same run config and number of clients, run three ways in one go:

- ``deployment``: ``scripts/launch_federation.py``'s federation (SuperLink + SuperNodes as separate
  processes on loopback, TLS, node authentication; a fresh ClientApp process per message);
- ``simulation``: ``flwr run . --stream --federation-config "num-supernodes=N ..."`` on a managed
  local SuperLink with Ray (own ``FLWR_HOME`` and ports, stopped by pid afterwards);
- ``in-process``: ``server_app.inprocess`` (no Flower transport at all; the floor).

The original and retrain models are trained once by the in-process run into a shared cache
(their cache key is the same for all three: same config, same clients), so each engine times the
request itself: ``unlearn`` is the unlearning phase (``cost.unlearn.seconds``: what answering the
deletion request takes), ``run`` the whole run after the cached models are found (hello,
unlearning, evaluation, continue rounds, restore, report). Also prints the largest metric
difference between the engines (same seed, same partitions: expected 0). ``--clientapps`` names
the deployments to time, one federation each, by how their SuperNodes start a ClientApp
(``scripts/clientapp_commands.py``): ``fork`` (the launcher's default: forked from a server that
imported torch and Flower once), ``lean`` (a fresh interpreter through the lean launcher of
Flower's command), ``flower`` (Flower's own ``flwr-clientapp``).

    python benchmarks/bench_deployment.py [--clients 3] [--run-config "fedup.epochs=200"] [--clientapps fork,lean,flower]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

from launch_federation import CLIENTAPPS, LocalFederation, LocalSimulation  # noqa: E402

# The default pretraining (trained once in process, then cached), so the request is answered on a
# usable original; one continued round keeps the run short.
BASE = "method='fedup' scenario='class' continue-rounds=1 mia-max-samples=30"


def _results(folder: str) -> dict:
    return json.loads((Path(folder) / "results.json").read_text())


def deployment(run_config: str, clients: int, work: Path, clientapp: str) -> tuple[dict, float]:
    with LocalFederation(work / f"federation-{clientapp}", clients, clientapp=clientapp) as federation:
        started = time.perf_counter()
        result = federation.run(run_config)
        seconds = time.perf_counter() - started
    if result.status != "finished:completed" or not result.folder:
        raise SystemExit(f"deployment run failed ({result.status}): {result.log[-2000:]}")
    return _results(result.folder), seconds


def simulation(run_config: str, clients: int, work: Path) -> tuple[dict, float]:
    with LocalSimulation(work / "sim-flwr-home") as local:
        started = time.perf_counter()
        proc = local.flwr("run", ".", "--stream", "--federation-config",
                          f"num-supernodes={clients} client-resources-num-cpus=1", "--run-config", run_config,
                          timeout=3600)
        seconds = time.perf_counter() - started
    match = re.search(r"fedunlearn results folder: (\S+)", proc.stdout + proc.stderr)
    if not match:
        raise SystemExit(f"simulation run failed: {(proc.stdout + proc.stderr)[-2000:]}")
    return _results(match.group(1)), seconds


def metrics(results: dict) -> dict[str, float]:
    return {f"{m}.{k}": v for m, entry in results["models"].items() for k, v in entry.items()
            if isinstance(v, float)}


def main() -> None:
    from server_app.inprocess import parse_overrides, run_inprocess

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--run-config", default="", help="more overrides, as for flwr run --run-config")
    parser.add_argument("--clientapps", default="fork",
                        help=f"comma-separated deployments to time side by side, by how SuperNodes start a ClientApp "
                             f"({', '.join(CLIENTAPPS)}; default fork, the launcher's)")
    args = parser.parse_args()
    if args.clients < 2:
        raise SystemExit("--clients must be >= 2")
    clientapps = [name for name in args.clientapps.split(",") if name]
    if not clientapps or set(clientapps) - set(CLIENTAPPS):
        raise SystemExit(f"--clientapps={args.clientapps!r}: expected a comma-separated subset of {', '.join(CLIENTAPPS)}")
    with tempfile.TemporaryDirectory(prefix="bench-deployment-") as scratch:
        work = Path(scratch)
        run_config = f"{BASE} {args.run_config} cache-dir='{work / 'cache'}' outputs-dir='{work / 'out'}'"
        run_inprocess(parse_overrides(run_config), args.clients)  # trains the cached original and retrain
        started = time.perf_counter()
        rows = {"in-process": (_results(run_inprocess(parse_overrides(run_config), args.clients)),
                               time.perf_counter() - started)}
        rows["simulation (Ray)"] = simulation(run_config, args.clients, work)
        for clientapp in clientapps:
            rows[f"deployment (TLS, auth), {clientapp}"] = deployment(run_config, args.clients, work, clientapp)
    print(f"FedUP request, {args.clients} clients, run config: {run_config.split(' cache-dir')[0]}")
    print("| engine | unlearn s | run s (ServerApp) | wall s (incl. start/stop) |")
    print("| --- | --- | --- | --- |")
    for name, (results, wall) in rows.items():
        print(f"| {name} | {results['cost']['unlearn']['seconds']:.2f} | {results['seconds_total']:.1f} | {wall:.1f} |")
    phases = [phase for phase, cost in rows[f"deployment (TLS, auth), {clientapps[0]}"][0]["cost"].items()
              if isinstance(cost, dict) and "seconds" in cost]
    print("\nseconds per phase (cost.<phase>.seconds)")
    print("| engine | " + " | ".join(phases) + " |")
    print("| --- |" + " --- |" * len(phases))
    for name, (results, _) in rows.items():
        print(f"| {name} | " + " | ".join(f"{results['cost'].get(p, {}).get('seconds', float('nan')):.2f}"
                                          for p in phases) + " |")
    sim = rows["simulation (Ray)"][0]
    for clientapp in clientapps:
        dep = rows[f"deployment (TLS, auth), {clientapp}"][0]
        ours, theirs = metrics(dep), metrics(sim)
        both_nan = [k for k in ours if math.isnan(ours[k]) and math.isnan(theirs[k])]  # e.g. a diverged model
        gaps = [abs(ours[k] - theirs[k]) for k in ours if k not in both_nan]
        print(f"deployment ({clientapp}) / simulation: unlearn "
              f"{dep['cost']['unlearn']['seconds'] / sim['cost']['unlearn']['seconds']:.1f}x, "
              f"run {dep['seconds_total'] / sim['seconds_total']:.1f}x; largest metric difference "
              f"{max(gaps):.2g} over {len(gaps)} metrics ({len(both_nan)} NaN in both)")


if __name__ == "__main__":
    main()
