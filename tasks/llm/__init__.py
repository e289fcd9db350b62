"""LLM unlearning task: TOFU-format data (synthetic or local files), a word-level tokenizer, causal
LMs with LoRA adapters, QA fine-tuning, and TOFU / Lethe / FIRM metrics. See docs/llm.md."""
