"""Lethe — "Lethe: Principled Dual-Stream Update for Persistent Knowledge Erasure in Federated Unlearning".

Amplify (a temporary adapter trained by gradient ascent on forget data: ``adapter.py`` and the
client objective ``adapter-ascent`` in ``client.py``) -> layer-wise dual-stream rectification of
the backbone (``maths.py``, driven by ``strategy.py``) -> restore rounds. Runs on the vision and text
tasks (the adapter on the pooled sentence representation) and, without the adapter, on the LLM task
(the paper's NLP setting, the ``llm`` preset).
"""

from strategies.lethe.settings import SETTINGS, check_settings
from strategies.registry import MethodSpec

# The paper runs its NLP experiments without the temporary adapter, and the LLM task has no plug-in
# point: Lethe rectifies the LoRA adapter directly there.
LLM_PRESET = {"lethe.adapter-steps": 0}

METHODS = (
    MethodSpec(
        "lethe",
        "temporary adapter trained by gradient ascent → T rounds of layer-wise dual-stream rectification (eq. 10) → "
        "R FedAvg restore rounds on the retained clients; `recipe='lethe-robust'` adds the project's guards",
        "strategies.lethe.strategy:Lethe",
        paper="Lethe: Principled Dual-Stream Update for Persistent Knowledge Erasure in Federated Unlearning "
              "(`docs/lethe.md`)",
        settings=SETTINGS,
        task_kinds=("vision", "llm", "text"),
        objectives={"adapter-ascent": "strategies.lethe.client:adapter_ascent"},
        plugins={"lethe-adapter": "strategies.lethe.adapter:build_plugin"},
        presets={"llm": LLM_PRESET},
        smoke={"lethe.rectify-rounds": 1, "lethe.restore-rounds": 1, "guard.restore-extra-rounds": 0},
        check=check_settings,
        style=("#1f5fd6", "o"),
    ),
)
