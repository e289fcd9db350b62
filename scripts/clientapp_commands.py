"""The ``flwr-clientapp`` commands fedunlearn's SuperNodes start: a lean one, and a warm one backed
by a fork server.

Flower 1.42's SuperNode starts ``flwr-clientapp --runtime-api-address ... --token ...`` (found on
its PATH) as a new process for every message it receives. That process spends most of its CPU
importing torch and Flower before the app's handler runs (``benchmarks/bench_cold_start.py``); on
a node that answers a request in a handful of short rounds, the imports are most of each round.

- **lean** (``write_lean_clientapp``): Flower's own command function loaded without its package
  ``flwr.supernode.cli``, whose ``__init__`` also imports the SuperNode's CLI (SQLAlchemy, Alembic),
  which a ClientApp process never uses. Still a fresh interpreter per message.
- **fork** (``write_forking_clientapp`` + ``serve``): ``python scripts/clientapp_commands.py serve --socket
  PATH`` imports the modules of ``--preload`` and Flower's command function once, then listens on a
  Unix socket. The ``flwr-clientapp`` that ``write_forking_clientapp`` writes connects, sends its arguments,
  environment, working folder and its standard input, output and error (as file descriptors), and
  waits. The server forks; the child takes those over and runs Flower's own command function with
  the same arguments, so the ClientApp still talks to its SuperNode through Flower's Runtime API,
  one process per message, and exits. The command exits with the child's status, passes
  SIGTERM/SIGINT/SIGHUP on to it, and the child ends when the command dies (as a ClientApp in the
  SuperNode's process group does when the group is killed). Where no server answers (not started,
  or stopped), the command runs its fallback, the lean launcher: a node never depends on the
  server being up.

What a child shares with the server is what the preloaded modules did at import time (read their
environment then, e.g. ``OMP_NUM_THREADS``): nothing runs in the server but imports, so no thread
pool or random state of torch is started there; each child reseeds torch's and numpy's global
generators as a new process would (Python's ``random`` reseeds itself after a fork), and the app
seeds everything it uses from the run's seed. The app's own modules are not preloaded: each run's
FAB is loaded fresh, as before.

Choices: a Unix ``SOCK_SEQPACKET`` socket in a folder only its owner can enter (one request is one
message, file descriptors passed with ``socket.send_fds``; a socket path has at most 107 bytes, so
keep it short), the socket file created by ``bind`` on a temporary name and renamed into place
(a command never connects to a half-started server), and ``SIGCHLD`` ignored in the server so its
children are reaped by the kernel (the command, not the server, reports each child's status).
"""

from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from pathlib import Path
from typing import Callable

# Flower's flwr-clientapp module loaded alone, as ``command``: the package flwr.supernode.cli is not
# imported, so neither is its __init__'s SuperNode CLI (SQLAlchemy, Alembic), which a ClientApp
# process never uses; where the file is missing (another Flower layout), the module as installed.
LEAN_LOADER = """import importlib.util
import os

import flwr.supernode

path = os.path.join(os.path.dirname(flwr.supernode.__file__), "cli", "flwr_clientapp.py")
if os.path.exists(path):
    spec = importlib.util.spec_from_file_location("flwr_clientapp_command", path)
    command = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(command)
else:
    from flwr.supernode.cli import flwr_clientapp as command
"""

# the launcher's body (``write_lean_clientapp`` adds the interpreter line)
LEAN_CLIENTAPP = ('''"""Flower's `flwr-clientapp` command: the same function (flwr.supernode.cli.flwr_clientapp), loaded
without its package flwr.supernode.cli, whose __init__ also imports the SuperNode's own CLI
(SQLAlchemy, Alembic), which a ClientApp process never uses. Written by fedunlearn's
scripts/clientapp_commands.py; where that file is missing it runs Flower's command as installed."""
import sys

''' + LEAN_LOADER + "sys.exit(command.flwr_clientapp())\n")


def _write_command(folder: Path, text: str) -> Path:
    """``folder/flwr-clientapp`` holding ``text``, executable, written atomically."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "flwr-clientapp"
    partial = folder / ".flwr-clientapp.partial"
    partial.write_text(text, encoding="utf-8")
    partial.chmod(0o755)
    os.replace(partial, path)
    return path


def write_lean_clientapp(folder: Path) -> Path:
    """Write ``folder/flwr-clientapp``, the lean launcher of :data:`LEAN_CLIENTAPP` for this
    interpreter, and return its path. A SuperNode whose PATH starts with ``folder`` starts every
    ClientApp through it: the same Flower function with the same arguments and less to import per
    message (``benchmarks/bench_cold_start.py`` measures how much)."""
    return _write_command(Path(folder), f"#!{sys.executable}\n{LEAN_CLIENTAPP}")


# the modules a vision ClientApp imports (sklearn.cluster: FedUP's centroid query); an LLM node adds
# e.g. transformers,peft
DEFAULT_PRELOAD = "torch,numpy,sklearn.cluster,flwr.app,flwr.clientapp"
REQUEST_BYTES = 1 << 20  # a request is argv + environment + folder; far below this

CLIENT = '''"""`flwr-clientapp` through fedunlearn's ClientApp fork server (scripts/clientapp_commands.py):
the server forks a child that runs Flower's flwr-clientapp function with these arguments, this
environment, folder and standard streams; this process waits, passes signals on, and exits with the
child's status. Without a server it runs the fallback launcher."""
import json, os, signal, socket, sys

SOCKET = {socket!r}
FALLBACK = {fallback!r}
child, pending = None, []


def forward(signum, frame):  # a signal before the child is known waits for it
    if child is None:
        pending.append(signum)
    else:
        os.kill(child, signum)


def fallback():
    if pending:  # stopped before anything ran
        os._exit(128 + pending[0])
    os.execv(sys.executable, [sys.executable, FALLBACK, *sys.argv[1:]])


for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(sig, forward)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    sock.connect(SOCKET)
except OSError:
    fallback()
request = {{"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}}
socket.send_fds(sock, [json.dumps(request).encode()], [0, 1, 2])
started = sock.recv(64)
if not started:  # the server closed without forking: nothing ran yet
    fallback()
child = int(started.split()[1])
for signum in pending:
    os.kill(child, signum)
ended = sock.recv(64)
if not ended:
    sys.stderr.write(f"flwr-clientapp: ClientApp process {{child}} ended without an exit status\\n")
    sys.exit(1)
sys.exit(int(ended.split()[1]))
'''


def write_forking_clientapp(folder: Path, socket_path: Path) -> Path:
    """Write ``folder/flwr-clientapp``, the command of :data:`CLIENT` for the server at
    ``socket_path``, with the lean launcher as its fallback in ``folder/lean``; return its path.
    It runs with ``-IS`` (no site-packages, no PYTHON* variables): it needs only the standard
    library, so it starts in tens of milliseconds."""
    fallback = write_lean_clientapp(Path(folder) / "lean")
    text = CLIENT.format(socket=str(Path(socket_path).resolve()), fallback=str(fallback.resolve()))
    return _write_command(Path(folder), f"#!{sys.executable} -IS\n{text}")


def flower_command() -> Callable[[], object]:
    """Flower's ``flwr-clientapp`` function, loaded as the lean command loads it."""
    namespace: dict = {}
    exec(LEAN_LOADER, namespace)  # noqa: S102 (our own constant: the module file loaded alone)
    return namespace["command"].flwr_clientapp


def load_target(spec: str) -> Callable[[], object]:
    """``module:function`` imported now, or Flower's command for the empty string."""
    if not spec:
        return flower_command()
    module, _, name = spec.partition(":")
    if not name:
        raise SystemExit(f"--target={spec!r}: expected module:function")
    return getattr(importlib.import_module(module), name)


def bind(socket_path: Path) -> socket.socket:
    """A listening socket at ``socket_path``, which appears only once it accepts connections."""
    socket_path = Path(socket_path)
    partial = socket_path.with_name(f".{socket_path.name}.{os.getpid()}")
    partial.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(str(partial))
    listener.listen(64)
    os.replace(partial, socket_path)
    return listener


def exit_status(code: object) -> int:
    """What ``sys.exit(code)`` makes a process's status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def reseed_globals() -> None:
    """What a new process starts with: torch's and numpy's global generators seeded afresh."""
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def die_with(conn: socket.socket) -> None:
    """End this process when the command that asked for it is gone (its end of ``conn`` closes)."""
    def watch() -> None:
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="clientapp-command-watch").start()


def child(listener: socket.socket, conn: socket.socket, request: dict, fds: list[int],
          target: Callable[[], object]) -> None:
    """The forked process: take over the command's streams, environment and folder, run ``target``
    with its arguments, tell the command the status, exit. Never returns."""
    code = 1
    try:
        listener.close()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # subprocess.wait in the ClientApp needs it back
        atexit._clear()  # the server's exit handlers are the server's
        weakref.finalize._registered_with_atexit = False  # this process's finalizers register anew
        for number, fd in enumerate(fds):
            os.dup2(fd, number)
            os.close(fd)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = list(request["argv"])
        reseed_globals()
        conn.sendall(f"pid {os.getpid()}".encode())
        die_with(conn)
        try:
            code = exit_status(target())
        except SystemExit as stop:
            code = exit_status(stop.code)
        except BaseException:  # noqa: BLE001 (a process's uncaught error: printed, status 1)
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 (a closed stream at exit)
                pass
        try:
            conn.sendall(f"exit {code}".encode())
        except OSError:
            pass
        os._exit(code)


def new_socket_path(prefix: str) -> Path:
    """A socket path in a new folder only its owner can enter, under the system's temporary folder
    (short: a socket path has at most 107 bytes). Removing the folder is the caller's."""
    return Path(tempfile.mkdtemp(prefix=prefix)) / "forkserver.sock"


def server_argv(socket_path: Path, preload: str = DEFAULT_PRELOAD, target: str = "") -> list[str]:
    """The command line that runs :func:`serve` on ``socket_path`` with this interpreter."""
    return ([sys.executable, str(Path(__file__).resolve()), "serve", "--socket", str(socket_path),
             "--preload", preload] + (["--target", target] if target else []))


def wait_until_serving(server: subprocess.Popen, socket_path: Path, timeout: float) -> None:
    """Return once ``server`` listens on ``socket_path``; raise if it exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    while not Path(socket_path).exists():
        if server.poll() is not None:
            raise RuntimeError(f"the ClientApp fork server exited with status {server.returncode}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the ClientApp fork server did not listen on {socket_path} within {timeout:.0f}s")
        time.sleep(0.1)


def serve(socket_path: Path, preload: list[str], target_spec: str = "") -> None:
    """Import ``preload`` and the target, then fork a child per request on ``socket_path``, forever."""
    for name in preload:
        importlib.import_module(name)
    target = load_target(target_spec)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    listener = bind(socket_path)
    print(f"clientapp fork server {os.getpid()} on {socket_path}; preloaded {','.join(preload) or 'nothing'}",
          flush=True)
    while True:
        conn, _ = listener.accept()
        fds: list[int] = []
        try:
            message, fds, _, _ = socket.recv_fds(conn, REQUEST_BYTES, 3)
            request = json.loads(message)
            if len(fds) != 3:
                raise ValueError(f"expected 3 file descriptors (stdin, stdout, stderr), got {len(fds)}")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                child(listener, conn, request, fds, target)
            print(f"forked {pid} for a ClientApp", flush=True)
        except Exception:  # noqa: BLE001 (one bad request must not stop the server)
            traceback.print_exc()
        finally:
            for fd in fds:
                os.close(fd)
            conn.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    writer = commands.add_parser("write", help="write a flwr-clientapp command into DIR (put DIR first on a "
                                               "SuperNode's PATH)")
    writer.add_argument("folder", type=Path, metavar="DIR")
    writer.add_argument("--socket", type=Path,
                        help="the fork server's socket: write the forking command (lean fallback in DIR/lean); "
                             "without it, the lean launcher alone")
    server = commands.add_parser("serve", help="run the fork server (until stopped)")
    server.add_argument("--socket", type=Path, required=True, help="the Unix socket's path")
    server.add_argument("--preload", default=DEFAULT_PRELOAD,
                        help=f"comma-separated modules imported once (default: {DEFAULT_PRELOAD})")
    server.add_argument("--target", default="",
                        help="module:function each child runs (default: Flower's flwr-clientapp function)")
    args = parser.parse_args()
    if args.command == "write":
        path = write_forking_clientapp(args.folder, args.socket) if args.socket else write_lean_clientapp(args.folder)
        print(f"wrote {path}")
        return 0
    if not args.socket.parent.is_dir():
        parser.error(f"--socket={args.socket}: its folder does not exist")
    serve(args.socket, [name for name in args.preload.split(",") if name], args.target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
