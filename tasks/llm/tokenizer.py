"""A word-level tokenizer for the offline tiny model, built with the `tokenizers` library.

Why word-level: a byte-level tokenizer spends ~100 tokens on one QA pair and the tiny model then
needs ~100 epochs to memorise 400 pairs; with one token per word (and per punctuation mark) a pair is
~15 tokens and a fact is one to three tokens, so memorising is short and cheap.

The vocabulary is the sorted set of words in the training texts (after the ``Whitespace``
pre-tokenizer, which splits on spaces and separates punctuation), preceded by the special tokens
``[PAD]`` (id 0), ``[BOS]``, ``[EOS]``, ``[UNK]``. Sorting makes it depend only on the set of words,
not on their order or frequency, so the same texts always give the same ids. Nothing is downloaded.
Decoding joins tokens with single spaces ("Born in Lokaver Vale ."), which is what metrics compare.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from tasks.llm import synthetic

SPECIAL_TOKENS = ("[PAD]", "[BOS]", "[EOS]", "[UNK]")


def word_tokenizer(texts: Iterable[str]) -> PreTrainedTokenizerFast:
    """A word-level ``PreTrainedTokenizerFast`` whose vocabulary is every word in ``texts``."""
    pre_tokenizer = pre_tokenizers.Whitespace()
    words = {word for text in texts for word, _ in pre_tokenizer.pre_tokenize_str(text)}
    if not words:
        raise ValueError("texts must contain at least one word to build a tokenizer")
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    for word in sorted(words - set(SPECIAL_TOKENS)):
        vocab[word] = len(vocab)
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="[PAD]", bos_token="[BOS]",
                                   eos_token="[EOS]", unk_token="[UNK]")


def synthetic_tokenizer() -> PreTrainedTokenizerFast:
    """The word-level tokenizer covering every word `tasks.llm.synthetic` can generate, plus the
    prompt words of `tasks.llm.train.format_prompt`."""
    return word_tokenizer(synthetic.vocabulary_texts() + ["Question : Answer :"])
