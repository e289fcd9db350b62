"""NoT's run-config keys (``not.*``). "NoT: Federated Unlearning via Weight Negation" negates the first
layer by default; the number of refinement rounds is this app's choice (``docs/not.md``)."""

from __future__ import annotations

from core.config import Setting, at_least, finite, setting

SETTINGS: tuple[Setting, ...] = (
    setting("not.layers", str, "first",
            "comma-separated module names of the model whose parameters (weight and bias) are negated, e.g. "
            "'features.1,features.4'; 'first' = the model's first Conv2d/Linear layer (LeNet-5 and the ResNets: "
            "features.1, ViT: features.patch_embed)",
            ((lambda v: any(part.strip() for part in v.split(","))),
             "'first' or module names of the task's model (checked against it)")),
    setting("not.rounds", int, 20, "FedAvg refinement rounds on the retained data after the negation (0 = none)",
            at_least(0)),
    setting("not.lr", float, 0.0, "client lr of the refinement rounds (0 = the run's lr)", finite(0, True)),
)
