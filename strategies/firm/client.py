"""A FIRM client's one-shot release (the FIRM paper, Sec. 4.1 and App. C), without Flower.

``firm_release`` takes the broadcast reference model (a peft LoRA model whose adapter is still at its
reference values), trains the adapter on the client's own data with the role's objective, and returns
what the client uploads once:

    task_vector   {adapted weight name: s (B A)_after - s (B A)_reference}    (``strategies.firm.fisher``)
    fisher        {same names: empirical diagonal Fisher at the reference weights, on the same data}
    num_examples  number of sequences the client trained on

Objectives: forget clients ``ascent`` (gradient ascent, FIRM's TOFU/MUSE clients) or ``rmu`` (the ``rmu``
method's update with its forget term only, FIRM's WMDP clients: ``strategies.rmu.train``); retain
clients ``ce`` (the preservation objective).

Choices (the paper is silent or our setting differs):

* The Fisher is computed *before* training, so it is taken at the reference weights whatever the
  objective does to the adapter. In the default weight space ``strategies.firm.fisher`` evaluates it with the
  adapter switched off, which is the reference model only when the adapter is fresh (B = 0, as
  ``build_llm`` makes it): knowledge of the reference model must live in its base weights (merge a
  pretrained adapter with peft's ``merge_and_unload`` and attach a fresh one). A non-zero reference
  adapter is refused in weight space. ``space="lora"`` takes the Fisher with the adapter on instead.
* Fisher data: the client's own batches, ``fisher_batches`` single sequences in data order (App. C: 20).
* RMU's steered layer, updated layers and c are the ``rmu`` method's (``rmu.*``, scaled to the model
  by ``strategies.rmu.settings``): the down-projections of layers 5-7 on the paper's 7B models.

``adapter_release`` is what a client of the federation sends in reply to ``query.fisher``: there the
original model is the base weights plus the trained federated adapter, so the release is taken in the
LoRA space of that adapter (``space="lora"``; its B is not zero, so both A and B have a Fisher) and
keyed like ``tasks.llm.model.adapter_state``, the names the federation's model state uses. The server
adds the merged update to the original adapter and gets an ordinary adapter back (docs/firm.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from strategies.firm.fisher import (
    SPACES,
    adapted_weight_names,
    diagonal_fisher,
    lora_state,
    task_vector,
)
from strategies.objectives.losses import make_objective
from strategies.rmu.settings import RMUPlan
from tasks.llm.model import adapter_keys
from tasks.llm.train import finetune

OBJECTIVES_BY_ROLE = {"forget": ("ascent", "rmu"), "retain": ("ce",)}


def _check(role: str, objective: str, space: str, epochs: int, fisher_batches: int) -> None:
    if role not in OBJECTIVES_BY_ROLE:
        raise ValueError(f"role must be one of {list(OBJECTIVES_BY_ROLE)}, got {role!r}")
    if objective not in OBJECTIVES_BY_ROLE[role]:
        raise ValueError(f"objective for a {role} client must be one of {list(OBJECTIVES_BY_ROLE[role])}, "
                         f"got {objective!r}")
    if space not in SPACES:
        raise ValueError(f"space must be one of {list(SPACES)}, got {space!r}")
    if not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an int >= 1, got {epochs!r}")
    if not isinstance(fisher_batches, int) or fisher_batches < 1:
        raise ValueError(f"fisher_batches must be an int >= 1, got {fisher_batches!r}")


def firm_release(
    model,
    reference_state: dict[str, torch.Tensor] | None,
    batches: Sequence[dict[str, torch.Tensor]],
    *,
    role: str,
    objective: str,
    epochs: int,
    lr: float,
    seed: int,
    fisher_batches: int = 20,
    space: str = "weight",
    fisher_model=None,
    rmu: RMUPlan | None = None,
) -> dict:
    """Train the adapter of ``model`` in place and return ``{task_vector, fisher, num_examples}``.

    ``reference_state`` is ``strategies.firm.fisher.lora_state(model)`` at the reference (``None``: taken
    now). ``batches`` are the client's QA batches (``tasks.llm.train.qa_batches``). ``fisher_model`` is
    the model the Fisher is taken on (``None``: ``model``); for a 4-bit ``model`` pass its full-precision
    copy carrying the same adapter (``strategies.firm.fisher.fisher_reference_model``), as the paper does.
    ``rmu``: the RMU plan of objective ``rmu`` (``None``: the ``rmu.*`` defaults on this model and ``seed``).
    The upload's tensors are float32 on the CPU and share names and shapes (``space``).
    """
    _check(role, objective, space, epochs, fisher_batches)
    if not batches:
        raise ValueError("batches must not be empty")
    if reference_state is None:
        reference_state = lora_state(model)
    if space == "weight":
        nonzero = [n for n, t in reference_state.items() if "lora_B" in n and bool(t.any())]
        if nonzero:
            raise ValueError(f"reference adapter is not fresh ({nonzero[0]!r} != 0): the weight-space Fisher "
                             "is taken with the adapter off; merge it into the base first")
    fisher_model = model if fisher_model is None else fisher_model
    names = adapted_weight_names(model) if space == "weight" and fisher_model is not model else None
    fisher = diagonal_fisher(fisher_model, batches, num_batches=fisher_batches, space=space, names=names)
    if objective == "rmu":
        from strategies.rmu.train import default_plan, rmu_update

        rmu_update(model, batches, [], rmu or default_plan(model, seed), epochs=epochs, lr=lr, seed=seed)
    else:
        finetune(model, batches, epochs, lr, seed, loss_fn=make_objective(objective))
    update = task_vector(model, reference_state, space=space)
    return {
        "task_vector": update,
        "fisher": fisher,
        "num_examples": sum(int(b["input_ids"].shape[0]) for b in batches),
    }


def adapter_release(model, batches: Sequence[dict[str, torch.Tensor]], **settings) -> dict:
    """``firm_release`` of the adapter as loaded (the reference), in its LoRA space, with the task vector
    and Fisher keyed like ``adapter_state(model)``. ``settings``: ``firm_release``'s keyword arguments
    except ``space``."""
    upload = firm_release(model, None, batches, space="lora", **settings)
    keys = adapter_keys(model)
    renamed = {part: {keys[name]: tensor for name, tensor in upload[part].items()}
               for part in ("task_vector", "fisher")}
    return {**renamed, "num_examples": upload["num_examples"]}


def fisher_query(task, cfg, data, model, conf: dict, seed: int) -> dict:
    """The registered ``query.fisher`` handler: the release of the received (original) adapter on the
    records of ``role`` — the task vector after ``objective`` training and the diagonal Fisher at the
    received adapter (LoRA space; on a 4-bit model, on its full-precision twin with the same adapter,
    as the paper does). The seed is ``train``'s, so a forget client's ``ascent`` task vector is
    exactly the update ``ga`` gets."""
    from strategies.firm.fisher import fisher_reference_model
    from tasks.llm.federation_model import full_precision_twin
    from tasks.llm.train import qa_batches
    from tasks.training import device_for

    _, tokenizer = task.llm(cfg)
    from strategies.rmu.train import model_plan

    role, objective = str(conf["role"]), str(conf["objective"])
    batches = qa_batches(data.split(role), tokenizer, cfg["llm.batch-size"], seed)
    twin = fisher_reference_model(model, load_full_precision=lambda: full_precision_twin(cfg, model, device_for()))
    rmu = model_plan(cfg, model) if objective == "rmu" else None
    upload = adapter_release(model, batches, role=role, objective=objective, rmu=rmu,
                             epochs=int(conf["llm-epochs"]), lr=float(conf["llm.lr"]), seed=seed,
                             fisher_batches=int(conf["fisher-batches"]), fisher_model=twin)
    return {"task-vector": upload["task_vector"], "fisher": upload["fisher"],
            "metrics": {"num-examples": upload["num_examples"]}}
