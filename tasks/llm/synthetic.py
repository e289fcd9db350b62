"""Deterministic fictitious-author QA data in TOFU's record format, plus retain-side general knowledge.

TOFU (Maini et al., 2024) fine-tunes a model on 200 made-up authors x 20 QA pairs and asks it to
forget some authors. Offline we cannot ship TOFU, so this module generates sets with the same fields:

    {author, question, answer, paraphrased_answer, perturbed_answer: list[str], key_fact}

Choices made here (the papers are silent on them):

* **Answers measure knowledge.** TOFU answers are long sentences, so a wrong-fact answer keeps most of
  its words and ROUGE-L barely moves when a fact is forgotten (measured: 0.79 recall for a templated
  answer with the wrong fact). Here every answer is a short phrasing template (one to four words)
  around a key fact of one to three words, and each record carries that fact as ``key_fact`` so fact
  accuracy ("does the greedy answer contain the fact?") can be measured directly.
* **Varied phrasing.** Each question kind has several question and answer templates; the answer
  uses one, the paraphrased answer another, with the same fact.
* **Perturbed answers** keep the answer's template and swap the fact for other values of the same
  kind (another made-up place for a birthplace, another year for a birth date), so the truth ratio
  compares the fact and nothing else.
* **Closed vocabulary.** Made-up words come from a fixed pool (``MADE_UP_WORDS``, built once from
  syllables with an internal seed), so every word any seed can produce is known in advance and a
  word-level tokenizer trained on ``vocabulary_texts()`` never meets an unknown word.
* **Retain-side sets.** ``real_authors`` and ``world_facts`` mirror TOFU's "Real Authors" and
  "World Facts" evaluation sets with well-known facts, phrased the same way.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable

_SYLLABLES = (
    "ka", "lo", "ver", "tha", "mi", "ros", "el", "dan", "qui", "zar", "be", "nor", "sil", "gre",
    "fa", "tu", "vi", "mor", "len", "ash", "ori", "pel", "sta", "wyn", "cor", "dri", "lum", "hal",
)


def _made_up_words(count: int, seed: int) -> tuple[str, ...]:
    """``count`` distinct capitalised pseudo-words of two or three syllables."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


MADE_UP_WORDS = _made_up_words(400, seed=20240601)
"""The fixed pool of invented words that names, places, prizes and publishers are built from."""

_PLACE_SUFFIXES = ("Springs", "Harbour", "Vale", "Ridge", "Falls", "Crossing", "Bay", "Hollow")
_MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
           "October", "November", "December")
_TITLE_ADJECTIVES = ("Glass", "Silent", "Crimson", "Hollow", "Distant", "Golden", "Broken", "Quiet",
                     "Burning", "Frozen", "Hidden", "Paper", "Iron", "Velvet", "Salt", "Amber")
_TITLE_NOUNS = ("Orchard", "Lantern", "River", "Harbour", "Mirror", "Garden", "Compass", "Tower",
                "Meadow", "Archive", "Violin", "Comet", "Bridge", "Island", "Letter", "Forest")
_PROFESSIONS = ("glass blower", "lighthouse keeper", "ship captain", "court clerk", "beekeeper",
                "stone mason", "railway engineer", "piano tuner", "map maker", "village doctor",
                "radio operator", "clock maker", "school teacher", "bookbinder", "ferry pilot",
                "tailor")
_GENRES = ("maritime fantasy", "historical mystery", "rural satire", "space opera", "gothic romance",
           "urban noir", "mythic poetry", "family saga", "alpine thriller", "courtroom drama",
           "magical realism", "desert western")
_HOBBIES = ("amateur astronomy", "bird watching", "competitive chess", "model sailing",
            "mountain climbing", "pottery", "beekeeping", "fencing", "calligraphy",
            "river fishing", "cave diving", "ballroom dancing")
_NUMBER_WORDS = ("two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                 "twelve")


def _person(rng: random.Random) -> str:
    return f"{rng.choice(MADE_UP_WORDS)} {rng.choice(MADE_UP_WORDS)}"


def _place(rng: random.Random) -> str:
    return f"{rng.choice(MADE_UP_WORDS)} {rng.choice(_PLACE_SUFFIXES)}"


def _date(rng: random.Random) -> str:
    return f"{rng.choice(_MONTHS)} {rng.randrange(1900, 2000)}"


def _title(rng: random.Random) -> str:
    return f"The {rng.choice(_TITLE_ADJECTIVES)} {rng.choice(_TITLE_NOUNS)}"


@dataclass(frozen=True)
class _Kind:
    """One kind of question about an author: its templates and how a plausible fact is drawn."""

    questions: tuple[str, ...]
    answers: tuple[str, ...]
    draw: Callable[[random.Random], str]
    pool: tuple[str, ...] = ()  # finite value list, if any (for the vocabulary)


def _choice_of(values: tuple[str, ...]) -> Callable[[random.Random], str]:
    return lambda rng: rng.choice(values)


_KINDS: tuple[_Kind, ...] = (
    _Kind(("Where was {author} born?", "What is the birthplace of {author}?"),
          ("Born in {fact}.", "In {fact}.", "{fact} is the birthplace."), _place),
    _Kind(("When was {author} born?", "What is the birth date of {author}?"),
          ("Born in {fact}.", "In {fact}.", "It was {fact}."), _date),
    _Kind(("What did the father of {author} do for a living?", "What was the job of {author}'s father?"),
          ("A {fact}.", "He was a {fact}.", "His job: {fact}."), _choice_of(_PROFESSIONS), _PROFESSIONS),
    _Kind(("What did the mother of {author} do for a living?", "What was the job of {author}'s mother?"),
          ("A {fact}.", "She was a {fact}.", "Her job: {fact}."), _choice_of(_PROFESSIONS), _PROFESSIONS),
    _Kind(("Which genre does {author} write in?", "What genre is {author} known for?"),
          ("{fact}.", "Mostly {fact}.", "The genre is {fact}."), _choice_of(_GENRES), _GENRES),
    _Kind(("What was the debut novel of {author}?", "Which book did {author} publish first?"),
          ("{fact}.", "The debut was {fact}.", "First came {fact}."), _title),
    _Kind(("What is the best known book by {author}?", "Which novel made {author} famous?"),
          ("{fact}.", "Best known: {fact}.", "It was {fact}."), _title),
    _Kind(("Which award did {author} win?", "What prize was given to {author}?"),
          ("The {fact}.", "Winner of the {fact}.", "It was the {fact}."),
          lambda rng: f"{rng.choice(MADE_UP_WORDS)} {rng.choice(('Prize', 'Medal', 'Award'))}"),
    _Kind(("Who publishes {author}?", "Which publisher works with {author}?"),
          ("{fact}.", "Published by {fact}.", "It is {fact}."),
          lambda rng: f"{rng.choice(MADE_UP_WORDS)} {rng.choice(('House', 'Press', 'Books'))}"),
    _Kind(("Who mentored {author}?", "Who was the mentor of {author}?"),
          ("{fact}.", "Mentored by {fact}.", "It was {fact}."), _person),
    _Kind(("Who is the spouse of {author}?", "Whom did {author} marry?"),
          ("{fact}.", "Married to {fact}.", "It is {fact}."), _person),
    _Kind(("Where does {author} live now?", "In which town does {author} live today?"),
          ("In {fact}.", "Lives in {fact}.", "{fact} is home now."), _place),
    _Kind(("What pen name does {author} use?", "Under which pseudonym does {author} write?"),
          ("{fact}.", "The pen name {fact}.", "Writes as {fact}."), _person),
    _Kind(("How many novels has {author} written?", "What is the number of novels by {author}?"),
          ("{fact} novels.", "In total {fact} novels.", "Exactly {fact} novels."),
          _choice_of(_NUMBER_WORDS), _NUMBER_WORDS),
    _Kind(("Where did {author} study?", "Which university did {author} attend?"),
          ("{fact}.", "Studied at {fact}.", "At {fact}."),
          lambda rng: f"University of {rng.choice(MADE_UP_WORDS)}"),
    _Kind(("Who is the recurring hero in the books of {author}?", "Which character appears in most books by {author}?"),
          ("{fact}.", "The hero {fact}.", "It is {fact}."), _person),
    _Kind(("Where are the stories of {author} set?", "What is the usual setting of {author}'s books?"),
          ("In {fact}.", "Set in {fact}.", "Mostly {fact}."), _place),
    _Kind(("What hobby does {author} have?", "What does {author} do for fun?"),
          ("{fact}.", "Enjoys {fact}.", "The hobby is {fact}."), _choice_of(_HOBBIES), _HOBBIES),
    _Kind(("When did {author} publish the first book?", "In which month and year did {author} debut?"),
          ("In {fact}.", "Debut in {fact}.", "It was {fact}."), _date),
    _Kind(("What is the name of the pet of {author}?", "What is {author}'s dog called?"),
          ("{fact}.", "The dog is {fact}.", "Named {fact}."), lambda rng: rng.choice(MADE_UP_WORDS)),
)

MAX_QA_PER_AUTHOR = len(_KINDS)

# Retain-side general knowledge: (question, answer template, fact, category). Perturbed answers swap
# the fact for others of the same category.
_REAL_AUTHORS = (
    ("Who wrote Pride and Prejudice?", "Jane Austen"), ("Who wrote War and Peace?", "Leo Tolstoy"),
    ("Who wrote Hamlet?", "William Shakespeare"), ("Who wrote Moby Dick?", "Herman Melville"),
    ("Who wrote The Old Man and the Sea?", "Ernest Hemingway"),
    ("Who wrote One Hundred Years of Solitude?", "Gabriel Garcia Marquez"),
    ("Who wrote Crime and Punishment?", "Fyodor Dostoevsky"), ("Who wrote Great Expectations?", "Charles Dickens"),
    ("Who wrote Mrs Dalloway?", "Virginia Woolf"), ("Who wrote The Trial?", "Franz Kafka"),
    ("Who wrote Don Quixote?", "Miguel de Cervantes"), ("Who wrote Beloved?", "Toni Morrison"),
    ("Who wrote Frankenstein?", "Mary Shelley"), ("Who wrote Things Fall Apart?", "Chinua Achebe"),
    ("Who wrote The Divine Comedy?", "Dante Alighieri"), ("Who wrote Madame Bovary?", "Gustave Flaubert"),
    ("Who wrote Jane Eyre?", "Charlotte Bronte"), ("Who wrote Ulysses?", "James Joyce"),
    ("Who wrote Les Miserables?", "Victor Hugo"), ("Who wrote Nineteen Eighty Four?", "George Orwell"),
)
_WORLD_FACTS = (
    ("What is the capital of France?", "Paris"), ("What is the capital of Japan?", "Tokyo"),
    ("What is the capital of Italy?", "Rome"), ("What is the capital of Egypt?", "Cairo"),
    ("What is the capital of Canada?", "Ottawa"), ("What is the capital of Kenya?", "Nairobi"),
    ("What is the capital of Peru?", "Lima"), ("What is the capital of Norway?", "Oslo"),
    ("What is the capital of Australia?", "Canberra"), ("What is the capital of Spain?", "Madrid"),
    ("What is the capital of Germany?", "Berlin"), ("What is the capital of India?", "New Delhi"),
    ("What is the capital of Brazil?", "Brasilia"), ("What is the capital of Greece?", "Athens"),
    ("What is the capital of Poland?", "Warsaw"), ("What is the capital of Chile?", "Santiago"),
    ("What is the capital of Turkey?", "Ankara"), ("What is the capital of Vietnam?", "Hanoi"),
    ("What is the capital of Sweden?", "Stockholm"), ("What is the capital of Mexico?", "Mexico City"),
)
_REAL_AUTHOR_ANSWERS = ("{fact}.", "It was {fact}.", "Written by {fact}.")
_WORLD_FACT_ANSWERS = ("{fact}.", "It is {fact}.", "The capital is {fact}.")


def _record(author: str, question: str, fact: str, templates: tuple[str, ...],
            wrong_facts: list[str], rng: random.Random) -> dict:
    answer_template, paraphrase_template = rng.sample(templates, 2)
    return {
        "author": author,
        "question": question,
        "answer": answer_template.format(fact=fact),
        "paraphrased_answer": paraphrase_template.format(fact=fact),
        "perturbed_answer": [answer_template.format(fact=wrong) for wrong in wrong_facts],
        "key_fact": fact,
    }


def _check_counts(num_perturbed: int, **positive: int) -> None:
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if num_perturbed < 1:
        raise ValueError(f"num_perturbed must be >= 1, got {num_perturbed}")


def fictitious_authors(num_authors: int, qa_per_author: int = 20, *, num_perturbed: int = 3,
                       seed: int = 0) -> list[dict]:
    """``num_authors`` invented authors with ``qa_per_author`` QA records each, grouped by author.

    Each author gets distinct question kinds (a seeded subset of the 20 kinds, birthplace, birth date,
    parents' jobs, genre, books, award, ...); facts are drawn independently per author, perturbed
    facts are distinct from the true one and from each other. Same arguments, same records.
    """
    _check_counts(num_perturbed, num_authors=num_authors, qa_per_author=qa_per_author)
    if qa_per_author > MAX_QA_PER_AUTHOR:
        raise ValueError(f"qa_per_author must be <= {MAX_QA_PER_AUTHOR}, got {qa_per_author}")
    rng = random.Random(seed)
    names: list[str] = []
    while len(names) < num_authors:
        name = _person(rng)
        if name not in names:
            names.append(name)
    records = []
    for name in names:
        for kind in rng.sample(_KINDS, qa_per_author):
            fact = kind.draw(rng)
            wrong: list[str] = []
            while len(wrong) < num_perturbed:
                candidate = kind.draw(rng)
                if candidate != fact and candidate not in wrong:
                    wrong.append(candidate)
            question = rng.choice(kind.questions).format(author=name)
            records.append(_record(name, question, fact, kind.answers, wrong, rng))
    return records


HOLDOUT_SEED_OFFSET = 7919
"""Added to the run seed to draw the holdout authors, so they never change the training authors."""


def holdout_authors(num_authors: int, qa_per_author: int, *, exclude: list[str], num_perturbed: int = 3,
                    seed: int = 0) -> list[dict]:
    """``num_authors`` further invented authors that no model is trained on: the non-members of the
    LLM membership-inference attack, as TOFU's ``holdoutNN`` splits are for its authors.

    Drawn as `fictitious_authors` with seed ``seed + HOLDOUT_SEED_OFFSET``, skipping the names in
    ``exclude`` (the training authors); same arguments, same records."""
    drawn = fictitious_authors(num_authors + len(exclude), qa_per_author, num_perturbed=num_perturbed,
                               seed=seed + HOLDOUT_SEED_OFFSET)
    taken = set(exclude)
    names = list(dict.fromkeys(r["author"] for r in drawn if r["author"] not in taken))[:num_authors]
    kept = set(names)
    return [r for r in drawn if r["author"] in kept]


def _general_knowledge(pairs: tuple[tuple[str, str], ...], templates: tuple[str, ...],
                       num_perturbed: int, seed: int) -> list[dict]:
    _check_counts(num_perturbed)
    if num_perturbed >= len(pairs):
        raise ValueError(f"num_perturbed must be < {len(pairs)}, got {num_perturbed}")
    rng = random.Random(seed)
    facts = [fact for _, fact in pairs]
    records = []
    for question, fact in pairs:
        wrong = rng.sample([other for other in facts if other != fact], num_perturbed)
        records.append(_record("", question, fact, templates, wrong, rng))
    return records


def real_authors(*, num_perturbed: int = 3, seed: int = 0) -> list[dict]:
    """20 questions on famous real books ("Who wrote ...?"), TOFU's "Real Authors" counterpart."""
    return _general_knowledge(_REAL_AUTHORS, _REAL_AUTHOR_ANSWERS, num_perturbed, seed)


def world_facts(*, num_perturbed: int = 3, seed: int = 0) -> list[dict]:
    """20 capital-city questions, TOFU's "World Facts" counterpart."""
    return _general_knowledge(_WORLD_FACTS, _WORLD_FACT_ANSWERS, num_perturbed, seed)


def vocabulary_texts() -> list[str]:
    """Texts that together contain every word any seed of this module can generate.

    A word-level tokenizer trained on these has no unknown words on synthetic data. Placeholders
    are filled with the empty string; pools are listed in full; years 1900-1999 are spelled out.
    """
    texts = list(MADE_UP_WORDS) + list(_PLACE_SUFFIXES) + list(_MONTHS) + list(_TITLE_ADJECTIVES)
    texts += list(_TITLE_NOUNS) + ["The Prize Medal Award House Press Books University of"]
    texts += [str(year) for year in range(1900, 2000)]
    for kind in _KINDS:
        texts += [t.format(author="", fact="") for t in kind.questions + kind.answers] + list(kind.pool)
    for pairs, templates in ((_REAL_AUTHORS, _REAL_AUTHOR_ANSWERS), (_WORLD_FACTS, _WORLD_FACT_ANSWERS)):
        texts += [f"{question} {fact}" for question, fact in pairs]
        texts += [t.format(fact="") for t in templates]
    return texts
