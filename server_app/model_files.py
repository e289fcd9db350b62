"""The models a run makes, kept as safetensors files under its results folder (``models/``).

Each file holds one model's tensors (no pickle) and, in its metadata, the plug-in specs the weights
belong to (the architecture a reader must build) and what the file is. A reversible method's plug-in
is also written on its own (``models/<plug-in kind>.safetensors``: the tensors under
``plugins.<i>.`` and its spec), so it can be kept apart and removed later: the unlearned model
without it is the original. Every write is atomic; ``results.json`` lists each file with its sha256
(:func:`write_models`), and :func:`read_model` gives back the :class:`ModelState`.
"""

from __future__ import annotations

import json
import os

import torch
from safetensors.torch import load_file, save_file

from core.files import atomic_path, sha256_of
from strategies.common.base import ModelState
from tasks.model import PLUGIN_PREFIX

FOLDER = "models"


def _tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies (safetensors refuses shared or strided storage)."""
    return {key: value.detach().to("cpu").contiguous().clone() for key, value in state.items()}


def write_model(path: str, model: ModelState, what: str) -> dict:
    """Write ``model`` to ``path`` (atomically); ``{"path", "sha256", "tensors"}``."""
    metadata = {"fedunlearn.plugins": json.dumps(model.plugins), "fedunlearn.model": what}
    with atomic_path(path) as tmp:
        save_file(_tensors(model.arrays.to_torch_state_dict()), tmp, metadata=metadata)
    return {"path": path, "sha256": sha256_of(path), "tensors": len(model.arrays.keys())}


def read_model(path: str) -> ModelState:
    """The :class:`ModelState` a :func:`write_model` file holds."""
    from flwr.app import ArrayRecord
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata() or {}
    return ModelState(ArrayRecord(load_file(path)), json.loads(metadata.get("fedunlearn.plugins", "[]")))


def plugin_parts(model: ModelState) -> list[tuple[str, ModelState]]:
    """Each plug-in of ``model`` on its own: ``(kind, the plug-in's tensors and spec)``, in order."""
    state = model.arrays.to_torch_state_dict()
    parts = []
    for index, spec in enumerate(model.plugins):
        prefix = f"{PLUGIN_PREFIX}{index}."
        tensors = {key: value for key, value in state.items() if key.startswith(prefix)}
        if tensors:
            from flwr.app import ArrayRecord

            parts.append((str(spec.get("kind", f"plugin-{index}")), ModelState(ArrayRecord(tensors), [spec])))
    return parts


def write_models(folder: str, models: dict[str, ModelState], reversible: bool) -> dict[str, dict]:
    """Write every model of ``models`` (name -> state) to ``<folder>/models/<name>.safetensors`` and, for
    a reversible method, each plug-in of the unlearned model to ``models/<kind>.safetensors``. Returns
    ``{name: {"path" (relative to folder), "sha256", "tensors"}}``."""
    out_dir = os.path.join(folder, FOLDER)
    os.makedirs(out_dir, exist_ok=True)
    written = {}
    for name, model in models.items():
        written[name] = write_model(os.path.join(out_dir, f"{name}.safetensors"), model, name)
    if reversible and "unlearned" in models:
        for kind, part in plugin_parts(models["unlearned"]):
            written[kind] = write_model(os.path.join(out_dir, f"{kind}.safetensors"), part, f"plug-in {kind}")
    return {name: {**entry, "path": os.path.relpath(entry["path"], folder)} for name, entry in written.items()}


def same_model(a: ModelState, b: ModelState) -> bool:
    """Same plug-ins and bit-identical tensors (what restoring a reversible method must give)."""
    sa, sb = a.arrays.to_torch_state_dict(), b.arrays.to_torch_state_dict()
    return a.plugins == b.plugins and sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def load_state_file(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, or of a weights-only PyTorch state dict (``torch.save`` of
    ``model.state_dict()``); ``ValueError`` with one line where it is neither."""
    try:
        if path.endswith(".safetensors"):
            state = load_file(path)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is one line, never a traceback
        raise ValueError(f"cannot be read as safetensors or a weights-only state dict: {str(err).splitlines()[0]}") \
            from None
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ValueError("holds no state dict (a mapping of parameter names to tensors)")
    return state


def match_state(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the task model's keys and dtypes (``expected``); ``ValueError`` with one line naming
    the missing and unexpected keys and the first shapes that differ."""
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    shapes = [f"{k} {tuple(state[k].shape)} in the file, {tuple(v.shape)} in the task's model"
              for k, v in expected.items() if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = [f"{label} {', '.join(names[:3])}{' …' if len(names) > 3 else ''} ({len(names)})"
                for label, names in (("missing", missing), ("unexpected", unexpected)) if names]
    problems += [f"shape of {shapes[0]}" + (f" (and {len(shapes) - 1} more)" if len(shapes) > 1 else "")] if shapes else []
    if problems:
        raise ValueError("is not a model of this task: " + "; ".join(problems))
    return {k: state[k].to(v.dtype) for k, v in expected.items()}
