"""Offline stand-ins for the WMDP / MMLU and MUSE-Books files, as the rows those files hold.

The LLM benchmark tasks (``llm-wmdp``, ``llm-muse``) read named tables (``tasks.llm.benchmark_files``);
without ``llm.data-dir`` they read these generated tables instead, row for row in the public files'
columns, so both paths go through the same code (the tests save them as the files a
``llm.data-dir`` holds and read them back through the loaders: ``tests/benchmark_tables.py``).

Every word comes from ``tasks.llm.synthetic``'s vocabulary, so the offline tiny model's word-level
tokenizer never meets an unknown word. The tiny model knows nothing beyond what it is trained on:
a synthetic domain is a set of invented facts asked as four-option questions.

* Multiple choice (WMDP ``wmdp-<domain>``, MMLU ``mmlu``): ``{question, choices (4), answer (index)}``.
  Each table asks one kind of question about invented entities (two invented words), the answer
  and three distinct distractors drawn from that kind's pool; domain ``i`` of the run uses kind
  ``i mod 3`` and the utility set its own kind, so domains and utility never share a question.
* MUSE-Books: invented authors' facts (``synthetic.fictitious_authors``) written as passages of two
  sentence pairs ``"<question> <answer> <question> <answer>"``; the first half of the authors make
  the forget book, the rest the retain book, as many further authors the holdout book
  (``raw/forget``, ``raw/retain1``, ``raw/holdout``: ``{text}``). ``knowmem/forget_qa`` and
  ``knowmem/retain_qa`` (``{question, answer}``) ask each passage's first question;
  ``verbmem/forget`` (``{prompt, gt}``) splits each forget passage after its first sentence.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tasks.llm import synthetic

_FAMILIES = (
    ("What is the job of {entity}?", synthetic._PROFESSIONS),
    ("Which genre does {entity} write in?", synthetic._GENRES),
    ("What hobby does {entity} have?", synthetic._HOBBIES),
)
_UTILITY = ("Who wrote The {title}?", None)  # choices: invented people
CHOICES = 4


def _people(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = f"{rng.choice(synthetic.MADE_UP_WORDS)} {rng.choice(synthetic.MADE_UP_WORDS)}"
        if name not in names:
            names.append(name)
    return names


def multiple_choice_rows(count: int, family: int | None, seed: int) -> list[dict]:
    """``count`` four-option questions of kind ``family`` (None: the utility kind), each about a
    distinct invented entity (module docstring)."""
    rng = random.Random(seed)
    template, pool = _UTILITY if family is None else _FAMILIES[family % len(_FAMILIES)]
    rows = []
    subjects = _people(rng, count)
    for index, subject in enumerate(subjects):
        options = list(pool) if pool else _people(rng, CHOICES + 3)
        picked = rng.sample(options, CHOICES)
        if pool is None:
            title = f"{synthetic._TITLE_ADJECTIVES[index % 16]} {synthetic._TITLE_NOUNS[(index // 16) % 16]}"
            question = template.format(title=f"{title} of {subject}")
        else:
            question = template.format(entity=subject)
        answer = rng.randrange(CHOICES)
        rows.append({"question": question, "choices": picked, "answer": answer})
    return rows


def wmdp_tables(domains: Sequence[str], count: int, seed: int) -> dict[str, list[dict]]:
    """``wmdp-<domain>`` for each domain and ``mmlu``, ``count`` questions each."""
    tables = {f"wmdp-{name}": multiple_choice_rows(count, i, seed + 101 * (i + 1)) for i, name in enumerate(domains)}
    tables["mmlu"] = multiple_choice_rows(count, None, seed)
    return tables


def first_sentence_split(text: str, max_words: int = 32) -> tuple[str, str]:
    """``(prompt, continuation)`` of a passage: the prompt ends after the first ``?``, ``.`` or ``!``
    that ends a word, at most ``max_words`` words; the continuation is the rest."""
    words = text.split()
    for i, word in enumerate(words[:max_words]):
        if word[-1:] in "?.!":
            return " ".join(words[:i + 1]), " ".join(words[i + 1:])
    return " ".join(words[:max_words]), " ".join(words[max_words:])


def _passages(records: list[dict]) -> list[dict]:
    """An author's facts as passages of two sentence pairs, with the passage's first QA pair."""
    out = []
    for start in range(0, len(records), 2):
        pair = records[start:start + 2]
        text = " ".join(f"{r['question']} {r['answer']}" for r in pair)
        out.append({"text": text, "question": pair[0]["question"], "answer": pair[0]["answer"]})
    return out


def muse_tables(num_authors: int, qa_per_author: int, utility_size: int, seed: int) -> dict[str, list[dict]]:
    """The MUSE-Books tables of the module docstring, plus the ``mmlu`` utility set."""
    if num_authors < 2:
        raise ValueError(f"llm.num-authors must be >= 2 for llm-muse (a forget and a retain book), got {num_authors}")
    records = synthetic.fictitious_authors(num_authors, qa_per_author, seed=seed)
    authors = list(dict.fromkeys(r["author"] for r in records))
    forget_authors = set(authors[:(len(authors) + 1) // 2])
    holdout = synthetic.holdout_authors(len(forget_authors), qa_per_author, exclude=authors, seed=seed)

    def book(rows):
        by_author: dict[str, list[dict]] = {}
        for r in rows:
            by_author.setdefault(r["author"], []).append(r)
        return [p for group in by_author.values() for p in _passages(group)]

    forget = book([r for r in records if r["author"] in forget_authors])
    retain = book([r for r in records if r["author"] not in forget_authors])
    return {
        "raw/forget": [{"text": p["text"]} for p in forget],
        "raw/retain1": [{"text": p["text"]} for p in retain],
        "raw/holdout": [{"text": p["text"]} for p in book(holdout)],
        "knowmem/forget_qa": [{"question": p["question"], "answer": p["answer"]} for p in forget],
        "knowmem/retain_qa": [{"question": p["question"], "answer": p["answer"]} for p in retain],
        "verbmem/forget": [dict(zip(("prompt", "gt"), first_sentence_split(p["text"]))) for p in forget],
        "mmlu": multiple_choice_rows(utility_size, None, seed),
    }
