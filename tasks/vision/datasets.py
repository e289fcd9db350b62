"""Image classification pools for the federation: digits (embedded), MNIST, CIFAR-10, CIFAR-100.

``load_images`` returns the *training pool* the federation partitions; every client later carves its
own local test split out of its share, so only the official training split is read.

Pixel space: ``x`` is float32 in [0, 1], shape (N, C, 32, 32), **not** mean/std normalised. The
normalisation is the first layer of every model (``tasks.vision.models``), so a backdoor trigger can
be written as the pixel value 1.0 whatever the dataset.

Per dataset:

- ``digits``: scikit-learn's ``load_digits`` (1797 real handwritten 8x8 digits, shipped inside
  scikit-learn, so it works offline). Values 0..16 are divided by 16 and upsampled to 32x32 with
  bilinear interpolation (``align_corners=False``) so LeNet-5 sees the input size it was built for.
  ``data_dir`` and ``download`` are ignored.
- ``mnist``: ``torchvision.datasets.MNIST(root=data_dir, train=True)`` reading the uncompressed IDX
  files ``<data_dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``. torchvision checks
  that all four exist (no checksum), so all four are required although only ``train-*`` is read.
  The 28x28 digits are zero-padded by 2 pixels on every side to 32x32 — LeCun's own LeNet-5 input
  layout (padding keeps strokes undistorted, unlike resizing).
- ``cifar10`` / ``cifar100``: the python pickle batches of the official archives
  (``<data_dir>/cifar-10-batches-py/data_batch_1..5``, ``<data_dir>/cifar-100-python/train``;
  CIFAR-100 labels are the 100 ``fine_labels``). They are read by a small reader here, not by
  ``torchvision.datasets.CIFAR10/100``: torchvision verifies the md5 of every batch of the official
  release before reading (``_check_integrity``), so it refuses any other file in the very same
  format (e.g. the small fixtures the tests write). torchvision is still what *downloads* them
  (``download=True``), and its download verifies the archive's md5.

Missing files: checked first, before any heavy work. With ``download`` off, or when the download
fails, a one-line ``FileNotFoundError`` names the dataset, the folder searched, the missing files
and how to provide them.

Results are cached per process (every simulated client of a process calls this); the cached tensors
are shared, so callers must not modify them in place (index or clone instead).
"""

from __future__ import annotations

import functools
import os
import pickle
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

IMAGE_SIZE = 32
DATASETS = ("digits", "mnist", "cifar10", "cifar100")

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


@dataclass(frozen=True)
class _CifarLayout:
    folder: str
    train_files: tuple[str, ...]
    label_key: str
    num_classes: int
    archive: str


_CIFAR = {
    "cifar10": _CifarLayout(
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        label_key="labels",
        num_classes=10,
        archive="cifar-10-python.tar.gz",
    ),
    "cifar100": _CifarLayout(
        folder="cifar-100-python",
        train_files=("train",),
        label_key="fine_labels",
        num_classes=100,
        archive="cifar-100-python.tar.gz",
    ),
}


@dataclass(frozen=True)
class ImageData:
    """A labelled image pool: ``x`` (N, C, H, W) float32 in [0, 1], ``y`` (N,) int64 in [0, num_classes)."""

    x: torch.Tensor
    y: torch.Tensor
    num_classes: int


def load_images(dataset: str, data_dir: str, download: bool) -> ImageData:
    """The training pool of ``dataset`` (one of ``DATASETS``), read from ``data_dir``."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    # digits is embedded: one cache entry whatever the folder settings.
    folder = "" if dataset == "digits" else os.path.abspath(os.path.expanduser(str(data_dir)))
    return _load_cached(dataset, folder, bool(download) and dataset != "digits")


@functools.lru_cache(maxsize=None)
def _load_cached(dataset: str, data_dir: str, download: bool) -> ImageData:
    if dataset == "digits":
        return _load_digits()
    if dataset == "mnist":
        return _load_mnist(data_dir, download)
    return _load_cifar(dataset, data_dir, download)


def _load_digits() -> ImageData:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    small = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(small, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    return ImageData(x=x.contiguous(), y=y, num_classes=10)


def _load_mnist(data_dir: str, download: bool) -> ImageData:
    def fetch() -> None:
        from torchvision.datasets import MNIST

        MNIST(root=data_dir, train=True, download=True)

    raw = os.path.join(data_dir, "MNIST", "raw")
    _require_files(
        "mnist", raw, _MNIST_FILES, download, fetch,
        how="place the 4 uncompressed MNIST/raw/*-ubyte IDX files under data-dir",
    )
    from torchvision.datasets import MNIST

    mnist = MNIST(root=data_dir, train=True, download=False)
    x = _pad_to_size(mnist.data.unsqueeze(1).to(torch.float32).div_(255.0))
    return ImageData(x=x, y=mnist.targets.to(torch.int64), num_classes=10)


def _pad_to_size(x: torch.Tensor) -> torch.Tensor:
    """Zero-pad (N, C, h, w) images, centred, to IMAGE_SIZE x IMAGE_SIZE."""
    height, width = x.shape[-2:]
    if height > IMAGE_SIZE or width > IMAGE_SIZE:
        raise ValueError(f"mnist images must be at most {IMAGE_SIZE}x{IMAGE_SIZE}, got {height}x{width}")
    top, left = (IMAGE_SIZE - height) // 2, (IMAGE_SIZE - width) // 2
    padding = (left, IMAGE_SIZE - width - left, top, IMAGE_SIZE - height - top)
    return F.pad(x, padding).contiguous()


def _load_cifar(dataset: str, data_dir: str, download: bool) -> ImageData:
    layout = _CIFAR[dataset]

    def fetch() -> None:
        from torchvision import datasets

        loader = datasets.CIFAR10 if dataset == "cifar10" else datasets.CIFAR100
        loader(root=data_dir, train=True, download=True)

    folder = os.path.join(data_dir, layout.folder)
    _require_files(
        dataset, folder, layout.train_files, download, fetch,
        how=f"extract {layout.archive} under data-dir (it unpacks to {layout.folder}/)",
    )
    images, labels = [], []
    for name in layout.train_files:
        batch_x, batch_y = read_cifar_batch(os.path.join(folder, name), layout.label_key)
        images.append(batch_x)
        labels.append(batch_y)
    x = torch.from_numpy(np.concatenate(images)).to(torch.float32).div_(255.0)
    y = torch.from_numpy(np.concatenate(labels))
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= layout.num_classes):
        raise ValueError(f"{dataset}: labels in {folder} must lie in [0, {layout.num_classes}), "
                         f"got [{int(y.min())}, {int(y.max())}]")
    return ImageData(x=x.contiguous(), y=y, num_classes=layout.num_classes)


def read_cifar_batch(path: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch: uint8 images (N, 3, 32, 32) and int64 labels (N,).

    The format of the official release: a pickled dict (latin-1 for python-2 strings) whose
    ``data`` is uint8 (N, 3072) — the 1024 red, then green, then blue values of each image in
    row-major order — and whose ``label_key`` (``labels`` / ``fine_labels``) lists the classes.
    """
    with open(path, "rb") as handle:
        entry = pickle.load(handle, encoding="latin1")
    data = np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if len(labels) != len(data):
        raise ValueError(f"{path}: {len(data)} images but {len(labels)} labels")
    return data, labels


def _missing(folder: str, names: tuple[str, ...]) -> list[str]:
    return [name for name in names if not os.path.isfile(os.path.join(folder, name))]


def _require_files(dataset: str, folder: str, names: tuple[str, ...], download: bool,
                   fetch: Callable[[], None], how: str) -> None:
    """Make sure ``folder`` holds ``names``: download with ``fetch`` if allowed, else fail in one line."""
    missing = _missing(folder, names)
    if not missing:
        return
    reason = "download is off"
    if download:
        try:
            fetch()
            reason = "the download did not produce them"
        except (OSError, RuntimeError) as error:  # URLError, HTTPError, timeouts, md5 mismatch
            reason = f"download failed ({' '.join(str(error).split())})"
        missing = _missing(folder, names)
        if not missing:
            return
    raise FileNotFoundError(
        f"{dataset}: {', '.join(missing)} not found in {folder} and {reason}; "
        f"set run-config download=true (needs network) or {how}"
    )
