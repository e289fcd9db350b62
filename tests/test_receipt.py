"""receipt.json: one entry per request, every file with its sha256, and ``verify`` that recomputes them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from core.files import sha256_of
from server_app.receipt import build_receipt, main, verify
from tasks.forget_ids import ids_sha256, ids_text


def open_text(folder: str, name: str) -> str:
    with open(os.path.join(folder, name), encoding="utf-8") as handle:
        return handle.read()


def _flip_one_byte(path: str) -> None:
    with open(path, "r+b") as handle:
        handle.seek(os.path.getsize(path) // 2)
        byte = handle.read(1)
        handle.seek(-1, os.SEEK_CUR)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    from server_app.inprocess import run_inprocess

    tmp = tmp_path_factory.mktemp("receipt")
    return run_inprocess({"scenario": "class", "smoke": True, "cache-dir": str(tmp / "c"),
                          "outputs-dir": str(tmp / "o")}, 3)


def test_a_default_run_writes_a_receipt_that_verifies(default_run, capsys):
    receipt, results = (json.loads(open_text(default_run, name)) for name in ("receipt.json", "results.json"))
    (entry,) = receipt["requests"]
    assert entry["request"]["scenario"] == "class"
    assert entry["request"]["target"] == results["run"]["config"]["forget-class"]
    clients = entry["request"]["clients"]
    assert [c["client_id"] for c in clients] == list(range(3))
    assert sum(c["removed"] for c in clients) > 0 and all(len(c["forget_ids_sha256"]) == 64 for c in clients)
    assert entry["models"]["after"] == {"path": "models/unlearned.safetensors",
                                        "sha256": results["model_files"]["unlearned"]["sha256"]}
    assert entry["method"]["name"] == results["run"]["method"] and entry["method"]["settings"]["seed"] == 42
    assert receipt["results"]["sha256"] == sha256_of(os.path.join(default_run, "results.json"))
    assert main(["verify", default_run]) == 0
    assert "all" in capsys.readouterr().out


def test_one_changed_byte_of_the_unlearned_model_fails_verify_naming_it(default_run, tmp_path):
    import shutil

    folder = str(tmp_path / "copy")
    shutil.copytree(default_run, folder)
    _flip_one_byte(os.path.join(folder, "models", "unlearned.safetensors"))
    done = subprocess.run([sys.executable, "-m", "server_app.receipt", "verify", folder],
                          check=False, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("models/unlearned.safetensors: sha256")


def test_a_missing_file_and_a_folder_without_receipt(default_run, tmp_path):
    import shutil

    folder = str(tmp_path / "copy")
    shutil.copytree(default_run, folder)
    os.remove(os.path.join(folder, "models", "continued.safetensors"))
    assert verify(folder) == (1, "models/continued.safetensors: missing")
    code, line = verify(str(tmp_path))
    assert code == 2 and "no readable receipt.json" in line and "\n" not in line


def test_a_receipt_has_one_entry_per_request_of_a_stream(tmp_path):
    """Results with a ``requests`` list: one entry each, its own files and evidence; the undo of a
    plug-in names the plug-in file."""
    (tmp_path / "models").mkdir()
    files = {}
    for name in ("original", "u1", "u2", "flt1"):
        path = tmp_path / "models" / f"{name}.safetensors"
        path.write_bytes(name.encode())
        files[name] = {"path": f"models/{name}.safetensors", "sha256": sha256_of(str(path))}
    requests = [{"request": {"scenario": "class", "target": t}, "method": {}, "models": {"unlearned": {"forget_acc": 0.0}},
                 "resurfacing": {"kr_retrain": None}, "cost": {"unlearn": {"seconds": 1.0, "bytes_up": 2, "bytes_down": 3}},
                 "validity": {"missing": [{"figure": "kr_retrain", "reason": "oracle off"}]},
                 "model_files": {"before": files[before], "unlearned": files[after], **plug}}
                for t, before, after, plug in ((3, "original", "u1", {"flt1": files["flt1"]}), (5, "u1", "u2", {}))]
    receipt = build_receipt({"run": {"method": "m", "config": {"seed": 1}}, "requests": requests,
                             "model_files": {"original": files["original"]}}, str(tmp_path))
    first, second = receipt["requests"]
    assert [first["request"]["target"], second["request"]["target"]] == [3, 5]
    assert second["models"]["before"] == files["u1"] and second["models"]["after"] == files["u2"]
    assert first["undo"]["drop_plugins"] == ["models/flt1.safetensors"] and second["undo"] is None
    assert first["cost"]["unlearn"] == {"seconds": 1.0, "bytes": 5}
    assert first["evidence"]["missing"][0]["figure"] == "kr_retrain"
    (tmp_path / "receipt.json").write_text(json.dumps(receipt))
    assert verify(str(tmp_path))[0] == 0
    _flip_one_byte(str(tmp_path / "models" / "u2.safetensors"))
    assert verify(str(tmp_path))[1].startswith("models/u2.safetensors:")


def test_the_forget_set_hash_is_made_of_the_pool_indices_of_the_removed_samples():
    """A class request on the shared pool: the ids the node hashes are exactly the pool indices of its
    training samples of that class; the hash is of their sorted decimal text."""
    from client_app.state import client_view_of
    from tasks.partition import dirichlet_partitions, train_test_split
    from tasks.registry import task_for

    run = {"scenario": "class", "forget-class": 2, "smoke": True}
    cfg, data = client_view_of(run, {"partition-id": 1, "num-partitions": 3})
    labels = task_for(cfg["task"]).load_images().y.numpy()
    parts = dirichlet_partitions(labels, 3, cfg["dirichlet-alpha"], cfg["seed"])
    train_idx, _ = train_test_split(parts[1], cfg["test-fraction"], cfg["seed"] + 1)
    expected = sorted(int(i) for i in train_idx if labels[i] == 2)
    assert sorted(data.removed_ids.tolist()) == expected and len(expected) == len(data.forget_y)
    assert ids_text([5, 1, 30]) == "1,5,30" and ids_sha256(np.array(expected)) == ids_sha256(expected[::-1])
