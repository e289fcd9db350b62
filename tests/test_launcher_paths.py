"""Where the launcher finds Flower's commands, and the PATH it hands the processes it starts
(``scripts/launch_federation.py``): next to the interpreter (a virtual environment), else where
``flwr`` is on PATH (packages installed with ``pip --target``)."""

import os
import stat
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import clientapp_commands  # noqa: E402
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


def test_the_lean_clientapp_runs_flowers_command_without_the_supernode_cli(tmp_path):
    """The written launcher parses Flower's own arguments (the same function) and loads no module
    of the SuperNode's CLI (SQLAlchemy, Alembic), which Flower's command imports with its package."""
    import subprocess

    path = clientapp_commands.write_lean_clientapp(tmp_path / "bin")
    assert path.name == "flwr-clientapp" and os.access(path, os.X_OK)
    assert path.read_text().startswith(f"#!{sys.executable}\n")
    shown = subprocess.run([str(path), "--help"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and "--runtime-api-address" in shown.stdout and "--token" in shown.stdout
    probe = ("import runpy, sys\nsys.argv = ['flwr-clientapp', '--help']\n"
             "try:\n    runpy.run_path(sys.argv_path, run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "print(sorted({m.split('.')[0] for m in sys.modules} & {'sqlalchemy', 'alembic'}), "
             "'flwr.supernode.cli' in sys.modules)")
    loaded = subprocess.run([sys.executable, "-c", probe.replace("sys.argv_path", repr(str(path)))],
                            capture_output=True, text=True, timeout=120)
    assert loaded.stdout.strip().splitlines()[-1] == "[] False"
    # Flower's own command, for contrast, does load them
    full = subprocess.run([sys.executable, "-c", "import sys, flwr.supernode.cli.flwr_clientapp; "
                           "print('sqlalchemy' in sys.modules)"], capture_output=True, text=True, timeout=120)
    assert full.stdout.strip() == "True"


def test_supernodes_get_fedunlearns_clientapp_first_on_path(tmp_path):
    for clientapp in ("fork", "lean"):
        federation = launch_federation.LocalFederation(tmp_path / clientapp, 2, clientapp=clientapp)
        assert federation.node_path.split(os.pathsep)[:2] == [str(tmp_path / clientapp / "bin"),
                                                               str(launch_federation.BIN)]
    flower = launch_federation.LocalFederation(tmp_path / "flower", 2, clientapp="flower")
    assert flower.node_path.split(os.pathsep)[0] == str(launch_federation.BIN)


def test_an_unknown_clientapp_or_preload_is_refused_before_anything_starts(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="--clientapp='warm': expected one of fork, lean, flower"):
        launch_federation.LocalFederation(tmp_path, 2, clientapp="warm")
    with pytest.raises(ValueError, match="--preload='torch,no_such_module_here': no module no_such_module_here"):
        launch_federation.LocalFederation(tmp_path, 2, preload="torch,no_such_module_here")
    assert not (tmp_path / "bin").exists()
