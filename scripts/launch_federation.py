"""Bring a whole fedunlearn federation up on this machine with Flower's Deployment Engine, run one
experiment on it, collect its results, and stop every process it started.

What it does, in a fresh temporary folder (``--workdir`` keeps it):

1. a TLS certificate authority and a SuperLink certificate for ``localhost``/``127.0.0.1`` (and
   ``--host``, when given), and one
   ECDSA P-384 key pair per SuperNode (OpenSSH format, like ``ssh-keygen -t ecdsa -b 384``),
   all generated with ``cryptography`` (a dependency of flwr, so no system tool is needed);
2. ``flower-superlink`` with TLS and ``--enable-supernode-auth`` on a free port: on loopback, or with
   ``--host ADDRESS`` on all interfaces as on a real server, the nodes and ``flwr`` then connecting
   to ``ADDRESS`` (this machine's own non-loopback address stands in for the server's);
3. a connection ``[superlink.<name>]`` (address + root certificate) in its own
   ``FLWR_HOME/config.toml``, and every node key registered with ``flwr supernode register``;
4. ``--nodes`` ``flower-supernode`` processes (``partition-id=i num-partitions=N``, or
   ``data-path=<folder>/<i>`` with ``--data-root``), each with its own ``FLWR_HOME`` and runtime port,
   waited for until all are online; their PATH starts with fedunlearn's ``flwr-clientapp``
   (``scripts/clientapp_commands.py``; ``--clientapp``): by default each message's ClientApp is
   forked from a server that imported torch and Flower once (``fork``), or a lean launcher of
   Flower's command starts it (``lean``), or Flower's own command (``flower``);
5. before each run, ``python -m client_app.prepare`` for every node with the run's config, all at
   once (``prepare=False`` / ``--no-prepare`` skips it): each node's data is checked and its view
   stored, so the run's first message does not compute the partition;
6. ``flwr run . <connection> --run-config ... --stream``; the ServerApp's line
   ``fedunlearn results folder: ...`` gives the results; the run's status is polled with
   ``flwr ls <connection> --format=json`` until it is finished;
7. every process stopped by its process group (each child starts in its own), also on failure,
   Ctrl-C or SIGTERM.

    python scripts/launch_federation.py --nodes 3 --run-config "method='fedup' scenario='class'"

``LocalFederation`` is the same as a context manager (the deployment tests use it).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import ipaddress
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from clientapp_commands import DEFAULT_PRELOAD, new_socket_path, server_argv, write_forking_clientapp, write_lean_clientapp

ROOT = Path(__file__).resolve().parents[1]
CLIENTAPPS = ("fork", "lean", "flower")  # how SuperNodes start a ClientApp (docstring, step 4)


def flower_bin() -> Path:
    """The folder of Flower's commands (``flwr``, ``flower-superlink``, and ``flower-superexec`` and
    ``flwr-clientapp``, which the SuperLink and SuperNodes start by name): next to this interpreter, as
    in a virtual environment, else where ``flwr`` is found on PATH (packages installed with ``pip
    --target``, whose commands land in the target's ``bin``)."""
    beside = Path(sys.executable).parent
    on_path = shutil.which("flwr")
    return beside if (beside / "flwr").exists() or on_path is None else Path(on_path).parent


def with_flower_on_path(env: dict[str, str]) -> dict[str, str]:
    """``env`` with ``BIN`` first on PATH: the SuperLink and the SuperNodes start ``flower-superexec``
    and ``flwr-clientapp`` by name, so an interpreter run by its full path, without its environment
    activated, would otherwise find none (or another installation's)."""
    return {**env, "PATH": os.pathsep.join(filter(None, [str(BIN), env.get("PATH")]))}


BIN = flower_bin()

CONNECTION = "fedunlearn-local"
RESULTS_LINE = re.compile(r"fedunlearn results folder: (\S+)")
RUN_ID_LINE = re.compile(r"Successfully started run (\d+)")
SUPEREXEC_POLL = "0.25"  # seconds between a SuperNode's checks for a task to start (Flower's default: 1)


def free_port() -> int:
    """A TCP port that nothing listens on now, on any interface (the kernel picks it)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def own_address() -> str:
    """This machine's address on its default route (what another host would connect to), or
    127.0.0.1 when it has none. A UDP ``connect`` sends nothing; it only picks the interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.123", 9))  # TEST-NET-1: never answered, only routed
            return sock.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or a name) is this machine's loopback."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def write_certificates(folder: Path, host: str = "localhost") -> dict[str, Path]:
    """A CA (``ca.crt``) and a SuperLink key and certificate signed by it (``server.key``,
    ``server.pem``) valid for ``host`` and for loopback (``localhost``, 127.0.0.1, ::1): Flower 1.42's
    SuperLink on a bind-all host reaches its own Runtime API at 127.0.0.1 over the same TLS."""
    hosts = tuple(dict.fromkeys(("localhost", "127.0.0.1", "::1", host)))
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    def cert(subject, issuer, public_key, signing_key, extensions) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
                   .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=30)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical=critical)
        return builder.sign(signing_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = cert(name("fedunlearn local CA"), name("fedunlearn local CA"), ca_key.public_key(), ca_key,
              [(x509.BasicConstraints(ca=True, path_length=0), True)])
    server_key = ec.generate_private_key(ec.SECP384R1())
    sans = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    server = cert(name(hosts[0]), ca.subject, server_key.public_key(), ca_key,
                  [(x509.SubjectAlternativeName(sans), False), (x509.BasicConstraints(ca=False, path_length=None), True)])
    paths = {"ca": folder / "ca.crt", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(server_key.private_bytes(serialization.Encoding.PEM,
                                                      serialization.PrivateFormat.TraditionalOpenSSL,
                                                      serialization.NoEncryption()))
    paths["key"].chmod(0o600)
    return paths


def write_node_key(path: Path) -> Path:
    """An ECDSA P-384 key pair in OpenSSH format: ``path`` (private) and ``path.pub``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()))
    path.chmod(0o600)
    path.with_suffix(".pub").write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                                      serialization.PublicFormat.OpenSSH))
    return path


@dataclass
class RunResult:
    """What ``flwr run`` gave: the run id, its final status, the results folder (None if the
    ServerApp did not print one) and the streamed log."""

    run_id: int | None
    status: str
    folder: str | None
    log: str


class LocalFederation:
    """SuperLink + SuperNodes as separate processes on this machine, TLS and node authentication on.

    ``node_config(i)`` gives node ``i``'s ``--node-config`` string (default: its partition of
    ``num_nodes``). Every child runs in its own process group, logged to ``<workdir>/logs``.

    ``host`` is the address the nodes and ``flwr`` connect to. On loopback (the default) the
    SuperLink listens there only; any other address makes it listen on all interfaces
    (``--host 0.0.0.0``), as a real server does. Flower 1.42's SuperLink then reaches its own
    Runtime API, for the ServerApp, at 127.0.0.1 with TLS, so the certificate names 127.0.0.1 (and
    ``localhost``, ``::1``) besides ``host``: without it, every run is created and never starts.

    ``run_dir`` is the folder the SuperLink runs in, and with it every run's ServerApp (Flower starts
    it as the SuperLink's child): a relative path in a run config (``original-model``,
    ``outputs-dir``, ``cache-dir``) is resolved there. Default: the current folder, so a run config
    means what it means to ``flwr run`` and the in-process runner started here, and results never
    land in a temporary ``workdir``.
    """

    def __init__(self, workdir: Path, num_nodes: int, node_config: Callable[[int], str] | None = None,
                 max_wait: float = 120.0, prepare: bool = True, host: str = "127.0.0.1", clientapp: str = "fork",
                 preload: str = DEFAULT_PRELOAD, run_dir: Path | None = None):
        if num_nodes < 2:
            raise ValueError(f"--nodes={num_nodes}: a federation needs at least 2 SuperNodes")
        if clientapp not in CLIENTAPPS:
            raise ValueError(f"--clientapp={clientapp!r}: expected one of {', '.join(CLIENTAPPS)}")
        missing = [name for name in preload.split(",") if clientapp == "fork" and name
                   and importlib.util.find_spec(name.split(".")[0]) is None]
        if missing:
            raise ValueError(f"--preload={preload!r}: no module {', '.join(missing)} in this environment")
        self.workdir = Path(workdir)
        self.run_dir = Path(run_dir or Path.cwd()).resolve()
        self.num_nodes = num_nodes
        self.node_config = node_config or (lambda i: f"partition-id={i} num-partitions={num_nodes}")
        self.max_wait = max_wait
        self.prepare = prepare
        self.node_configs: dict[str, str] = {}
        self.home = self.workdir / "flwr-home"
        self.env = with_flower_on_path({**os.environ, "FLWR_HOME": str(self.home)})
        # the SuperNodes' PATH: fedunlearn's flwr-clientapp (written by start) ahead of Flower's commands
        self.clientapp = clientapp
        self.preload = preload  # what the fork server imports once (clientapp 'fork')
        self.command_bin = self.workdir / "bin" if clientapp != "flower" else None
        self.node_path = os.pathsep.join(filter(None, [str(self.command_bin or ""), self.env["PATH"]]))
        self.socket_dir: Path | None = None  # the fork server's socket folder
        self.port = free_port()
        self.host = host
        self.address = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.processes: dict[str, subprocess.Popen] = {}
        self.certs: dict[str, Path] = {}

    # --- processes ------------------------------------------------------------------------
    def _spawn(self, name: str, argv: list[str], env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
        logs = self.workdir / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env or self.env,
                                    cwd=cwd or self.workdir, start_new_session=True)
        self.processes[name] = proc
        return proc

    def log_of(self, name: str) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Stop one child and everything it started (its process group)."""
        proc = self.processes.get(name)
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """Stop every child: SuperNodes first, then the SuperLink (each with its process group),
        and wait until no process of those groups is left."""
        for name in sorted(self.processes, key=lambda n: n == "superlink"):
            self.kill(name, signal.SIGTERM)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            alive = [pgid for pgid in self.pids() if group_members(pgid)]
            if not alive:
                break
            for pgid in alive:  # whatever a group left behind (e.g. a ClientApp of a killed node)
                try:
                    os.killpg(pgid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        if self.socket_dir is not None:  # the fork server's socket folder
            shutil.rmtree(self.socket_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [p.pid for p in self.processes.values()]

    def __enter__(self) -> "LocalFederation":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # --- flwr CLI -------------------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 120.0, check: bool = True) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(BIN / "flwr"), *args], cwd=ROOT, env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"flwr {' '.join(args)} failed ({proc.returncode}): "
                               f"{' '.join((proc.stdout + proc.stderr).split())[-600:]}")
        return proc

    def _json(self, *args: str) -> dict:
        out = self.flwr(*args, "--format=json").stdout
        return json.loads(out[out.index("{"):])

    def online_nodes(self) -> list[dict]:
        """The SuperNodes the SuperLink lists as online."""
        nodes = self._json("supernode", "list", CONNECTION).get("nodes", [])
        return [n for n in nodes if str(n.get("status", "")).lower() == "online"]

    # --- bring-up -------------------------------------------------------------------------
    def start(self) -> None:
        self.certs = write_certificates(self.workdir / "certificates", self.host)
        socket_path = self._start_clientapp_command()
        self._spawn("superlink", [str(BIN / "flower-superlink"), "--ssl-ca-certfile", str(self.certs["ca"]),
                                  "--ssl-certfile", str(self.certs["cert"]), "--ssl-keyfile", str(self.certs["key"]),
                                  "--enable-supernode-auth", "--disable-runtime-dependency-installation",
                                  "--host", "127.0.0.1" if is_loopback(self.host) else "0.0.0.0", "--port", str(self.port)],
                    cwd=self.run_dir)
        self._write_connection()
        self._wait_for(lambda: self._listening(), "the SuperLink to listen on " + self.address, "superlink")
        for i in range(self.num_nodes):
            self.start_node(i)
        self._wait_for(lambda: len(self.online_nodes()) >= self.num_nodes,
                       f"{self.num_nodes} SuperNodes to be online", "superlink")
        if socket_path is not None:
            self._wait_for(lambda: self._serving(socket_path), "the ClientApp fork server", "clientapp-forkserver")

    def _start_clientapp_command(self) -> Path | None:
        """Write the SuperNodes' ``flwr-clientapp``; for ``fork``, also start its server (in its own
        process group, like every child) and return the socket it will listen on."""
        if self.clientapp == "lean":
            write_lean_clientapp(self.command_bin)
        if self.clientapp != "fork":
            return None
        socket_path = new_socket_path("fedunlearn-clientapp-")
        self.socket_dir = socket_path.parent
        write_forking_clientapp(self.command_bin, socket_path)
        self._spawn("clientapp-forkserver", server_argv(socket_path, self.preload))
        return socket_path

    def _serving(self, socket_path: Path) -> bool:
        if self.processes["clientapp-forkserver"].poll() is not None:
            raise RuntimeError(f"the ClientApp fork server exited: {self.log_of('clientapp-forkserver')[-1500:]}")
        return socket_path.exists()

    def _write_connection(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{self.address}"\n'
            f'root-certificates = "{self.certs["ca"]}"\n', encoding="utf-8")

    def _listening(self) -> bool:
        if self.processes["superlink"].poll() is not None:
            raise RuntimeError(f"flower-superlink exited: {self.log_of('superlink')[-1500:]}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def _wait_for(self, ready: Callable[[], bool], what: str, log: str) -> None:
        deadline = time.monotonic() + self.max_wait
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError(f"waited {self.max_wait:.0f}s for {what}; log: {self.log_of(log)[-1500:]}")
            time.sleep(0.5)

    def start_node(self, index: int, *, register: bool = True, name: str | None = None) -> subprocess.Popen:
        """Start SuperNode ``index`` with a fresh key, registered with the SuperLink unless
        ``register`` is false (then the SuperLink must refuse it)."""
        name = name or f"supernode-{index}"
        key = write_node_key(self.workdir / "keys" / name)
        if register:
            self.flwr("supernode", "register", str(key.with_suffix(".pub")), CONNECTION)
        node_home = self.workdir / name
        config = f"{self.node_config(index)} view-cache-dir=\"{node_home / 'views'}\""
        self.node_configs[name] = config
        return self._spawn(name, [str(BIN / "flower-supernode"), "--superlink", self.address,
                                  "--root-certificates", str(self.certs["ca"]),
                                  "--auth-supernode-private-key", str(key), "--node-config", config,
                                  "--port", str(free_port()), "--max-retries", "0"],
                           env={**self.env, "PATH": self.node_path, "FLWR_HOME": str(node_home / "flwr-home"),
                                "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": SUPEREXEC_POLL})

    # --- a run ----------------------------------------------------------------------------
    def prepare_nodes(self, run_config: str, timeout: float = 600.0) -> dict[str, str]:
        """``python -m client_app.prepare`` for every running SuperNode, all at once, with the run's
        config: each node's data is checked and its view stored in its view cache. Returns each
        node's last line. A node whose data fails here still takes part: its first reply carries
        the same one-line error, which the server reports by node and phase."""
        env = {**self.env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        started = {}
        for name, config in self.node_configs.items():
            if self.processes[name].poll() is None:
                argv = [sys.executable, "-m", "client_app.prepare", "--node-config", config]
                started[name] = self._spawn(f"prepare-{name}", argv + (["--run-config", run_config] if run_config else []),
                                            env=env)
        deadline = time.monotonic() + timeout
        lines = {}
        for name, proc in started.items():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.kill(f"prepare-{name}")
            tail = self.log_of(f"prepare-{name}").strip().splitlines()
            lines[name] = tail[-1] if tail else f"prepare exited with {proc.returncode}"
        return lines

    def run(self, run_config: str, *, on_line: Callable[[str], None] | None = None,
            timeout: float = 1800.0) -> RunResult:
        """The nodes prepared (unless ``prepare`` is off), then ``flwr run . <connection> --run-config ...
        --stream``, then the status polled until finished."""
        deadline = time.monotonic() + timeout
        if self.prepare:
            for name, line in self.prepare_nodes(run_config, timeout).items():
                if on_line:
                    on_line(f"{name}: {line}\n")
        argv = [str(BIN / "flwr"), "run", ".", CONNECTION, "--stream"] + (["--run-config", run_config] if run_config else [])
        lines, run_id, folder = [], None, None
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        self.processes["flwr-run"] = proc
        try:
            for line in proc.stdout:
                lines.append(line)
                run_id = run_id or _match_int(RUN_ID_LINE, line)
                folder = folder or _match_str(RESULTS_LINE, line)
                if on_line:
                    on_line(line)
                if time.monotonic() > deadline:
                    raise TimeoutError(f"run did not finish within {timeout:.0f}s")
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            self.kill("flwr-run", signal.SIGTERM)
        status = self.wait_finished(run_id, deadline) if run_id is not None else "not started"
        return RunResult(run_id, status, folder, "".join(lines))

    def wait_finished(self, run_id: int, deadline: float) -> str:
        """Poll ``flwr ls <connection> --run-id ID --format=json`` until the run is finished."""
        while True:
            runs = self._json("ls", CONNECTION, "--run-id", str(run_id)).get("runs", [])
            status = str(runs[0].get("status", "")) if runs else "unknown"
            if status.startswith("finished") or time.monotonic() > deadline:
                return status
            time.sleep(1.0)


class LocalSimulation:
    """``flwr run .`` on Flower's managed local SuperLink (Ray simulation), in its own ``FLWR_HOME`` and
    on free ports, so it runs whatever else is up; the SuperLink is stopped by its pid on exit.

    The SuperLink is started here, with the command line ``flwr run`` uses for its managed one
    (``flwr/cli/local_superlink.py``), and waited for up to ``startup_timeout`` seconds; ``flwr run``
    then finds it healthy and uses it. Flower's own start waits 15 s and then kills it, which a
    two-core CI machine busy with other tests exceeds (the run then fails before it starts).
    ``env`` adds to the environment of the SuperLink and of ``flwr`` (e.g. ``RAY_ADDRESS``, so the
    simulation joins a running Ray cluster: ``ray_cluster.RayCluster``).
    """

    def __init__(self, flwr_home: Path, startup_timeout: float = 120.0, env: dict[str, str] | None = None):
        self.home = Path(flwr_home)
        self.startup_timeout = startup_timeout
        self.port = free_port()
        self.env = with_flower_on_path({**os.environ, **(env or {}), "FLWR_HOME": str(self.home),
                                        "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
                                        "FLWR_LOCAL_SUPERLINK_HTTP_API_PORT": str(self.port),
                                        "FLWR_LOCAL_CONTROL_API_PORT": str(free_port())})
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LocalSimulation":
        runtime = self.home / "local-superlink"
        runtime.mkdir(parents=True, exist_ok=True)
        argv = [str(BIN / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
                "--control-api-address", f"127.0.0.1:{self.env['FLWR_LOCAL_CONTROL_API_PORT']}",
                "--host", "127.0.0.1", "--port", str(self.port), "--log-file", str(runtime / "superlink.log"),
                "--database", str(runtime / "state.db")]
        self.process = subprocess.Popen(argv, env={**self.env, "FLWR_DISABLE_UPDATE_CHECK": "1"},
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_healthy(runtime / "superlink.log")
        except BaseException:
            self.__exit__()
            raise
        return self

    def _wait_healthy(self, log: Path) -> None:
        import urllib.request

        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the local flower-superlink exited with {self.process.returncode}; "
                                   f"log: {log.read_text(errors='replace')[-1500:] if log.exists() else ''}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"the local flower-superlink was not healthy within {self.startup_timeout:.0f}s")

    def flwr(self, *args: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        """``flwr ARGS`` from the app's folder against this SuperLink (raises TimeoutExpired)."""
        return subprocess.run([str(BIN / "flwr"), *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout)

    def __exit__(self, *exc) -> None:
        """Stop (and reap) the SuperLink started here, then any other of this home's (one ``flwr run``
        may have started itself). Ours is stopped as our child: ``stop_local_superlink`` would
        wait on it as an unreaped zombie until its SIGKILL deadline."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        stop_local_superlink(self.home)


def local_superlink_pids(flwr_home: Path) -> list[int]:
    """Process ids of the managed local SuperLink that ``flwr run`` started for ``flwr_home``:
    the ``flower-superlink`` whose log file lies in ``<flwr_home>/local-superlink`` (Flower starts
    it detached and writes no pid file; its command line names that log file)."""
    marker = str(Path(flwr_home).expanduser().resolve() / "local-superlink") + os.sep
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode(errors="replace") for w in argv]
        if any(w.endswith("flower-superlink") for w in words[:2]) and any(w.startswith(marker) for w in words):
            pids.append(int(entry.name))
    return pids


def stop_local_superlink(flwr_home: Path) -> list[int]:
    """Stop (SIGTERM, then SIGKILL after 10 s) the local SuperLink of ``flwr_home``; its pids."""
    pids = local_superlink_pids(flwr_home)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
            time.sleep(0.2)
    return pids


def _match_int(pattern: re.Pattern, line: str) -> int | None:
    match = pattern.search(line)
    return int(match.group(1)) if match else None


def _match_str(pattern: re.Pattern, line: str) -> str | None:
    match = pattern.search(line)
    return match.group(1) if match else None


def _raise_on_signal(signum, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=3, help="number of SuperNodes")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the SuperNodes connect to (default 127.0.0.1); any other makes the SuperLink "
                             "listen on all interfaces, as on a server (e.g. this machine's own network address)")
    parser.add_argument("--run-config", default="", help="overrides, as for flwr run --run-config")
    parser.add_argument("--data-root", type=Path,
                        help="node i reads its own data from DATA_ROOT/i (data-path; vision: train.npz/test.npz or "
                             "image folders, tasks/node_data.py; llm-tofu: TOFU-format full.json ..., "
                             "tasks/llm/node_data.py)")
    parser.add_argument("--workdir", type=Path, help="keep certificates, keys and logs here (default: a temporary folder, removed)")
    parser.add_argument("--no-prepare", action="store_true",
                        help="do not run client_app.prepare for each node before the run (its first message then "
                             "builds the node's view)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the run may take")
    parser.add_argument("--clientapp", choices=CLIENTAPPS, default="fork",
                        help="how SuperNodes start each message's ClientApp: forked from a server that imported torch "
                             "and Flower once (fork, default), a lean launcher of Flower's command (lean), or Flower's "
                             "own flwr-clientapp (flower); scripts/clientapp_commands.py")
    parser.add_argument("--preload", default=DEFAULT_PRELOAD,
                        help=f"modules the fork server imports once (default {DEFAULT_PRELOAD}; the LLM task: add "
                             f",transformers,peft)")
    parser.add_argument("--stop-local-superlink", action="store_true",
                        help="only stop the local SuperLink that `flwr run` started for FLWR_HOME (default ~/.flwr)")
    args = parser.parse_args()
    if args.stop_local_superlink:
        home = Path(os.environ.get("FLWR_HOME", "~/.flwr"))
        print(f"stopped local SuperLink pids {stop_local_superlink(home)} of {home}")
        return 0
    try:
        socket.getaddrinfo(args.host, None)
    except (socket.gaierror, UnicodeError):
        parser.error(f"--host={args.host}: not an IP address or a name this machine resolves")
    if args.data_root is not None and not args.data_root.is_dir():
        parser.error(f"--data-root={args.data_root}: not a folder")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="fedunlearn-federation-"))
    node_config = None
    if args.data_root is not None:
        root = args.data_root.resolve()
        node_config = lambda i: f'data-path="{root / str(i)}" partition-id={i}'  # noqa: E731
    try:
        federation = LocalFederation(workdir, args.nodes, node_config, prepare=not args.no_prepare,
                                     host=args.host, clientapp=args.clientapp, preload=args.preload)
    except ValueError as error:  # a setting refused before anything starts
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
        parser.error(str(error))
    signal.signal(signal.SIGTERM, _raise_on_signal)
    try:
        with federation:
            print(f"SuperLink {federation.address} with {args.nodes} SuperNodes (TLS, node auth); "
                  f"processes {federation.pids()}; logs in {workdir / 'logs'}", flush=True)
            result = federation.run(args.run_config, on_line=lambda line: print(line, end="", flush=True),
                                    timeout=args.timeout)
        print(f"run {result.run_id}: {result.status}; results folder: {result.folder}")
        return 0 if result.status == "finished:completed" and result.folder else 1
    except KeyboardInterrupt:
        print("stopped: every process this launcher started was terminated", file=sys.stderr)
        return 130
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
