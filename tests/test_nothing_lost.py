"""Nothing lost, nothing forged: the cache knows its data and health, parallel runs keep every
result, data files cannot run code or train silently on a mismatch, bad settings and unwritable
folders stop a run before any work, lost nodes are named, and a stopped run is a failed run."""

from __future__ import annotations

import csv
import json
import logging
import math
import multiprocessing
import os
import pickle
import shutil
import struct
import sys
import threading
from pathlib import Path
from queue import Queue

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from core.config import ConfigError
from server_app import report
from server_app.experiment import Experiment
from server_app.inprocess import NODE_OFFSET, InProcessGrid
from strategies.common.federation import Federation, RoundFailed
from strategies.run_config import parse_config
from tasks.vision import load_images

ROOT = Path(__file__).resolve().parents[1]
TINY = {"pretrain-rounds": 2, "continue-rounds": 1, "local-epochs": 1, "mia-max-samples": 30,
        "diagnostic-samples": 0, "method": "none"}


def _config(tmp_path: Path, **overrides) -> dict:
    return {**TINY, "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out"), **overrides}


class _TimeoutGrid(InProcessGrid):
    """Drops the ``train`` replies of ``silent_nodes`` (client ids), as Flower's grid drops a reply
    that arrives after the round timeout; records which nodes each exchange asked."""

    def __init__(self, num_clients: int, run_config: dict, silent_nodes=(), **options):
        super().__init__(num_clients, run_config, **options)
        self.silent = {NODE_OFFSET + c for c in silent_nodes}
        self.asked: list[list[int]] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.asked.append(sorted(m.metadata.dst_node_id for m in messages))
        replies = super().send_and_receive(messages, timeout=timeout)
        return [r for r in replies if not (r.metadata.src_node_id in self.silent
                                           and r.metadata.message_type == "train")]


def _experiment(config: dict, num_clients: int = 4, **grid_options) -> tuple[Experiment, InProcessGrid]:
    grid = _TimeoutGrid(num_clients, config, **grid_options)
    return Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config), grid


def _run(config: dict, num_clients: int = 4, **grid_options) -> dict:
    experiment, _ = _experiment(config, num_clients, **grid_options)
    folder = experiment.run()
    return json.loads((Path(folder) / "results.json").read_text())


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX (LeCun's MNIST format): 0, 0, type 0x08 (ubyte), ndim; big-endian int32 dims; raw bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def _write_mnist(root: Path, seed: int, n_images: int = 240, n_labels: int | None = None) -> None:
    rng = np.random.default_rng(seed)
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    _write_idx(raw / "train-images-idx3-ubyte", rng.integers(0, 256, size=(n_images, 28, 28)))
    _write_idx(raw / "train-labels-idx1-ubyte", rng.integers(0, 10, size=n_labels or n_images))
    _write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 256, size=(3, 28, 28)))
    _write_idx(raw / "t10k-labels-idx1-ubyte", rng.integers(0, 10, size=3))


# ------------------------------------------------------------------ parallel-safe outputs


def _append_rows(outputs_dir: str, writer: int, rows: int, start) -> None:
    results = {"run": {"task": "digits-lenet5", "method": "none", "scenario": "sample", "seed": writer,
                       "num_clients": 4},
               "models": {"original": {"test_acc": 0.5, "forget_acc": 0.5}}, "resurfacing": {},
               "cost": {"unlearn": {"seconds": 0.0, "bytes_up": 0, "bytes_down": 0}}}
    start.wait()  # all writers begin together, as the runs of a sweep do
    for row in range(rows):
        report.append_csv(outputs_dir, results, f"writer{writer}-row{row}")


def test_parallel_csv_writers_keep_every_row(tmp_path):
    context = multiprocessing.get_context("fork")
    start = context.Barrier(8)
    writers = [context.Process(target=_append_rows, args=(str(tmp_path), w, 20, start)) for w in range(8)]
    for process in writers:
        process.start()
    for process in writers:
        process.join(60)
    assert all(p.exitcode == 0 for p in writers)
    with open(tmp_path / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 160
    assert len({row["folder"] for row in rows}) == 160
    assert not list(tmp_path.glob("*.lock")) and not list(tmp_path.glob(".tmp-*"))  # nothing left beside it


def test_result_files_follow_the_umask_and_leave_no_lock_file(tmp_path):
    from core.files import locked, write_text

    old = os.umask(0o027)
    try:
        write_text(str(tmp_path / "a.json"), "{}")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o640  # not mkstemp's 0o600
        os.umask(0o002)
        with locked(str(tmp_path / "a.json")):
            assert (tmp_path / "a.json.lock").exists()
            write_text(str(tmp_path / "a.json"), "[]")
        assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o664
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_run_rounds_times_read_as_hours_minutes_seconds():
    from strategies.common.fedavg_rounds import duration

    assert [duration(s) for s in (12.34, 0, 185, 3725, 21724658.5)] == [
        "12.3s", "0.0s", "3m 05s", "1h 02m", "6034h 38m"]
    assert duration(59.99) == "1m 00s" and duration(3599.6) == "1h 00m"
    assert [duration(s) for s in (math.nan, math.inf, -1.0, None)] == ["—"] * 4


def test_in_process_runs_print_each_log_line_once(tmp_path):
    """Flower's logger prints its lines with its own handler; the root handler of ``setup_logging``
    (the in-process runner's, the benchmarks') prints the project's and leaves Flower's alone."""
    import subprocess

    script = ("import logging, sys; sys.path.insert(0, %r)\n"
              "from server_app.inprocess import setup_logging\n"
              "from flwr.common.logger import log\n"
              "setup_logging(logging.INFO)\n"
              "log(logging.INFO, 'flower-line')\n"
              "logging.getLogger('flwr').warning('flower-warning')\n"
              "logging.getLogger('fedunlearn').info('project-line')\n") % str(Path(__file__).resolve().parents[1])
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    assert [out.count(line) for line in ("flower-line", "flower-warning", "project-line")] == [1, 1, 1], out


def test_identical_runs_in_one_second_get_their_own_folders(tmp_path):
    cfg = {"task": "digits-lenet5", "method": "none", "scenario": "sample", "seed": 42}
    folders = [report.run_folder(str(tmp_path), cfg) for _ in range(3)]
    assert len(set(folders)) == 3 and all(os.path.isdir(f) for f in folders)


# ------------------------------------------------------------------ safe data loading


class _Planted:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_planted_cifar_pickle_is_refused_and_runs_nothing(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp_path / "command-ran"
    for i in range(1, 6):
        batch = {"data": np.zeros((2, 3072), np.uint8), "labels": [0, 1]}
        if i == 1:
            batch["payload"] = _Planted(marker)
        with open(folder / f"data_batch_{i}", "wb") as handle:
            pickle.dump(batch, handle, protocol=2)
    with pytest.raises(ValueError) as info:
        load_images("cifar10", str(tmp_path), download=False)
    message = str(info.value)
    assert str(folder / "data_batch_1") in message and "refused" in message and "\n" not in message
    assert not marker.exists()


def test_mismatched_mnist_counts_stop_the_run_before_any_node_works(tmp_path):
    _write_mnist(tmp_path / "data", seed=0, n_images=2000, n_labels=1500)
    experiment, grid = _experiment(_config(tmp_path, task="mnist-lenet5", **{"data-dir": str(tmp_path / "data")}))
    with pytest.raises(ConfigError) as info:
        experiment.run()
    message = str(info.value)
    assert "2000 images" in message and "1500 labels" in message and "train-labels-idx1-ubyte" in message
    assert "\n" not in message and grid.sent_types == []


@pytest.mark.parametrize("damage, fragment", [
    (lambda raw: b"GARBAGE!" + raw[8:], "is not an unsigned-byte IDX file"),
    (lambda raw: raw[:-5], "bytes but its dimensions (30, 28, 28) need"),
    (lambda raw: raw[:10], "truncated inside its header"),
])
def test_damaged_idx_files_are_one_line_errors_naming_the_file(tmp_path, damage, fragment):
    _write_mnist(tmp_path, seed=3, n_images=30)
    images = tmp_path / "MNIST" / "raw" / "train-images-idx3-ubyte"
    images.write_bytes(damage(images.read_bytes()))
    with pytest.raises(ValueError) as info:
        load_images("mnist", str(tmp_path), download=False)
    assert str(images) in str(info.value) and fragment in str(info.value) and "\n" not in str(info.value)


def test_mnist_labels_out_of_range_are_refused(tmp_path):
    _write_mnist(tmp_path, seed=4, n_images=30)
    _write_idx(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte", np.full(30, 200))
    with pytest.raises(ValueError, match="train-labels-idx1-ubyte has label 200: labels must lie in 0..9"):
        load_images("mnist", str(tmp_path), download=False)


def test_cifar_batch_of_the_wrong_shape_names_the_file(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        with open(folder / f"data_batch_{i}", "wb") as handle:
            pickle.dump({"data": np.zeros((2, 1000), np.uint8), "labels": [0, 1]}, handle, protocol=2)
    with pytest.raises(ValueError, match=r"data_batch_1: 'data' must be uint8 of shape \(N, 3072\)"):
        load_images("cifar10", str(tmp_path), download=False)


# ------------------------------------------------------------------ the cache knows what it holds


def test_switching_data_dir_does_not_reuse_the_other_datas_model(tmp_path):
    _write_mnist(tmp_path / "A", seed=1)
    _write_mnist(tmp_path / "B", seed=2)
    first = _run(_config(tmp_path, task="mnist-lenet5", **{"data-dir": str(tmp_path / "A")}))
    second = _run(_config(tmp_path, task="mnist-lenet5", **{"data-dir": str(tmp_path / "B")}))
    assert first["cost"]["pretrain"]["rounds"] == 2
    assert second["cost"]["pretrain"]["rounds"] == 2  # trained on B, not A's model from the cache
    again = _run(_config(tmp_path, task="mnist-lenet5", **{"data-dir": str(tmp_path / "A")}))
    assert again["cost"]["pretrain"]["rounds"] == 0 and again["models"]["original"] == first["models"]["original"]


def test_degraded_pretraining_is_recorded_and_not_cached(tmp_path):
    config = _config(tmp_path, **{"forget-client": 1})
    degraded = _run(config, fail_nodes=[1])
    assert not list((tmp_path / "cache").glob("original-*.pt"))
    pretrain = degraded["cost"]["pretrain"]
    assert pretrain["degraded"] is True and degraded["cost"]["built"]["original"]["degraded"] is True
    [failure] = pretrain["failures"]  # one entry per lost node and phase, every round it missed
    assert (failure["round"], failure["client_id"], failure["rounds"]) == (1, 1, [1, 2])
    assert failure["reason"] == "injected failure" and failure["noticed_by"] == "error-reply"
    assert degraded["saw_fewer_clients"]["original"] == [{"client_id": 1, "node_id": 1001, "rounds": [1, 2]}]
    clean = _run(config)
    assert clean["cost"]["pretrain"]["rounds"] == 2 and clean["cost"]["pretrain"]["degraded"] is False


def test_a_stream_names_each_requests_models_that_saw_fewer_clients(tmp_path):
    results = _run(_config(tmp_path, requests="class:3;class:5"), fail_nodes=[1])
    lost = {"client_id": 1, "node_id": 1001}
    each = {"retrain": [{**lost, "rounds": [1, 2]}], "continued": [{**lost, "rounds": [1]}]}
    for entry in results["requests"]:  # client 1 lost in every training phase; unlearning sent no train
        assert entry["saw_fewer_clients"] == each
    assert results["saw_fewer_clients"] == {"original": [{**lost, "rounds": [1, 2]}],
                                            **{f"request {k} {model}": missed for k in (1, 2)
                                               for model, missed in each.items()}}


def test_swapped_cache_file_is_rejected_and_rebuilt(tmp_path, caplog):
    config = _config(tmp_path, method="retrain")
    first = _run(config)
    [original] = (tmp_path / "cache").glob("original-*.pt")
    [retrain] = (tmp_path / "cache").glob("retrain-*.pt")
    shutil.copyfile(retrain, original)
    with caplog.at_level(logging.WARNING, logger="fedunlearn"):
        second = _run(config)
    assert f"ignoring cache entry {original}" in caplog.text and "sha256" in caplog.text
    assert second["cost"]["pretrain"]["rounds"] == 2  # rebuilt, not the retrain model
    assert second["models"]["original"] == first["models"]["original"]  # bit-identical rebuild


# ------------------------------------------------------------------ fail before work


def test_outputs_dir_that_is_a_file_stops_before_training(tmp_path):
    (tmp_path / "out").write_text("not a folder")
    experiment, grid = _experiment(_config(tmp_path))
    with pytest.raises(ConfigError, match=r"'outputs-dir': .* is a file, not a folder"):
        experiment.run()
    assert grid.sent_types == []
    (tmp_path / "cache-file").write_text("")
    experiment, grid = _experiment(_config(tmp_path, **{"outputs-dir": str(tmp_path / "o"),
                                                        "cache-dir": str(tmp_path / "cache-file")}))
    with pytest.raises(ConfigError, match="'cache-dir'"):
        experiment.run()
    assert grid.sent_types == []


@pytest.mark.parametrize("key", ["lr", "momentum", "dirichlet-alpha", "round-timeout", "fedup.alpha"])
def test_infinite_settings_are_rejected(key):
    with pytest.raises(ConfigError) as info:
        parse_config({key: math.inf})
    assert f"'{key}'=inf" in str(info.value) and "finite" in str(info.value)


def test_documented_infinities_stay_allowed():
    cfg = parse_config({"fedup.epsilon": math.inf, "firm.epsilon": math.inf, "guard.stop-loss": math.inf})
    assert all(math.isinf(cfg[k]) for k in ("fedup.epsilon", "firm.epsilon", "guard.stop-loss"))


@pytest.mark.parametrize("overrides, fragment", [
    ({"seed": -5}, "'seed'=-5 is not allowed: must be in 0..4294967295"),
    ({"seed": 2**40}, "'seed'=1099511627776 is not allowed: must be in 0..4294967295"),
    ({"trigger-size": 40}, "'trigger-size'=40 is larger than the 32x32 images"),
])
def test_values_that_would_break_a_client_are_rejected_up_front(overrides, fragment):
    with pytest.raises(ConfigError, match=fragment):
        parse_config(overrides)


def test_impossible_dirichlet_split_names_the_key_before_any_node_works(tmp_path):
    experiment, grid = _experiment(_config(tmp_path, **{"dirichlet-alpha": 0.5}), num_clients=100)
    with pytest.raises(ConfigError) as info:
        experiment.run()
    assert "dirichlet-alpha=0.5 with 100 clients" in str(info.value) and "\n" not in str(info.value)
    assert grid.sent_types == []


def test_settings_of_another_task_or_method_are_named():
    from strategies.run_config import inapplicable_settings

    cfg = parse_config({"method": "none", "llm.lr": 0.1, "fedup.clip": 5.0, "lethe.gamma": 0.2})
    assert sorted(inapplicable_settings(cfg)) == [
        "fedup.clip (method fedup only)", "llm.lr (task llm-tofu/llm-wmdp/llm-muse/llm-tofu-forget01 only)"]
    assert inapplicable_settings(parse_config({"method": "fedup", "fedup.clip": 5.0})) == []


# ------------------------------------------------------------------ failures named and recorded


def test_round_timeout_names_the_lost_clients_and_the_timeout(tmp_path, caplog):
    experiment, _ = _experiment(_config(tmp_path), silent_nodes=[0, 1, 2])
    with caplog.at_level(logging.WARNING, logger="fedunlearn"), pytest.raises(RoundFailed) as info:
        experiment.run()
    message = str(info.value)
    assert "phase 'pretrain' round 1: only 1 of 4 nodes replied, 2 needed" in message
    assert "(clients 0, 1, 2)" in message and "round-timeout=60s" in message
    assert "nodes 1000, 1001, 1002 failed (clients 0, 1, 2): no reply within round-timeout=60s" in caplog.text


def test_clients_failing_alike_are_reported_in_one_line(tmp_path, caplog):
    experiment, _ = _experiment(_config(tmp_path), fail_nodes=[0, 1, 2, 3], fail_types=("query.hello",))
    with caplog.at_level(logging.WARNING, logger="fedunlearn"), pytest.raises(RoundFailed) as info:
        experiment.run()
    expected = "only 0 of 4 nodes replied, 4 needed (nodes 1000, 1001, 1002, 1003 failed: injected failure)"
    assert expected in str(info.value)
    assert caplog.text.count("injected failure") == 1


def test_a_node_that_stays_silent_is_dropped_and_listed(tmp_path):
    config = _config(tmp_path, **{"pretrain-rounds": 3, "forget-client": 0})
    grid = _TimeoutGrid(4, config, silent_nodes=[3])
    folder = Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    results = json.loads((Path(folder) / "results.json").read_text())
    pretrain_asks = grid.asked[1:4]  # after hello: the three pretraining rounds
    assert [1003 in asked for asked in pretrain_asks] == [True, True, False]
    [failure] = results["cost"]["pretrain"]["failures"]  # named once in the phase
    assert (failure["round"], failure["client_id"], failure["node_id"]) == (1, 3, 1003)
    assert failure["reason"] == "no reply within round-timeout=60s (a late reply is dropped)"
    assert (failure["noticed_by"], failure["rounds"], failure["not_asked"]) == ("round-timeout", [1, 2, 3], [3])
    assert results["failures"][0]["phase"] == "pretrain" and results["failures"][0]["client_id"] == 3
    assert results["saw_fewer_clients"]["original"][0]["client_id"] == 3


def test_a_stopped_run_is_a_failed_run_for_flower(monkeypatch):
    """Flower's simulation runs the ServerApp in a thread that queues an ``Exception`` (then the run
    is recorded failed); a ``SystemExit`` ends the thread silently and the run reads completed."""
    from flwr.simulation.run_simulation import run_serverapp_th

    from server_app.app import app

    fedunlearn = logging.getLogger("fedunlearn")  # the ServerApp installs its own handler: undo after
    monkeypatch.setattr(fedunlearn, "handlers", list(fedunlearn.handlers))
    monkeypatch.setattr(fedunlearn, "propagate", fedunlearn.propagate)
    monkeypatch.setattr(fedunlearn, "level", fedunlearn.level)

    run_config = {"pretrain-rounds": 0}
    exceptions, contexts = Queue(), Queue()
    context = Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)
    thread = run_serverapp_th(server_app_attr=None, server_app=app, server_app_context=context,
                              grid=InProcessGrid(2, run_config), app_dir=".", f_stop=threading.Event(),
                              exception_queue=exceptions, enable_tf_gpu_growth=False, ctx_queue=contexts)
    thread.join(60)
    assert exceptions.qsize() == 1
    assert "'pretrain-rounds'=0 is not allowed" in str(exceptions.get())


@pytest.mark.slow
@pytest.mark.skipif(not Path(sys.executable).with_name("flwr").exists(), reason="flwr CLI not installed")
def test_a_stopped_run_is_listed_failed_by_flwr(tmp_path):
    """A real ``flwr run`` whose ServerApp stops on a bad setting: ``flwr ls`` must not say completed.
    Own ``FLWR_HOME`` and free ports: its own SuperLink, stopped by pid afterwards."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from launch_federation import LocalSimulation

    with LocalSimulation(tmp_path / "flwr-home") as simulation:
        run = simulation.flwr("run", ".", "--stream", "--federation-config",
                              "num-supernodes=2 client-resources-num-cpus=1", "--run-config",
                              f"pretrain-rounds=0 outputs-dir='{tmp_path / 'out'}' cache-dir='{tmp_path / 'c'}'",
                              timeout=300)
        listed = simulation.flwr("ls", "--format", "json", timeout=60)
    log = run.stdout + run.stderr
    assert "run stopped: run-config 'pretrain-rounds'=0 is not allowed" in log, log[-3000:]
    statuses = [r["status"] for r in json.loads(listed.stdout)["runs"]]
    assert statuses == ["finished:failed"], listed.stdout


def test_missing_dataset_in_a_simulation_is_one_line_before_any_node_works(tmp_path):
    experiment, grid = _experiment(_config(tmp_path, task="mnist-lenet5", **{"data-dir": str(tmp_path / "none")}))
    with pytest.raises(ConfigError) as info:
        experiment.run()
    assert "'data-dir': mnist: train-images-idx3-ubyte" in str(info.value) and "\n" not in str(info.value)
    assert grid.sent_types == []


def test_a_csv_written_under_an_older_header_keeps_its_rows_under_their_names(tmp_path):
    """A results.csv from before a column was added: its rows are rewritten under the current header
    (new columns empty, a dropped column kept at the end), so the new row lands under the right names."""
    import csv

    from server_app.report import CSV_FIELDS, append_csv

    old_fields = [f for f in CSV_FIELDS if f not in ("unlearned_mia_efficacy", "validity_failed")] + ["retired"]
    with open(tmp_path / "results.csv", "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=old_fields)
        writer.writeheader()
        writer.writerow({**{f: "" for f in old_fields}, "method": "old", "unlearned_mia": "0.25", "retired": "x"})
    results = {"run": {"task": "t", "method": "new", "scenario": "class", "seed": 1, "num_clients": 3},
               "models": {"original": {"test_acc": 0.9, "forget_acc": 1.0},
                          "unlearned": {"mia": 0.5, "mia_efficacy": 0.5}},
               "resurfacing": {}, "cost": {"unlearn": {"seconds": 1, "bytes_up": 2, "bytes_down": 3}}}
    append_csv(str(tmp_path), results, "folder")
    rows = list(csv.DictReader(open(tmp_path / "results.csv", encoding="utf-8")))
    assert [r["method"] for r in rows] == ["old", "new"]
    assert rows[0]["unlearned_mia"] == "0.25" and rows[0]["retired"] == "x" and rows[0]["unlearned_mia_efficacy"] == ""
    assert rows[1]["unlearned_mia_efficacy"] == "0.5" and rows[1]["unlearned_mia"] == "0.5"
