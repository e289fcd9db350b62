"""Image loaders on small files written in the real on-disk formats, plus the backdoor trigger."""

from __future__ import annotations

import ast
import gzip
import pickle
import struct
from pathlib import Path
from urllib.error import URLError

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tasks.vision import ImageData, apply_trigger, load_images

REPO_ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- writers of the official formats


def _write_idx(path: Path, array: np.ndarray) -> None:
    """IDX (LeCun's MNIST format): 0, 0, type 0x08 (ubyte), ndim; big-endian int32 dims; raw bytes."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(np.uint8).tobytes())


def write_mnist(root: Path, rng: np.random.Generator, n_train: int = 6, n_test: int = 3):
    raw = root / "MNIST" / "raw"
    raw.mkdir(parents=True)
    images = rng.integers(0, 256, size=(n_train, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n_train, dtype=np.uint8)
    _write_idx(raw / "train-images-idx3-ubyte", images)
    _write_idx(raw / "train-labels-idx1-ubyte", labels)
    _write_idx(raw / "t10k-images-idx3-ubyte", rng.integers(0, 256, size=(n_test, 28, 28), dtype=np.uint8))
    _write_idx(raw / "t10k-labels-idx1-ubyte", rng.integers(0, 10, size=n_test, dtype=np.uint8))
    # torchvision downloads *.gz and keeps them next to the extracted files; it reads the extracted ones.
    with gzip.open(raw / "train-images-idx3-ubyte.gz", "wb") as handle:
        handle.write((raw / "train-images-idx3-ubyte").read_bytes())
    return images, labels


def _pickle(path: Path, obj: dict) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)


def _cifar_rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)


def write_cifar10(root: Path, rng: np.random.Generator, per_batch: int = 2):
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rows, labels = [], []
    for i in range(1, 6):
        batch_rows, batch_labels = _cifar_rows(rng, per_batch), rng.integers(0, 10, per_batch).tolist()
        _pickle(folder / f"data_batch_{i}", {
            "batch_label": f"training batch {i} of 5", "labels": batch_labels, "data": batch_rows,
            "filenames": [f"img{j}.png" for j in range(per_batch)],
        })
        rows.append(batch_rows)
        labels += batch_labels
    _pickle(folder / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": [0, 1],
                                    "data": _cifar_rows(rng, 2), "filenames": ["a.png", "b.png"]})
    _pickle(folder / "batches.meta", {"num_cases_per_batch": per_batch, "num_vis": 3072,
                                      "label_names": [f"class{c}" for c in range(10)]})
    return np.concatenate(rows), np.array(labels)


def write_cifar100(root: Path, rng: np.random.Generator, n: int = 5):
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    rows, fine = _cifar_rows(rng, n), rng.integers(0, 100, n).tolist()
    fine[0] = 99  # the largest fine label must survive (there are only 20 coarse labels)
    _pickle(folder / "train", {
        "filenames": [f"t{j}.png" for j in range(n)], "batch_label": "training batch 1 of 1",
        "fine_labels": fine, "coarse_labels": [f % 20 for f in fine], "data": rows,
    })
    _pickle(folder / "test", {"filenames": ["x.png"], "batch_label": "testing batch 1 of 1",
                              "fine_labels": [3], "coarse_labels": [3], "data": _cifar_rows(rng, 1)})
    _pickle(folder / "meta", {"fine_label_names": [f"f{c}" for c in range(100)],
                              "coarse_label_names": [f"c{c}" for c in range(20)]})
    return rows, np.array(fine)


def _check_pool(data: ImageData, n: int, channels: int, num_classes: int) -> None:
    assert data.x.shape == (n, channels, 32, 32)
    assert data.x.dtype == torch.float32 and data.y.dtype == torch.int64
    assert data.y.shape == (n,)
    assert float(data.x.min()) >= 0.0 and float(data.x.max()) <= 1.0
    assert data.num_classes == num_classes


# ---------------------------------------------------------------- loaders


def test_mnist_idx_files_round_trip_padded_to_32(tmp_path):
    images, labels = write_mnist(tmp_path, np.random.default_rng(0))
    data = load_images("mnist", str(tmp_path), download=False)
    _check_pool(data, len(labels), 1, 10)
    assert torch.equal(data.y, torch.from_numpy(labels.astype(np.int64)))
    expected = torch.from_numpy(images).float().div(255.0)
    assert torch.allclose(data.x[:, 0, 2:30, 2:30], expected)
    border = torch.ones(32, 32, dtype=torch.bool)
    border[2:30, 2:30] = False
    assert torch.all(data.x[:, 0][:, border] == 0)


def test_cifar10_pickle_batches_round_trip_in_batch_order(tmp_path):
    rows, labels = write_cifar10(tmp_path, np.random.default_rng(1))
    data = load_images("cifar10", str(tmp_path), download=False)
    _check_pool(data, len(labels), 3, 10)
    assert torch.equal(data.y, torch.from_numpy(labels.astype(np.int64)))
    # Channel planes: red values 0..1023, then green, then blue, each row-major.
    i, c, h, w = 7, 2, 5, 30
    assert data.x[i, c, h, w].item() == pytest.approx(rows[i, c * 1024 + h * 32 + w] / 255.0)
    assert torch.allclose(data.x.flatten(1), torch.from_numpy(rows).float() / 255.0)


def test_cifar100_reads_fine_labels(tmp_path):
    rows, fine = write_cifar100(tmp_path, np.random.default_rng(2))
    data = load_images("cifar100", str(tmp_path), download=False)
    _check_pool(data, len(fine), 3, 100)
    assert torch.equal(data.y, torch.from_numpy(fine.astype(np.int64)))
    assert torch.allclose(data.x.flatten(1), torch.from_numpy(rows).float() / 255.0)


def test_digits_is_the_whole_embedded_set_upsampled():
    from sklearn.datasets import load_digits

    data = load_images("digits", "", download=False)
    _check_pool(data, 1797, 1, 10)
    bunch = load_digits()
    assert torch.equal(data.y, torch.from_numpy(bunch.target).long())
    # Averaging each 4x4 block back to 8x8 recovers the original digit up to interpolation blur.
    pooled = F.adaptive_avg_pool2d(data.x, 8).flatten()
    original = torch.from_numpy(bunch.images / 16.0).float().flatten()
    assert torch.corrcoef(torch.stack([pooled, original]))[0, 1] > 0.95
    assert load_images("digits", "/elsewhere", download=True) is data  # cached per process


def test_digits_read_without_scikit_learn_equal_load_digits_and_keep_the_fingerprint():
    """The shipped file is parsed without importing scikit-learn (a fresh ClientApp process saves its
    import); the arrays, and so the data fingerprint in every cache key, are load_digits' own."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    from tasks.vision.datasets import _digits_arrays, fingerprint

    images, target = _digits_arrays()
    bunch = load_digits()
    assert images.dtype == bunch.images.dtype and np.array_equal(images, bunch.images)
    assert target.dtype == bunch.target.dtype and np.array_equal(target, bunch.target)
    assert fingerprint(images, target) == fingerprint(bunch.images, bunch.target)
    code = ("import sys; from tasks.vision.datasets import load_images; load_images('digits', '', False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sklearn'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("dataset, folder", [("mnist", "MNIST/raw"), ("cifar10", "cifar-10-batches-py"),
                                             ("cifar100", "cifar-100-python")])
def test_missing_files_give_one_line_error(tmp_path, dataset, folder):
    with pytest.raises(FileNotFoundError) as info:
        load_images(dataset, str(tmp_path), download=False)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(dataset) and str(tmp_path / folder) in message
    assert "download=true" in message


def test_incomplete_mnist_names_the_missing_file(tmp_path):
    write_mnist(tmp_path, np.random.default_rng(3))
    (tmp_path / "MNIST" / "raw" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_images("mnist", str(tmp_path), download=False)


def test_failed_download_is_reported_in_one_line(tmp_path, monkeypatch):
    import torchvision.datasets

    def offline(*args, **kwargs):
        raise URLError("no route to host\nsecond line")

    monkeypatch.setattr(torchvision.datasets, "CIFAR10", offline)
    with pytest.raises(FileNotFoundError) as info:
        load_images("cifar10", str(tmp_path), download=True)
    assert "download failed" in str(info.value) and "\n" not in str(info.value)


def test_unknown_dataset_is_rejected():
    with pytest.raises(ValueError, match="dataset must be one of"):
        load_images("imagenet", "", download=False)


@pytest.mark.parametrize("module", ["__init__", "datasets", "models", "triggers"])
def test_tasks_vision_imports_torchvision_only_lazily(module):
    """No module-level torchvision import: importing tasks.vision must stay light for every client."""
    tree = ast.parse((REPO_ROOT / "tasks" / "vision" / f"{module}.py").read_text())
    imported = [alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names]
    imported += [node.module or "" for node in tree.body if isinstance(node, ast.ImportFrom)]
    assert imported and not any(name.split(".")[0] == "torchvision" for name in imported)


# ---------------------------------------------------------------- trigger


def test_trigger_whitens_bottom_right_square_of_a_copy():
    x = torch.rand(3, 3, 8, 10) * 0.5
    out = apply_trigger(x, 3)
    assert torch.all(out[..., 5:, 7:] == 1.0)
    assert torch.equal(out[..., :5, :], x[..., :5, :]) and torch.equal(out[..., :, :7], x[..., :, :7])
    assert float(x.max()) <= 0.5  # input untouched


@pytest.mark.parametrize("size", [0, -1, 9, 2.0])
def test_trigger_size_is_validated(size):
    with pytest.raises(ValueError, match="trigger size"):
        apply_trigger(torch.zeros(1, 1, 8, 10), size)


def test_trigger_needs_a_batch_of_images():
    with pytest.raises(ValueError, match="N, C, H, W"):
        apply_trigger(torch.zeros(1, 8, 8), 2)
