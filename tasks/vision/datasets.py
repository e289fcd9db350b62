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
- ``mnist``: the uncompressed IDX files ``<data_dir>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte``
  (torchvision's layout; its ``MNIST(download=True)`` fetches all four, so all four are required
  although only ``train-*`` is read). They are read by a checked reader here: magic number, data
  type, dimensions, file length, image and label counts, labels in 0..9, each failure a one-line
  ``ValueError`` naming the file. The 28x28 digits are zero-padded by 2 pixels on every side to
  32x32 — LeCun's own LeNet-5 input layout (padding keeps strokes undistorted, unlike resizing).
- ``cifar10`` / ``cifar100``: the python pickle batches of the official archives
  (``<data_dir>/cifar-10-batches-py/data_batch_1..5``, ``<data_dir>/cifar-100-python/train``;
  CIFAR-100 labels are the 100 ``fine_labels``). They are read by a small reader here, not by
  ``torchvision.datasets.CIFAR10/100``: torchvision verifies the md5 of every batch of the official
  release before reading (``_check_integrity``), so it refuses any other file in the very same
  format (e.g. the small fixtures the tests write). Since any file there is read, the pickles go
  through :class:`_CifarUnpickler`, which builds only what the format holds (numpy arrays, dicts,
  lists, strings, bytes, numbers) and refuses anything else — a planted pickle cannot run code.
  torchvision is still what *downloads* them (``download=True``), and its download verifies the
  archive's md5.

Missing files: checked first, before any heavy work. With ``download`` off, or when the download
fails, a one-line ``FileNotFoundError`` names the dataset, the folder searched, the missing files
and how to provide them.

Every pool carries ``fingerprint``, a sha256 of the arrays actually read (dtype, shape, bytes of
images and labels), computed once here: the server's model cache keys on it, so other files under
the same ``data-dir`` never reuse a model trained on the old ones.

Results are cached per process (every simulated client of a process calls this); the cached tensors
are shared, so callers must not modify them in place (index or clone instead).
"""

from __future__ import annotations

import functools
import hashlib
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
    fingerprint: str = ""


def fingerprint(*arrays: np.ndarray) -> str:
    """sha256 over the dtype, shape and bytes of each array: the identity of the data read."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


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


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as ``(images (n, 8, 8) float64, target (n,) int)``.

    Read straight from the file scikit-learn ships (``sklearn/datasets/data/digits.csv.gz``: 64
    pixel columns and the label, what ``load_digits`` parses), found without importing scikit-learn:
    its import costs ~2 s, paid by every fresh ClientApp process that builds a data view. Falls back
    to ``load_digits`` where the file is not there."""
    import gzip
    from importlib.util import find_spec

    spec = find_spec("sklearn")
    path = (os.path.join(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
            if spec and spec.submodule_search_locations else "")
    if not os.path.isfile(path):
        from sklearn.datasets import load_digits

        bunch = load_digits()
        return bunch.images, bunch.target
    with gzip.open(path, mode="rt", encoding="utf-8") as handle:
        table = np.loadtxt(handle, delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int, copy=False)


def _load_digits() -> ImageData:
    images, target = _digits_arrays()
    small = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)
    x = F.interpolate(small, size=(IMAGE_SIZE, IMAGE_SIZE), mode="bilinear", align_corners=False)
    y = torch.from_numpy(target.astype(np.int64))
    return ImageData(x=x.contiguous(), y=y, num_classes=10, fingerprint=fingerprint(images, target))


def _load_mnist(data_dir: str, download: bool) -> ImageData:
    def fetch() -> None:
        from torchvision.datasets import MNIST

        MNIST(root=data_dir, train=True, download=True)

    raw = os.path.join(data_dir, "MNIST", "raw")
    _require_files(
        "mnist", raw, _MNIST_FILES, download, fetch,
        how="place the 4 uncompressed MNIST/raw/*-ubyte IDX files under data-dir",
    )
    images_path, labels_path = (os.path.join(raw, name) for name in _MNIST_FILES[:2])
    images, labels = read_idx(images_path, ndim=3), read_idx(labels_path, ndim=1)
    if len(images) != len(labels):
        raise ValueError(f"mnist: {images_path} holds {len(images)} images but {labels_path} "
                         f"{len(labels)} labels: they must agree")
    if labels.size and int(labels.max()) >= 10:
        raise ValueError(f"mnist: {labels_path} has label {int(labels.max())}: labels must lie in 0..9")
    if images.shape[1] > IMAGE_SIZE or images.shape[2] > IMAGE_SIZE:
        raise ValueError(f"mnist: {images_path} holds {images.shape[1]}x{images.shape[2]} images: "
                         f"they must be at most {IMAGE_SIZE}x{IMAGE_SIZE}")
    x = _pad_to_size(torch.from_numpy(images).unsqueeze(1).to(torch.float32).div_(255.0))
    return ImageData(x=x, y=torch.from_numpy(labels.astype(np.int64)), num_classes=10,
                     fingerprint=fingerprint(images, labels))


def read_idx(path: str, ndim: int) -> np.ndarray:
    """An unsigned-byte IDX file (LeCun's MNIST format) of ``ndim`` dimensions, checked.

    Layout: two zero bytes, the type code 0x08 (unsigned byte), the number of dimensions, one
    big-endian uint32 per dimension, then exactly the product of the dimensions in bytes.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    header = 4 + 4 * ndim
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise ValueError(f"mnist: {path} is not an unsigned-byte IDX file (magic number "
                         f"{raw[:4].hex() or 'missing'}, expected 000008{ndim:02x})")
    if raw[3] != ndim:
        raise ValueError(f"mnist: {path} has {raw[3]} dimensions, expected {ndim}")
    if len(raw) < header:
        raise ValueError(f"mnist: {path} is truncated inside its header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) != expected:
        raise ValueError(f"mnist: {path} has {len(raw)} bytes but its dimensions {dims} need {expected}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()  # writable, for torch


def _pad_to_size(x: torch.Tensor) -> torch.Tensor:
    """Zero-pad (N, C, h, w) images (at most IMAGE_SIZE on each side), centred, to IMAGE_SIZE x IMAGE_SIZE."""
    height, width = x.shape[-2:]
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
    raw_x, raw_y = np.concatenate(images), np.concatenate(labels)
    x = torch.from_numpy(raw_x).to(torch.float32).div_(255.0)
    y = torch.from_numpy(raw_y)
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= layout.num_classes):
        raise ValueError(f"{dataset}: labels in {folder} must lie in [0, {layout.num_classes}), "
                         f"got [{int(y.min())}, {int(y.max())}]")
    return ImageData(x=x.contiguous(), y=y, num_classes=layout.num_classes, fingerprint=fingerprint(raw_x, raw_y))


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR python batch is made of; any other global is refused.

    Dicts, lists, strings, bytes and numbers need no global at all; numpy arrays need
    ``_reconstruct``/``ndarray``/``dtype`` (and ``scalar`` for numpy numbers), and protocol-2
    pickles written by python 3 spell bytes as ``_codecs.encode``. None of these runs code.
    """

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refused to load {module}.{name}")
        return super().find_class(module, name)


def read_cifar_batch(path: str, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    """One CIFAR python batch: uint8 images (N, 3, 32, 32) and int64 labels (N,).

    The format of the official release: a pickled dict (latin-1 for python-2 strings) whose
    ``data`` is uint8 (N, 3072) — the 1024 red, then green, then blue values of each image in
    row-major order — and whose ``label_key`` (``labels`` / ``fine_labels``) lists the classes.
    """
    try:
        with open(path, "rb") as handle:
            entry = _CifarUnpickler(handle, encoding="latin1").load()
    except pickle.UnpicklingError as err:
        raise ValueError(f"{path}: not a CIFAR python batch: {' '.join(str(err).split())} (a batch holds only "
                         "numpy arrays, dicts, lists, strings and numbers)") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as err:
        raise ValueError(f"{path}: not a CIFAR python batch ({type(err).__name__}: "
                         f"{' '.join(str(err).split())})") from None
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        raise ValueError(f"{path}: not a CIFAR python batch: expected a dict with 'data' and '{label_key}'")
    data = np.asarray(entry["data"])
    row = 3 * IMAGE_SIZE * IMAGE_SIZE
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != row:
        raise ValueError(f"{path}: 'data' must be uint8 of shape (N, {row}), got {data.dtype} {data.shape}")
    data = data.reshape(-1, 3, IMAGE_SIZE, IMAGE_SIZE)
    labels = np.asarray(entry[label_key], dtype=np.int64)
    if labels.ndim != 1 or len(labels) != len(data):
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
