"""Lethe — "Lethe: Principled Dual-Stream Update for Persistent Knowledge Erasure in Federated Unlearning".

Amplify (a temporary adapter trained by gradient ascent on forget data: ``adapter.py`` and the
client objective ``adapter-ascent`` in ``client.py``) -> layer-wise dual-stream rectification of
the backbone (``maths.py``, driven by ``strategy.py``) -> restore rounds. Runs on the vision and text
tasks (the adapter on the pooled sentence representation) and, without the adapter, on the LLM task
(its measured settings are the ``llm`` preset).
"""

from strategies.lethe.settings import SETTINGS, check_settings
from strategies.registry import MethodSpec

# Measured on the LLM task (docs/llm.md): no adapter (Lethe rectifies the LoRA adapter directly),
# gamma clamped into each layer's bounds, 5 rectification rounds without early stop, 3 FedAvg restore
# rounds; with the vision defaults the retain fact accuracy falls to 0.41.
LLM_PRESET = {"lethe-adapter-steps": 0, "lethe-gamma": 1.0, "lethe-gamma-mode": "clamp", "lethe-rectify-rounds": 5,
              "lethe-restore-rounds": 3, "lethe-restore-mode": "fedavg", "lethe-stop-loss": float("inf")}

METHODS = (
    MethodSpec(
        "lethe",
        "temporary adapter trained by (normalised) gradient ascent → layer-wise dual-stream rectification until the "
        "backbone's forget loss reaches `lethe-stop-loss` → restore rounds that remove the forget direction from the "
        "retain update",
        "strategies.lethe.strategy:Lethe",
        paper="Lethe: Principled Dual-Stream Update for Persistent Knowledge Erasure in Federated Unlearning "
              "(`docs/lethe.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "llm", "text"),
        objectives={"adapter-ascent": "strategies.lethe.client:adapter_ascent"},
        plugins={"lethe-adapter": "strategies.lethe.adapter:build_plugin"},
        presets={"llm": LLM_PRESET},
        smoke={"lethe-rectify-rounds": 1, "lethe-restore-rounds": 1, "lethe-restore-extra-rounds": 0},
        check=check_settings,
    ),
)
