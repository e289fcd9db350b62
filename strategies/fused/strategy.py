"""FUSED ("Unlearning through Knowledge Overwriting: Reversible Federated Unlearning via Selective
Sparse Adapter", Zhong et al.) as a method.

1. The server appends a ``fused-lora`` plug-in to the original model: peft LoRA (``fused.rank``,
   ``fused.alpha``, ``fused.dropout``) on the layers of ``fused.layers`` (``strategies.fused.adapter``,
   the per-model table in ``strategies.fused.maths``); its ``B`` starts at zero, so the model starts
   as the original.
2. ``fused.rounds`` FedAvg rounds train the adapters only (objective ``fused-overwrite``,
   ``strategies.fused.client``) on the retained data: client and sample unlearning — every client
   with retained data on it (the leaving client has none; the sample client keeps its clean
   samples, as the public code drops the backdoored ones); class unlearning — every client on all
   its data with the forgotten class relabelled at random (``relabel``), the paper's knowledge
   overwriting. Clients upload the adapter; the server averages it (Flower's FedAvg, weighted by
   examples) and merges it into the frozen base (:func:`strategies.fused.maths.merge_adapter`).
3. ``restore`` removes the adapter: the original model, bit for bit.

Choices where the paper is silent or does not fit: clients keep no state between messages here,
so every round sends the whole model down (base + adapter) while only the adapter comes back up;
the paper counts only the adapter both ways. Its LoRA (r 16, alpha 32, dropout 0.1) is dense on
each layer, as in its public code, although the paper's text speaks of a randomly sparsified matrix.
The critical layers come from the table (the public code's outcome of its layer identification)
unless ``fused.layers='cli'``: then one round of ordinary local training (the whole model, the
adapters' clients, data, epochs and learning rate) from the original model ranks the layers by
the paper's ``Diff_l`` (:func:`strategies.fused.maths.layer_sensitivity`) and the
``fused.cli-layers`` most sensitive Linear / Conv2d layers get adapters; that round's whole-model
uploads are charged to the unlearn phase.
"""

from __future__ import annotations

from flwr.app import ArrayRecord, ConfigRecord

from strategies.common.base import (
    ModelState,
    UnlearnContext,
    UnlearningMethod,
    UnlearnResult,
)
from strategies.common.fedavg_rounds import RoleFedAvg, run_rounds
from strategies.common.federation import RunStopped
from strategies.fused.adapter import ADAPTABLE, ADAPTER_KIND
from strategies.fused.maths import (
    DEFAULT_LAYERS,
    adapter_prefix,
    critical_layers,
    layer_sensitivity,
    merge_adapter,
    remove_adapter,
    target_layers,
)
from tasks.plugins import specs_to_json


class AdapterFedAvg(RoleFedAvg):
    """FedAvg of the uploaded adapters, merged into the frozen base after every round."""

    def __init__(self, fed, role: str, base: dict, index: int, *, fraction_train: float, seed: int):
        super().__init__(fed, role, fraction_train=fraction_train, seed=seed)
        self.base, self.index = base, index

    def aggregate_train(self, server_round, replies):
        arrays, metrics = super().aggregate_train(server_round, replies)
        if arrays is None:
            return None, metrics
        return ArrayRecord(merge_adapter(self.base, arrays.to_torch_state_dict(), self.index)), metrics


class FUSED(UnlearningMethod):
    """``fused``: LoRA unlearning adapters trained by FedAvg on retained data; reversible."""

    name = "fused"
    reversible = True

    def identify(self, ctx: UnlearnContext, role: str) -> tuple[list[str], dict[str, float]]:
        """Critical-layer identification: one round of local training, layers ranked by ``Diff_l``."""
        cfg, fed = ctx.cfg, ctx.fed
        layers = [n for n, m in cfg.task.model_outline(cfg).named_modules() if isinstance(m, ADAPTABLE)]
        count = cfg["fused.cli-layers"] or len(DEFAULT_LAYERS[cfg.task.arch])
        strategy = RoleFedAvg(fed, role, fraction_train=cfg["fraction-train"], seed=cfg["seed"] + 4)
        config = ConfigRecord({"epochs": cfg["fused.epochs"], "lr": cfg["fused.lr"]})
        replies = fed.exchange(list(strategy.configure_train(1, ctx.original.arrays, config, fed.grid)), round_no=1)
        fed.cost(fed.phase).rounds += 1
        sensitivity = layer_sensitivity(ctx.original.arrays.to_torch_state_dict(),
                                        [r.content["arrays"].to_torch_state_dict() for r in replies],
                                        [int(r.content["metrics"]["num-examples"]) for r in replies], layers)
        return critical_layers(sensitivity, count), sensitivity

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg, fed = ctx.cfg, ctx.fed
        class_request = cfg["scenario"] == "class"
        role = "all" if class_request else "retain"
        sensitivity = None
        if cfg["fused.layers"].strip() == "cli":
            targets, sensitivity = self.identify(ctx, role)
        else:
            targets = target_layers(cfg.task.arch, cfg["fused.layers"], cfg.task.model_outline(cfg))
        spec = {"kind": ADAPTER_KIND, "targets": targets, "r": cfg["fused.rank"], "alpha": cfg["fused.alpha"],
                "dropout": cfg["fused.dropout"], "seed": cfg["seed"]}
        if ctx.original.plugins:
            raise RunStopped(f"phase 'unlearn': fused adds its adapter to a model without plug-ins, but the original "
                             f"carries {len(ctx.original.plugins)} (scope 'plugins' would train them too)")
        plugins, index = [spec], 0
        fresh = ctx.model_factory(plugins).state_dict()
        adapter = {k: v for k, v in fresh.items() if k.startswith(adapter_prefix(index))}
        start = {**ctx.original.arrays.to_torch_state_dict(), **adapter}
        strategy = AdapterFedAvg(fed, role, start, index, fraction_train=cfg["fraction-train"], seed=cfg["seed"] + 5)
        config = ConfigRecord({"objective": "fused-overwrite", "scope": "plugins", "plugins": specs_to_json(plugins),
                               "epochs": cfg["fused.epochs"], "lr": cfg["fused.lr"], "relabel": class_request})
        arrays = run_rounds(fed, strategy, ArrayRecord(start), rounds=cfg["fused.rounds"], config=config,
                            label="fused adapters", method=self.name)
        details = {"layers": targets, "adapter_parameters": sum(v.numel() for v in adapter.values()),
                   "model_parameters": sum(v.numel() for k, v in start.items() if k not in adapter),
                   "role": role, "relabel": class_request, "rounds": cfg["fused.rounds"],
                   "layer_sensitivity": sensitivity}
        return UnlearnResult(ModelState(arrays, plugins), details)

    def restore(self, unlearned: ModelState, ctx: UnlearnContext) -> ModelState:
        """Remove the adapter this request added (the last plug-in): the model it started from."""
        state = remove_adapter(unlearned.arrays.to_torch_state_dict(), len(unlearned.plugins) - 1)
        return ModelState(ArrayRecord(state), unlearned.plugins[:-1])
