"""FUSED's pure rules on tensors: which layers get adapters, the relabelling, merging and removing.

- :data:`DEFAULT_LAYERS` / :func:`target_layers`: the adapted layers per architecture. The paper
  finds them by critical-layer identification (the layers whose weights move most, in Manhattan
  distance, in one round of local training) and its public code hard-codes the result per model:
  LeNet ``conv1`` + ``fc3``; ResNet-18 ``layer4.0.conv2``, ``layer4.1.conv1``, ``layer4.1.conv2``,
  ``fc``. This project's names for those layers are the table below. ResNet-34 (the paper runs
  ResNet-18 on CIFAR-100) takes the same places counted from the end of ``layer4``; the ViT (the
  paper: "the last several layers of the Transformer") its last two encoder layers' MLP and the head;
  the text models (MiniLM, BERT) by the same rule the feed-forward of the last trained encoder layer
  (``{last}``, resolved on the model: ``text.train-layers`` sets how many there are) and the head.
- :func:`layer_sensitivity` / :func:`critical_layers`: that identification, for ``fused.layers='cli'``.
- :func:`relabel_forgotten`: class unlearning overwrites the forgotten class — its samples are
  trained with a label drawn uniformly from the other classes (the public code's relabelling).
- :func:`merge_adapter`: the server's rule after each FedAvg of the adapters: the frozen base and
  the new adapter, the base tensors untouched. :func:`remove_adapter`: restore.
"""

from __future__ import annotations

import torch

from tasks.model import PLUGIN_PREFIX

DEFAULT_LAYERS: dict[str, tuple[str, ...]] = {
    "lenet5": ("features.1", "head"),
    "resnet18": ("features.7.0.conv2", "features.7.1.conv1", "features.7.1.conv2", "head"),
    "resnet34": ("features.7.1.conv2", "features.7.2.conv1", "features.7.2.conv2", "head"),
    "vit": ("features.encoder.layers.4.linear1", "features.encoder.layers.4.linear2",
            "features.encoder.layers.5.linear1", "features.encoder.layers.5.linear2", "head"),
    "minilm": ("features.layers.{last}.intermediate.dense", "features.layers.{last}.output.dense", "head"),
    "bert": ("features.layers.{last}.intermediate.dense", "features.layers.{last}.output.dense", "head"),
}


def _last_resolved(name: str, model: torch.nn.Module) -> str:
    """``name`` with ``{last}`` replaced by the index of the last block of the list it follows."""
    if "{last}" not in name:
        return name
    container = name.partition(".{last}")[0]
    blocks = len(dict(model.named_modules()).get(container, ()))
    if blocks == 0:
        raise ValueError(f"run-config 'fused.layers'='auto' adapts the last block of {container!r}, and the model "
                         "trains none (text.train-layers=0): name its layers (comma-separated module names)")
    return name.replace("{last}", str(blocks - 1))


def target_layers(arch: str, setting: str, model: torch.nn.Module) -> list[str]:
    """The layers of ``arch`` that get adapters: ``auto`` = :data:`DEFAULT_LAYERS` (``{last}`` resolved on
    ``model``), else the comma-separated module names of ``fused.layers`` (checked against the model when it
    is built); ``cli`` is chosen by a round of identification instead (``strategies.fused.strategy``)."""
    if setting.strip() == "auto":
        if arch not in DEFAULT_LAYERS:
            raise ValueError(f"run-config 'fused.layers'='auto' has no table for model {arch!r}: "
                             f"name its layers (comma-separated module names)")
        return [_last_resolved(name, model) for name in DEFAULT_LAYERS[arch]]
    return [name.strip() for name in setting.split(",") if name.strip()]


def layer_sensitivity(start: dict[str, torch.Tensor], client_states: list[dict[str, torch.Tensor]],
                      weights: list[int], layers: list[str]) -> dict[str, float]:
    """The paper's ``Diff_l``: per layer, the data-size-weighted mean over clients of the Manhattan
    distance between the client's trained parameters of that layer and the distributed ones."""
    if not client_states or len(client_states) != len(weights) or sum(weights) <= 0:
        raise ValueError("layer sensitivity needs one state per client and a positive total weight")
    total = float(sum(weights))
    diff = {}
    for layer in layers:
        keys = [k for k in start if k.rpartition(".")[0] == layer]
        if not keys:
            raise ValueError(f"layer {layer!r} has no parameters in the distributed model")
        diff[layer] = sum(w / total * sum(float((state[k].double() - start[k].double()).abs().sum()) for k in keys)
                          for state, w in zip(client_states, weights))
    return diff


def critical_layers(sensitivity: dict[str, float], count: int) -> list[str]:
    """The ``count`` most sensitive layers (the first ``K`` of the paper's list ``LS``), in model order."""
    if not 1 <= count <= len(sensitivity):
        raise ValueError(f"run-config 'fused.cli-layers'={count} is not allowed: must be in 1..{len(sensitivity)}")
    ranked = sorted(sensitivity, key=lambda layer: -sensitivity[layer])[:count]
    return [layer for layer in sensitivity if layer in ranked]


def relabel_forgotten(y: torch.Tensor, forget_class: int, num_classes: int,
                      generator: torch.Generator) -> torch.Tensor:
    """``y`` with every ``forget_class`` label replaced by one drawn uniformly from the other classes."""
    if num_classes < 2:
        raise ValueError(f"relabelling needs at least 2 classes, got {num_classes}")
    if not 0 <= forget_class < num_classes:
        raise ValueError(f"forget class {forget_class} is outside 0..{num_classes - 1}")
    mask = y == forget_class
    draws = torch.randint(0, num_classes - 1, (int(mask.sum()),), generator=generator)
    out = y.clone()
    out[mask] = draws + (draws >= forget_class).to(draws.dtype)  # skip the forgotten class
    return out


def adapter_prefix(index: int) -> str:
    return f"{PLUGIN_PREFIX}{index}."


def merge_adapter(state: dict[str, torch.Tensor], adapter: dict[str, torch.Tensor],
                  index: int) -> dict[str, torch.Tensor]:
    """``state`` with the adapter of plug-in ``index`` replaced by ``adapter`` (its keys only)."""
    prefix = adapter_prefix(index)
    foreign = sorted(k for k in adapter if not k.startswith(prefix))
    if foreign:
        raise ValueError(f"the aggregated adapter holds keys outside plug-in {index}: {', '.join(foreign[:3])}")
    missing = sorted(k for k in state if k.startswith(prefix) and k not in adapter)
    if missing:
        raise ValueError(f"the aggregated adapter lacks {len(missing)} tensor(s), first {missing[0]!r}")
    return {**state, **adapter}


def remove_adapter(state: dict[str, torch.Tensor], index: int) -> dict[str, torch.Tensor]:
    """``state`` without plug-in ``index``: the model the adapter was added to."""
    prefix = adapter_prefix(index)
    return {k: v for k, v in state.items() if not k.startswith(prefix)}
