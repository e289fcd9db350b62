"""Where the launcher finds Flower's commands, and the PATH it hands the processes it starts
(``scripts/launch_federation.py``): next to the interpreter (a virtual environment), else where
``flwr`` is on PATH (packages installed with ``pip --target``)."""

import os
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import launch_federation  # noqa: E402


def _command(folder: Path, name: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_commands_next_to_the_interpreter_come_first(tmp_path, monkeypatch):
    venv, other = tmp_path / "venv" / "bin", tmp_path / "other"
    _command(venv, "flwr")
    _command(other, "flwr")
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", str(other))
    assert launch_federation.flower_bin() == venv


def test_commands_on_path_when_none_is_next_to_the_interpreter(tmp_path, monkeypatch):
    interpreter, target = tmp_path / "usr" / "bin", tmp_path / "site" / "bin"
    interpreter.mkdir(parents=True)
    _command(target, "flwr")
    monkeypatch.setattr(sys, "executable", str(interpreter / "python3"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path / "empty"), str(target)]))
    assert launch_federation.flower_bin() == target


def test_started_processes_find_flowers_commands_first_on_path():
    env = launch_federation.with_flower_on_path({"PATH": "/usr/bin:/bin", "HOME": "/h"})
    assert env["PATH"].split(os.pathsep) == [str(launch_federation.BIN), "/usr/bin", "/bin"]
    assert env["HOME"] == "/h"
    assert launch_federation.with_flower_on_path({})["PATH"] == str(launch_federation.BIN)
