"""A SuperNode's own data: the files behind its ``data-path`` node-config key.

Vision tasks read one ``.npz`` file per split from the folder ``data-path``:

- ``train.npz``: the node's training data; ``test.npz``: its local test split.
- each holds ``x``, images of shape (N, H, W) (one channel) or (N, C, H, W), either uint8 in
  0..255 or float in [0, 1], with H = W = 32 and C the task's channels (1 for digits/MNIST, 3 for
  CIFAR); and ``y``, integer labels (N,) in 0..num_classes-1.
- written e.g. with ``numpy.savez(path, x=images, y=labels)``; read with ``allow_pickle=False``.

The request is applied on the node exactly as for a partition of the shared pool
(``tasks.requests.apply_request``): the class scenario forgets ``forget-class`` everywhere; the
client and sample scenarios select the node whose ``partition-id`` equals ``forget-client``, so a
federation of data-path nodes names its forget client (-1, the largest client, needs the shared
pool). Every problem is a one-line ``ValueError`` naming ``data-path``, raised before any training;
the node answers the server with it.

The LLM task does not read a ``data-path`` yet (a one-line error says so).
"""

from __future__ import annotations

import os
import zipfile

import numpy as np
import torch

from tasks.config import Config
from tasks.requests import ClientData, apply_request
from tasks.vision.datasets import IMAGE_SIZE

SPLITS = ("train", "test")


def split_files(data_path: str) -> list[str]:
    """The files a vision node reads, in ``SPLITS`` order."""
    return [os.path.join(data_path, f"{split}.npz") for split in SPLITS]


def _fail(data_path: str, problem: str) -> ValueError:
    return ValueError(f"node config 'data-path'={data_path!r}: {problem}")


def load_split(data_path: str, split: str, num_classes: int, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` float32 (N, C, 32, 32) in [0, 1] and ``y`` int64 (N,) of one split, checked."""
    path = os.path.join(data_path, f"{split}.npz")
    if not os.path.isfile(path):
        raise _fail(data_path, f"{split}.npz not found (expected {path} with arrays x and y)")
    try:
        with np.load(path, allow_pickle=False) as archive:
            if "x" not in archive or "y" not in archive:
                raise _fail(data_path, f"{split}.npz must hold arrays 'x' and 'y', has {sorted(archive.files)}")
            x, y = archive["x"], archive["y"]
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        if str(error).startswith("node config"):
            raise
        raise _fail(data_path, f"{split}.npz is not a readable .npz file ({' '.join(str(error).split())})") from None
    if x.ndim == 3:
        x = x[:, None]
    if x.ndim != 4 or x.shape[1] != channels or x.shape[2:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise _fail(data_path, f"{split}.npz 'x' has shape {x.shape}: must be (N, {IMAGE_SIZE}, {IMAGE_SIZE})"
                               f" or (N, {channels}, {IMAGE_SIZE}, {IMAGE_SIZE})")
    if len(x) == 0 or y.shape != (len(x),):
        raise _fail(data_path, f"{split}.npz has {len(x)} images and 'y' of shape {y.shape}: "
                               "need at least one image and one label per image")
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif np.issubdtype(x.dtype, np.floating):
        if not np.isfinite(x).all() or x.min() < 0 or x.max() > 1:
            raise _fail(data_path, f"{split}.npz 'x' is float but not in [0, 1]")
    else:
        raise _fail(data_path, f"{split}.npz 'x' has dtype {x.dtype}: must be uint8 or float in [0, 1]")
    if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= num_classes:
        raise _fail(data_path, f"{split}.npz 'y' must be integers in 0..{num_classes - 1}, "
                               f"got {y.dtype} in [{y.min()}, {y.max()}]")
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(y.astype(np.int64))


def build_own_client_data(cfg: Config, data_path: str, partition_id: int) -> ClientData:
    """This node's view of the request, from its own files (see the module docstring)."""
    if cfg["scenario"] != "class" and cfg["forget-client"] < 0:
        raise ValueError("run-config 'forget-client'=-1 (the largest client) needs the shared pool: with node "
                         "config 'data-path' set forget-client to the partition-id of the leaving node")
    spec = cfg.task
    train = load_split(data_path, "train", spec.num_classes, spec.in_channels)
    test = load_split(data_path, "test", spec.num_classes, spec.in_channels)
    return apply_request(cfg, partition_id, cfg["forget-client"], train, test, spec.num_classes)
