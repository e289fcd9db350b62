"""The ``rmu`` train objective RMU registers for the LLM task (``tasks.base``'s llm signature).

A client trains the received adapter with RMU on its forget records; its retain term runs on its own
retained records (the sample scenario's kept authors). A client that leaves with all its data has
none, and trains the forget term alone (``docs/rmu.md`` says why no other data stands in).
"""

from __future__ import annotations

from strategies.rmu.train import model_plan, rmu_update
from tasks.llm.train import qa_batches


def rmu(model, tokenizer, records, *, cfg, conf, seed, epochs, lr, data) -> float:
    forget = qa_batches(records, tokenizer, cfg["llm.batch-size"], seed)
    kept = data.split("retain")
    retain = qa_batches(kept, tokenizer, cfg["llm.batch-size"], seed) if kept else []
    history = rmu_update(model, forget, retain, model_plan(cfg, model), epochs=epochs, lr=lr, seed=seed)
    return history[-1] if history else float("nan")


rmu.wants_client_data = True  # the retain term reads the client's retained records
