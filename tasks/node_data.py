"""A SuperNode's own data: the files behind its ``data-path`` node-config key.

Vision tasks read, per split (``train``: the node's training data; ``test``: its local test split),
from the folder ``data-path`` either

- one ``.npz`` file, ``train.npz`` / ``test.npz``, holding ``x``, images of shape (N, H, W) (one
  channel) or (N, C, H, W), either uint8 in 0..255 or float in [0, 1], with H = W = 32 and C the
  task's channels (1 for digits/MNIST, 3 for CIFAR); and ``y``, integer labels (N,) in
  0..num_classes-1 — written e.g. with ``numpy.savez(path, x=images, y=labels)``, read with
  ``allow_pickle=False``; or
- an image folder, ``train/<label>/<image>`` / ``test/<label>/<image>``: one sub-folder per class
  named by its integer label (``0`` … ``num_classes-1``; names, not alphabetical order, give the
  label, so ``10`` is never sorted before ``2``), images in PNG, JPEG or BMP, read with Pillow,
  converted to the task's channels (grey or RGB) and resized to 32×32 (bilinear) when they are
  another size. Files are read in sorted order, so every read gives the same tensors.

When both forms are present for a split, the ``.npz`` file is read.

The request is applied on the node exactly as for a partition of the shared pool
(``tasks.requests.apply_request``): the class scenario forgets ``forget-class`` everywhere; the
client and sample scenarios select the node whose ``partition-id`` equals ``forget-client``, so a
federation of data-path nodes names its forget client (-1, the largest client, needs the shared
pool). Every problem is a one-line ``ValueError`` naming ``data-path``, raised before any training;
the node answers the server with it.

The LLM task reads TOFU-format files from its ``data-path`` (``tasks.llm.node_data``); the text
tasks do not read one yet (a one-line error says so).
"""

from __future__ import annotations

import os
import zipfile

import numpy as np
import torch

from core.config import Config
from tasks.requests import ClientData, apply_request
from tasks.vision.datasets import IMAGE_SIZE

SPLITS = ("train", "test")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")


def _images(data_path: str, split: str) -> list[str]:
    """The image files of ``split``'s image folder, sorted (empty when it has none)."""
    root = os.path.join(data_path, split)
    if not os.path.isdir(root):
        return []
    return sorted(os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names
                  if name.lower().endswith(IMAGE_SUFFIXES))


def split_files(data_path: str) -> list[str]:
    """The files a vision node reads, in ``SPLITS`` order (its ``.npz`` file, else its images)."""
    files = []
    for split in SPLITS:
        npz = os.path.join(data_path, f"{split}.npz")
        files += [npz] if os.path.isfile(npz) else _images(data_path, split)
    return files


def _fail(data_path: str, problem: str) -> ValueError:
    return ValueError(f"node config 'data-path'={data_path!r}: {problem}")


def load_split(data_path: str, split: str, num_classes: int, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` float32 (N, C, 32, 32) in [0, 1] and ``y`` int64 (N,) of one split, checked."""
    path = os.path.join(data_path, f"{split}.npz")
    if not os.path.isfile(path):
        if os.path.isdir(os.path.join(data_path, split)):
            return load_image_folder(data_path, split, num_classes, channels)
        raise _fail(data_path, f"neither {split}.npz (arrays x and y) nor an image folder {split}/<label>/ found "
                               f"in {data_path}")
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


def load_image_folder(data_path: str, split: str, num_classes: int, channels: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``split``'s image folder as ``(x, y)``: see the module docstring for the layout."""
    from PIL import Image, UnidentifiedImageError

    root = os.path.join(data_path, split)
    labels = sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))
    wrong = [name for name in labels if not (name.isdigit() and int(name) < num_classes)]
    if wrong:
        raise _fail(data_path, f"{split}/{wrong[0]}: class folders must be named by their label, an integer in "
                               f"0..{num_classes - 1}")
    mode = "L" if channels == 1 else "RGB"
    images, targets = [], []
    for label in labels:
        for path in _images(data_path, os.path.join(split, label)):
            try:
                with Image.open(path) as image:
                    image = image.convert(mode)
                    if image.size != (IMAGE_SIZE, IMAGE_SIZE):
                        image = image.resize((IMAGE_SIZE, IMAGE_SIZE), Image.BILINEAR)
                    pixels = np.asarray(image, dtype=np.uint8)
            except (OSError, UnidentifiedImageError) as error:
                raise _fail(data_path, f"{os.path.relpath(path, data_path)} is not a readable image "
                                       f"({' '.join(str(error).split())})") from None
            images.append(pixels[None] if channels == 1 else pixels.transpose(2, 0, 1))
            targets.append(int(label))
    if not images:
        raise _fail(data_path, f"the image folder {split}/ holds no PNG, JPEG or BMP image under {split}/<label>/")
    x = torch.from_numpy(np.stack(images).astype(np.float32) / 255.0)
    return x, torch.tensor(targets, dtype=torch.int64)


def require_named_forget_client(cfg: Config) -> None:
    """A request that names a leaving client (client and sample scenarios), on nodes reading their own
    files, must name it by its ``partition-id``: ``forget-client=-1`` (the largest client) needs the
    shared pool to know which one that is (every task's ``data-path`` reader calls this)."""
    if cfg["scenario"] != "class" and cfg["forget-client"] < 0:
        raise ValueError("run-config 'forget-client'=-1 (the largest client) needs the shared pool: with node "
                         "config 'data-path' set forget-client to the partition-id of the leaving node")


def build_own_client_data(cfg: Config, data_path: str, partition_id: int) -> ClientData:
    """This node's view of the request, from its own files (see the module docstring)."""
    require_named_forget_client(cfg)
    spec = cfg.task
    train = load_split(data_path, "train", spec.num_classes, spec.in_channels)
    test = load_split(data_path, "test", spec.num_classes, spec.in_channels)
    return apply_request(cfg, partition_id, cfg["forget-client"], train, test, spec.num_classes)
