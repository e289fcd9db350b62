"""A Ray cluster of several nodes on this machine, standing in for a cluster over several hosts.

The README's "several hosts" recipe is ``ray start --head`` on the SuperLink's host, ``ray start
--address=HEAD:PORT`` on every other host, then ``flwr run`` on the head: Flower's Ray backend calls
``ray.init()`` without an address, which joins the cluster named by ``RAY_ADDRESS`` (or the one
``ray start`` left on that machine). ``RayCluster`` runs that recipe with every node on this machine,
so the multi-node path is exercised where there is only one:

- the head takes ``head_cpus`` CPUs (default 0: like a SuperLink host, it runs no ClientApp, so
  every ClientApp must be placed on a joined node);
- one more node joins per entry of ``node_cpus``;
- every fixed-default port is chosen free (GCS, client server, each node's agent; no dashboard: it
  needs ``ray[default]``'s extra packages), each node's object store is kept small, Ray's files live
  in a short private temporary folder (Ray's socket paths must stay under the Unix 107-character
  limit), so two clusters never collide with each other or with a user's own;
- each ``ray start`` runs in its own process group, which the daemons it spawns keep; on exit every
  group is sent SIGTERM, then SIGKILL after ``stop_timeout`` seconds (``ray stop`` would stop every
  Ray process of every user on the machine, by name).

``env()`` gives ``RAY_ADDRESS`` for the process that calls ``ray.init()`` (the SuperLink's
simulation); ``nodes()`` and ``actors(class_name)`` say, from a short-lived driver process, which
nodes there are and which node ran each actor (Flower's ClientApps run as ``ClientAppActor``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from launch_federation import BIN, free_port, group_members  # imported with scripts/ on sys.path, as the tests do

OBJECT_STORE_BYTES = 256 * 1024**2  # per node; Ray's default (30 % of memory each) would reserve most of a small machine


class RayCluster:
    """``ray start`` head plus ``len(node_cpus)`` joined nodes on this machine; a context manager."""

    def __init__(self, node_cpus: tuple[int, ...] = (1, 1), head_cpus: int = 0, stop_timeout: float = 15.0):
        if not node_cpus or any(cpus < 1 for cpus in node_cpus) or head_cpus < 0:
            raise ValueError(f"node_cpus={node_cpus} head_cpus={head_cpus}: need at least one joined node, "
                             "each with >= 1 CPU, and head_cpus >= 0")
        self.node_cpus, self.head_cpus, self.stop_timeout = tuple(node_cpus), head_cpus, stop_timeout
        self.temp_dir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
        self.address = f"127.0.0.1:{free_port()}"
        self.groups: list[int] = []

    def env(self) -> dict[str, str]:
        """Environment for the process whose ``ray.init()`` must join this cluster."""
        return {"RAY_ADDRESS": self.address}

    def _start(self, *args: str) -> None:
        argv = [str(BIN / "ray"), "start", "--node-ip-address", "127.0.0.1", "--disable-usage-stats",
                "--dashboard-agent-listen-port", str(free_port()), "--object-store-memory", str(OBJECT_STORE_BYTES),
                *args]
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                start_new_session=True)
        self.groups.append(proc.pid)
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(argv)}` exited with {proc.returncode}: {out[-1500:]}")

    def __enter__(self) -> "RayCluster":
        try:
            self._start("--head", "--port", self.address.rsplit(":", 1)[1], "--num-cpus", str(self.head_cpus),
                        "--temp-dir", str(self.temp_dir), "--include-dashboard=false",
                        "--ray-client-server-port", str(free_port()))
            for cpus in self.node_cpus:
                self._start("--address", self.address, "--num-cpus", str(cpus))
            self._wait_for_nodes()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _query(self, body: str) -> object:
        """Run ``body`` (which sets ``result``) in a short-lived driver joined to the cluster; its
        ``result`` as JSON. A separate process, so the caller never becomes a Ray driver itself."""
        code = ("import json, ray\n"
                f"ray.init(address={self.address!r}, logging_level='ERROR', log_to_driver=False)\n"
                f"{body}\nprint('RESULT ' + json.dumps(result, default=str))\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"Ray query on {self.address} failed ({proc.returncode}): {proc.stderr[-1500:]}")
        return json.loads(lines[-1][len("RESULT "):])

    def nodes(self) -> list[dict]:
        """Alive nodes: ``node_id``, ``head`` (bool) and ``cpus``."""
        return self._query("result = [{'node_id': n['NodeID'], 'head': 'node:__internal_head__' in n['Resources'], "
                           "'cpus': n['Resources'].get('CPU', 0)} for n in ray.nodes() if n['Alive']]")

    def actors(self, class_name: str) -> list[dict]:
        """Every actor of ``class_name`` the cluster has run, alive or dead: ``node_id``, ``pid``,
        ``state`` (from the GCS actor table, ``ray._private.state.actors``, a Ray DeveloperAPI)."""
        return self._query("import ray._private.state as gcs\n"
                           f"result = [{{'node_id': a['Address']['NodeID'], 'pid': a.get('Pid'), 'state': a['State']}}"
                           f" for a in gcs.actors().values() if a['ActorClassName'] == {class_name!r}]")

    def _wait_for_nodes(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.nodes()) < 1 + len(self.node_cpus):
            if time.monotonic() > deadline:
                raise TimeoutError(f"not all {1 + len(self.node_cpus)} Ray nodes alive after {timeout:.0f} s")
            time.sleep(0.5)

    def pids(self) -> list[int]:
        """Live processes of the cluster (every group a ``ray start`` of ours began)."""
        return [pid for pgid in self.groups for pid in group_members(pgid)]

    def __exit__(self, *exc) -> None:
        """SIGTERM every group, then SIGKILL what is left after ``stop_timeout`` s; remove the folder."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pgid in self.groups:
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + self.stop_timeout
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.2)
            if not self.pids():
                break
        shutil.rmtree(self.temp_dir, ignore_errors=True)
