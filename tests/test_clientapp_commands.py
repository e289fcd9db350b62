"""The forking ``flwr-clientapp`` (``scripts/clientapp_commands.py``): a child forked per request
runs with the command's arguments, environment, folder and streams, and the command reports its
status, passes signals on, dies with it, and falls back to the lean launcher without a server.

The server here runs a small probe function (``--target``) instead of Flower's command, so each
behaviour is seen directly; the deployment tests run Flower's command through it end to end."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from clientapp_commands import new_socket_path, server_argv, wait_until_serving, write_forking_clientapp  # noqa: E402

PROBE = textwrap.dedent('''
    import os, signal, sys, time

    import probe_preload


    def main():
        mode = sys.argv[1]
        if mode == "echo":
            print("args", sys.argv[2:], "env", os.environ.get("PROBE"), "cwd", os.getcwd(), "pid", os.getpid())
            print("to stderr", file=sys.stderr)
            print("preloaded", len(open(probe_preload.IMPORTS).read().split()))
            return 3
        if mode == "wait":
            def on_term(signum, frame):
                open(sys.argv[2], "w").write("term")
                sys.exit(5)
            signal.signal(signal.SIGTERM, on_term)
            print("ready", os.getpid(), flush=True)
            time.sleep(120)
        raise SystemExit(f"unknown mode {mode}")
''')

PRELOAD = textwrap.dedent('''
    import os

    IMPORTS = os.path.join(os.path.dirname(__file__), "imports.txt")
    with open(IMPORTS, "a") as log:
        log.write(f"{os.getpid()}\\n")
''')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().split()[2] if Path(f"/proc/{pid}/stat").exists() else "X"
    return state != "Z"


@pytest.fixture()
def server(tmp_path):
    """A fork server that preloads ``probe_preload`` and forks ``probe:main``; yields (command, server pid)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    (code / "probe_preload.py").write_text(PRELOAD)
    socket_path = new_socket_path("fu-test-")
    proc = subprocess.Popen(server_argv(socket_path, "probe_preload", "probe:main"),
                            env={**os.environ, "PYTHONPATH": str(code)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        wait_until_serving(proc, socket_path, 60)
        yield write_forking_clientapp(tmp_path / "bin", socket_path), proc.pid, socket_path
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        for leftover in socket_path.parent.iterdir():
            leftover.unlink()
        socket_path.parent.rmdir()


def test_a_forked_child_gets_the_commands_arguments_environment_folder_streams_and_status(server, tmp_path):
    command, server_pid, _ = server
    folder = tmp_path / "elsewhere"
    folder.mkdir()
    done = subprocess.run([str(command), "echo", "--token", "abc"], cwd=folder, capture_output=True, text=True,
                          env={**os.environ, "PROBE": "from the command"}, timeout=60)
    assert done.returncode == 3, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"args ['--token', 'abc'] env from the command cwd {folder} pid ")
    child = int(first.split()[-1])
    assert child not in (server_pid, os.getpid())
    assert done.stderr.strip() == "to stderr"
    # the module preloaded in the server is not imported again by the child: one import, the server's
    assert done.stdout.splitlines()[1] == "preloaded 1"
    again = subprocess.run([str(command), "echo"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 3 and again.stdout.splitlines()[1] == "preloaded 1"
    assert int(again.stdout.split()[again.stdout.split().index("pid") + 1]) != child


def test_the_command_passes_sigterm_on_and_the_child_dies_with_the_command(server, tmp_path):
    command, _, _ = server
    marker = tmp_path / "terminated"
    proc = subprocess.Popen([str(command), "wait", str(marker)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline().split()[1])
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 5
    assert marker.read_text() == "term"
    proc.stdout.close()

    proc = subprocess.Popen([str(command), "wait", str(marker)], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline().split()[1])
    assert _alive(child)
    proc.kill()  # as when the SuperNode's process group is killed
    proc.wait(timeout=30)
    proc.stdout.close()
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_a_malformed_request_leaves_the_server_serving(server):
    command, server_pid, socket_path = server
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as raw:
        raw.connect(str(socket_path))
        raw.sendall(b"not json and no streams")
        assert raw.recv(64) == b""  # closed without forking anything
    assert _alive(server_pid)
    assert subprocess.run([str(command), "echo"], capture_output=True, text=True, timeout=60).returncode == 3


def test_without_a_server_the_command_runs_the_lean_launcher(tmp_path):
    command = write_forking_clientapp(tmp_path / "bin", tmp_path / "nobody-listens.sock")
    assert (tmp_path / "bin" / "lean" / "flwr-clientapp").exists()
    shown = subprocess.run([str(command), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--runtime-api-address" in shown.stdout
