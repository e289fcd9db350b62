"""FUSED — "Unlearning through Knowledge Overwriting: Reversible Federated Unlearning via Selective Sparse Adapter".

peft LoRA adapters on a few critical layers (``adapter.py``, the per-model table in ``maths.py``)
are trained by FedAvg on the retained data, base frozen (``client.py``, ``strategy.py``); in class
unlearning the forgotten class is relabelled at random. Remove the adapter to restore. Vision and
text tasks, all three scenarios. Settings: ``settings.py``.
"""

from strategies.fused.settings import SETTINGS, check_settings
from strategies.registry import MethodSpec

METHODS = (
    MethodSpec(
        "fused",
        "peft LoRA unlearning adapters on a few critical layers, trained by FedAvg on the retained data (class "
        "scenario: the forgotten class relabelled at random), base frozen; remove the adapter to restore",
        "strategies.fused.strategy:FUSED",
        paper="Unlearning through Knowledge Overwriting: Reversible Federated Unlearning via Selective Sparse Adapter "
              "(Zhong et al.; `docs/fused.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "text"),
        reversible=True,
        objectives={"fused-overwrite": "strategies.fused.client:overwrite"},
        plugins={"fused-lora": "strategies.fused.adapter:build_plugin"},
        smoke={"fused.rounds": 1},
        check=check_settings,
        style=("#00656b", "p"),
    ),
)
