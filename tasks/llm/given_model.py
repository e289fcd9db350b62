"""The LLM task's ``original-model``: a PEFT adapter folder or a merged Hugging Face model folder.

* **Adapter folder** (``adapter_config.json`` + ``adapter_model.safetensors``, what PEFT's
  ``save_pretrained`` writes): a LoRA adapter trained on the run's base model (``llm.model``). Its
  rank, alpha and target modules must be the run's (``llm.lora-rank``, ``llm.lora-alpha``,
  ``llm.target-modules``) and its tensors the run's adapter keys and shapes; the original is that
  adapter, and the retrain oracle starts, as always, from a fresh adapter on the same base.
* **Merged model folder** (``config.json`` + weights, what ``merge_and_unload().save_pretrained``
  writes): the whole trained model. It becomes the run's base model on every node (in place of
  ``llm.model``; a SuperNode reads it at the same path) and the original is that base with a fresh
  adapter (LoRA ``B = 0``: exactly the merged model's outputs). Its weights hold the knowledge to
  forget, so no retrain oracle can start from them: such a run needs ``retrain-oracle=false``.

A folder's sha256 is ``core.files.folder_sha256``: a combined hash of every file in it.
"""

from __future__ import annotations

import json
import os

from core.files import folder_sha256

ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def folder_kind(path: str) -> str:
    """``"adapter"`` or ``"merged"``; ``ValueError`` (one line) for a folder that is neither."""
    if not os.path.isdir(path):
        raise ValueError("is not a folder: the LLM task takes a PEFT adapter folder or a merged Hugging Face "
                         "model folder")
    if all(os.path.isfile(os.path.join(path, name)) for name in ADAPTER_FILES):
        return "adapter"
    if os.path.isfile(os.path.join(path, "config.json")):
        return "merged"
    raise ValueError(f"holds neither {' + '.join(ADAPTER_FILES)} (a PEFT adapter) nor config.json (a merged "
                     "Hugging Face model)")


def given_base(cfg) -> str | None:
    """The merged model folder that replaces ``llm.model`` as the run's base, or None."""
    path = cfg["original-model"]
    if not path:
        return None
    path = os.path.abspath(os.path.expanduser(path))
    return path if os.path.isdir(path) and folder_kind(path) == "merged" else None


def check_adapter_config(cfg, path: str) -> None:
    """The adapter's LoRA settings against the run's; ``ValueError`` naming the first that differs."""
    from tasks.llm.federation_model import target_modules

    with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as handle:
        config = json.load(handle)
    theirs = {"llm.lora-rank": config.get("r"), "llm.lora-alpha": config.get("lora_alpha"),
              "llm.target-modules": sorted(config.get("target_modules") or [])}
    ours = {"llm.lora-rank": cfg["llm.lora-rank"], "llm.lora-alpha": cfg["llm.lora-alpha"],
            "llm.target-modules": sorted(target_modules(cfg))}
    for key, value in ours.items():
        given = theirs[key]
        numeric = key != "llm.target-modules" and given is not None  # rank 8 and alpha 16.0 match 8 and 16
        if (float(given) != float(value)) if numeric else given != value:
            raise ValueError(f"is an adapter with {key} {given!r}, the run's {key} is {value!r}")


def read_given(cfg, path: str) -> tuple[dict | None, str]:
    """The original's adapter tensors as the folder holds them (None for a merged folder: the run's
    fresh adapter on that base is the original) and the folder's sha256; ``ValueError`` in one line."""
    from safetensors.torch import load_file

    if folder_kind(path) == "merged":
        return None, folder_sha256(path)
    check_adapter_config(cfg, path)
    try:
        state = load_file(os.path.join(path, "adapter_model.safetensors"))
    except Exception as err:  # noqa: BLE001 - an unreadable file is one line, never a traceback
        raise ValueError(f"adapter_model.safetensors cannot be read: {str(err).splitlines()[0]}") from None
    return state, folder_sha256(path)
