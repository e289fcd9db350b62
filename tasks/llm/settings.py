"""Settings shared by the LLM tasks (``llm.*``): model, LoRA, data, local training, evaluation."""

from __future__ import annotations

from core.config import Setting, at_least, in_range, open_unit, positive, setting

LLM_SETTINGS: tuple[Setting, ...] = (
    setting("llm.model", str, "tiny", "'tiny' (a small Llama built from config, offline) or a local HF model folder"),
    setting("llm.data-dir", str, "", "folder of TOFU files (full.json, *_perturbed.json ...); empty = synthetic authors"),
    setting("llm.num-authors", int, 20, "synthetic fictitious authors (offline data)", positive()),
    setting("llm.qa-per-author", int, 10, "synthetic QA pairs per author", in_range(1, 20, "in 1..20")),
    setting("llm.forget-fraction", float, 0.1, "share of authors forgotten in the sample scenario", open_unit(True)),
    setting("llm.lora-rank", int, 16, "LoRA rank r", positive()),
    setting("llm.lora-alpha", float, 32.0, "LoRA scaling alpha (update = alpha/r * B A)", positive()),
    setting("llm.target-modules", str, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
        "comma-separated linear modules that get LoRA adapters"),
    setting("llm.load-in-4bit", bool, False, "load the base model in 4-bit NF4 (bitsandbytes, CUDA only)"),
    setting("llm.local-epochs", int, 3, "local epochs per LLM training round (pretrain, retrain, continue, Lethe)",
        positive()),
    setting("llm.lr", float, 5e-3, "local AdamW learning rate of the LoRA adapter", positive()),
    setting("llm.batch-size", int, 16, "local mini-batch size (QA pairs)", positive()),
    setting("llm.unlearn-epochs", int, 3,
        "epochs of the one-round ga/npo/simnpo unlearning on forget clients and of every FIRM/merge client release",
        positive()),
    setting("llm.unlearn-lr", float, 1e-3, "learning rate of the ga/npo/simnpo unlearning and of the FIRM/merge releases",
        positive()),
    setting("llm.max-new-tokens", int, 0, "greedy tokens generated per answer when evaluating; 0 = by data source "
        "(200 on TOFU files as TOFU/open-unlearning, 16 on synthetic authors)", at_least(0)),
    setting("llm.eval-batch-size", int, 32, "evaluation batch size", positive()),
    setting("llm.forget-domains", str, "bio,cyber",
        "llm-wmdp: comma-separated forget domains, each read from wmdp-<domain>/test (cais/wmdp) in llm.data-dir (or synthetic)"),
    setting("llm.retain-size", int, 600, "llm-wmdp / llm-tofu-forget01: questions (MMLU) or QA pairs (retain90) "
        "the one retain client trains on, drawn with the seed", positive()),
    setting("llm.synthetic-size", int, 40, "llm-wmdp / llm-muse / llm-tofu-forget01 offline data: multiple-choice "
        "questions per synthetic domain and in the synthetic MMLU-style utility set", positive()),
)
