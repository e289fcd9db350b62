"""Cold start of the default task's ClientApp: process start -> first handler (``query.hello``) done.

Flower's Deployment Engine starts a fresh ClientApp process for every message, so this is paid
once per message on a real SuperNode. Each variant runs in a fresh Python process, side by side
in one run, ``--repeats`` times (median shown):

- ``torch+flwr``: importing torch and flwr alone (the floor);
- ``before``: what the ClientApp did before: the LLM stack (transformers, peft) imported with
  ``client_app.app``, and the data view rebuilt from the pool (an empty node cache);
- ``now, first message``: lazy imports, the view built and stored in the node cache;
- ``now, a new request's first message``: lazy imports, the node cache holds an earlier request's
  view and the Dirichlet assignment (stored apart from the request), so this request's view is
  built without recomputing the partition (no flwr-datasets import);
- ``now, later messages``: lazy imports, the view read from the node cache (every message after
  a node's first);
- ``now, a prepared node's first message``: ``python -m client_app.prepare`` ran first with the
  node's config (what an operator, or ``scripts/launch_federation.py``, runs before a run), so the
  first message reads the view it stored;
- ``now, own files (data-path), first message``: a node that reads its own ``train.npz`` /
  ``test.npz`` (a real deployment; no partition of a shared pool, so no flwr-datasets), empty cache;
- ``torch+flwr-clientapp`` and ``now, later messages, inside flwr-clientapp``: the same two with
  the imports of Flower's ``flwr-clientapp`` command first. A SuperNode starts each ClientApp
  through that command, whose package (``flwr.supernode.cli``) also imports the SuperNode's own CLI
  (SQLAlchemy, Alembic, FastAPI): Flower's cost, paid before the app's code is loaded, which the
  app cannot remove. The variants above time the app's part;
- ``torch+flwr+lean flwr-clientapp`` and ``now, later messages, inside the lean flwr-clientapp``:
  the same with the imports of the launcher's lean ``flwr-clientapp`` instead (Flower's command
  function loaded without that package; ``scripts/launch_federation.py``), which SuperNodes the
  launcher starts use;
- ``now, later messages, forked from the warm server``: the same message in a child of
  ``scripts/clientapp_commands.py``'s fork server (torch, numpy, scikit-learn and Flower's ClientApp
  runtime imported once, before the clock starts), asked for by its ``flwr-clientapp`` command:
  what a message costs on the launcher's default SuperNodes;
- ``--base PATH``: also the real code of an older checkout at PATH (its own imports and views).

    python benchmarks/bench_cold_start.py [--repeats 3] [--base /path/to/old/checkout]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Iterator

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from clientapp_commands import (DEFAULT_PRELOAD, LEAN_LOADER, new_socket_path, server_argv,  # noqa: E402
                                wait_until_serving, write_forking_clientapp)

FLOOR = "import time, torch, flwr.app, flwr.clientapp; print(time.time())"
FLOOR_CLI = ("import time, torch, flwr.app, flwr.clientapp; from flwr.supernode.cli.flwr_clientapp import flwr_clientapp; "
             "print(time.time())")
FLOOR_LEAN = f"import time, torch, flwr.app, flwr.clientapp\n{LEAN_LOADER}print(time.time())"

HELLO = r"""
import sys, time
if sys.argv[1] == "inside-flwr-clientapp":
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp  # what the SuperNode's command imports first
if sys.argv[1] == "inside-lean-clientapp":
    LEAN_LOADER  # (replaced below) what the launcher's lean flwr-clientapp imports first
if sys.argv[1] == "eager-llm":
    import strategies.firm.client, tasks.llm.federation_model  # the LLM stack client_app.app imported eagerly before
import client_app.app
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.supercore.task_identity import TaskIdentity

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
node = {"partition-id": 0, "num-partitions": 10}
if sys.argv[2]:
    node["view-cache-dir"] = sys.argv[2]
run_config = {"scenario": sys.argv[3]} if len(sys.argv) > 3 else {}
if len(sys.argv) > 4:
    node["data-path"] = sys.argv[4]
context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run_config, node_config=node)
message = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=7, message_type="query.hello")
reply = client_app.app.app(message, context)
assert not reply.has_error(), reply.error
print(time.time())
""".replace("    LEAN_LOADER  # (replaced below) what the launcher's lean flwr-clientapp imports first\n",
           textwrap.indent(LEAN_LOADER, "    "))


def seconds(code: list[str], pythonpath: Path, argv: list[str] | None = None) -> float:
    """Wall seconds from spawning a fresh interpreter (or ``argv``) to the end time it prints."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    started = time.time()
    out = subprocess.run(argv or [sys.executable, "-c", *code], cwd=pythonpath, env=env, capture_output=True,
                         text=True, check=True).stdout
    return float(out.strip().splitlines()[-1]) - started


def run_hello() -> None:
    """The fork server's target in the forked variant: HELLO with this process's arguments."""
    exec(compile(HELLO, "<hello>", "exec"), {"__name__": "__main__"})  # noqa: S102 (this file's own code)


@contextlib.contextmanager
def fork_server(folder: str) -> Iterator[Path]:
    """A running fork server (default preload, :func:`run_hello` as its target), ready; yields its
    command; stopped by its process group and its socket folder removed afterwards."""
    socket_path = new_socket_path("fu-bench-")
    server = subprocess.Popen(server_argv(socket_path, DEFAULT_PRELOAD + ",flwr.supernode.runtime.run_clientapp",
                                          "bench_cold_start:run_hello"), cwd=ROOT, start_new_session=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")])},
                              stdout=subprocess.DEVNULL)
    try:
        wait_until_serving(server, socket_path, 120)
        yield write_forking_clientapp(Path(folder) / "bin", socket_path)
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()
        shutil.rmtree(socket_path.parent, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--base", type=Path, help="an older checkout of this repository to time as well")
    args = parser.parse_args()
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    with tempfile.TemporaryDirectory() as scratch, fork_server(scratch) as forking:
        warm = os.path.join(scratch, "warm")
        seconds([HELLO, "lazy", warm], ROOT)  # fills the node cache the "later messages" variant reads

        def fresh_cache() -> str:
            return tempfile.mkdtemp(dir=scratch)

        own = os.path.join(scratch, "own")
        os.makedirs(own)
        rng = np.random.default_rng(0)
        for split, n in (("train", 180), ("test", 45)):  # the size of a digits partition at 10 nodes
            np.savez(os.path.join(own, f"{split}.npz"), x=rng.integers(0, 256, (n, 32, 32), dtype=np.uint8),
                     y=rng.integers(0, 10, n))

        def new_request() -> float:
            folder = fresh_cache()
            seconds([HELLO, "lazy", folder, "class"], ROOT)  # an earlier request on this node
            return seconds([HELLO, "lazy", folder], ROOT)

        def prepared() -> float:
            folder = fresh_cache()
            subprocess.run([sys.executable, "-m", "client_app.prepare", "--node-config",
                            f"partition-id=0 num-partitions=10 view-cache-dir='{folder}'"],
                           cwd=ROOT, capture_output=True, check=True)
            return seconds([HELLO, "lazy", folder], ROOT)

        variants = {
            "torch+flwr": lambda: seconds([FLOOR], ROOT),
            "before": lambda: seconds([HELLO, "eager-llm", fresh_cache()], ROOT),
            "now, first message": lambda: seconds([HELLO, "lazy", fresh_cache()], ROOT),
            "now, a new request's first message": new_request,
            "now, later messages": lambda: seconds([HELLO, "lazy", warm], ROOT),
            "now, a prepared node's first message": prepared,
            # the class scenario: a data-path federation names its forget client, the default (-1) needs the pool
            "now, own files (data-path), first message": lambda: seconds([HELLO, "lazy", fresh_cache(), "class", own],
                                                                         ROOT),
            "torch+flwr-clientapp": lambda: seconds([FLOOR_CLI], ROOT),
            "now, later messages, inside flwr-clientapp": lambda: seconds([HELLO, "inside-flwr-clientapp", warm], ROOT),
            "torch+flwr+lean flwr-clientapp": lambda: seconds([FLOOR_LEAN], ROOT),
            "now, later messages, inside the lean flwr-clientapp": lambda: seconds(
                [HELLO, "inside-lean-clientapp", warm], ROOT),
            "now, later messages, forked from the warm server": lambda: seconds([], ROOT, [str(forking), "lazy", warm]),
        }
        if args.base:
            variants[f"checkout {args.base}"] = lambda: seconds([HELLO, "base", ""], args.base.resolve())
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.repeats):  # interleaved, so machine load hits every variant alike
            for name, run in variants.items():
                times[name].append(run())
    median = {name: statistics.median(values) for name, values in times.items()}
    print(f"| variant | median s (of {args.repeats}) | runs |")
    print("| --- | --- | --- |")
    for name, value in median.items():
        print(f"| {name} | {value:.2f} | {', '.join(f'{t:.2f}' for t in times[name])} |")
    later = median["now, later messages"]
    print(f"before / now (later messages): {median['before'] / later:.1f}x; "
          f"before / now (first message): {median['before'] / median['now, first message']:.1f}x; "
          f"now (later messages) - torch+flwr: {later - median['torch+flwr']:.2f} s")
    print(f"flwr-clientapp's own imports (Flower's): +{median['torch+flwr-clientapp'] - median['torch+flwr']:.2f} s "
          f"on the floor, +{median['now, later messages, inside flwr-clientapp'] - later:.2f} s on a later message")
    lean = median["now, later messages, inside the lean flwr-clientapp"]
    print(f"the launcher's lean flwr-clientapp: +{median['torch+flwr+lean flwr-clientapp'] - median['torch+flwr']:.2f} s "
          f"on the floor, +{lean - later:.2f} s on a later message ({lean:.2f} s; Flower's command: "
          f"{median['now, later messages, inside flwr-clientapp']:.2f} s)")
    forked = median["now, later messages, forked from the warm server"]
    print(f"forked from the warm server: {forked:.2f} s a later message, {lean / forked:.1f}x less than the lean "
          f"launcher's fresh process")
    if args.base:
        print(f"checkout / now (later messages): {median[f'checkout {args.base}'] / later:.1f}x")


if __name__ == "__main__":
    main()
