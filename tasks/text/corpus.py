"""The synthetic four-topic news corpus of ``text-minilm`` (offline, deterministic in the seed).

Four AG-News-like topics, in AG News's label order: 0 World, 1 Sports, 2 Business, 3 Sci/Tech. Each
text is a headline-like main clause built from the topic's own actors, actions and objects, followed
by a side clause about a *different* topic and filler from a pool every topic shares, e.g.
"the prime minister signed the ceasefire accord in geneva, as the striker signed a new contract".
Several words belong to more than one topic ("signed", "won", "record", "new"), and the
side clause puts another topic's words into every text, so counting each topic's keywords does not
tell the label (``keyword_vote_accuracy`` measures that); the label is the topic of the main clause.
It is synthetic: no sentence comes from AG News.
"""

from __future__ import annotations

import numpy as np

TOPICS = ("World", "Sports", "Business", "Sci/Tech")

ACTORS = (
    ("the prime minister", "the foreign ministry", "rebel leaders", "the united nations envoy", "the president",
     "opposition lawmakers", "the ambassador", "peacekeepers", "the defence minister", "refugee agencies",
     "the election commission", "border guards", "the parliament", "diplomats", "the military junta"),
    ("the striker", "the head coach", "the goalkeeper", "the home side", "the champions", "the veteran pitcher",
     "the tennis star", "the quarterback", "the sprinter", "the club captain", "the referee", "the rookie",
     "the national squad", "the league leaders", "the cyclist"),
    ("the central bank", "shareholders", "the retailer", "the airline", "the chief executive", "investors",
     "the carmaker", "the oil company", "the insurer", "the hedge fund", "regulators", "the bank's board",
     "the supermarket chain", "analysts", "the steel maker"),
    ("the chip designer", "researchers", "the software giant", "astronomers", "the search engine",
     "the startup's engineers", "the space agency", "hackers", "the phone maker", "scientists",
     "the open source project", "the robotics lab", "the browser team", "the telescope team", "programmers"),
)
ACTIONS = (
    ("signed a ceasefire accord", "called for fresh elections", "imposed sanctions", "held peace talks",
     "sent troops to the border", "condemned the coup", "opened the embassy again", "promised humanitarian aid",
     "rejected the treaty", "declared a state of emergency", "won the presidential vote", "withdrew its envoy"),
    ("scored twice in the final", "won the championship", "signed a new contract", "broke the world record",
     "lost the semifinal", "defended the title", "was sent off in the derby", "won the grand slam",
     "clinched the pennant", "made the playoffs", "retired after the season", "beat the defending champions"),
    ("raised interest rates", "reported quarterly profits", "cut thousands of jobs", "agreed to a merger",
     "signed a supply deal", "issued a profit warning", "bought back shares", "filed for bankruptcy",
     "beat earnings forecasts", "lowered its sales outlook", "won the takeover battle", "priced its stock offering"),
    ("released a faster processor", "patched a security flaw", "launched a new operating system",
     "discovered a distant planet", "unveiled a quantum computer", "launched a satellite", "cracked the encryption",
     "published the source code", "built a humanoid robot", "mapped the human genome", "set a record for data speed",
     "shipped a browser update"),
)
PLACES = (
    ("in geneva", "near the capital", "at the summit", "in the disputed region", "across the border",
     "after the vote", "in kabul", "at the security council"),
    ("at the stadium", "in the final minutes", "on home turf", "at the olympics", "in extra time",
     "at wimbledon", "in the play-off", "before a sellout crowd"),
    ("on wall street", "in early trading", "at the annual meeting", "in the third quarter", "in tokyo trading",
     "after the market closed", "at the shareholder vote", "in its latest filing"),
    ("at the developer conference", "in the lab", "in orbit", "on the web", "in a journal paper",
     "at the trade show", "in its latest release", "on the launch pad"),
)
FILLERS = ("officials said on monday", "according to a report", "sources said", "reports said on friday",
           "a spokesman said", "it emerged late on tuesday", "the statement said", "local media reported")
LINKS = ("while", "as", "even as", "a day after", "just as", "although")


def _clause(rng: np.random.Generator, topic: int, with_place: bool) -> str:
    words = [rng.choice(ACTORS[topic]), rng.choice(ACTIONS[topic])]
    if with_place:
        words.append(rng.choice(PLACES[topic]))
    return " ".join(words)


def synthetic_news(per_class: int, seed: int) -> tuple[list[str], list[int]]:
    """``per_class`` texts per topic (labels 0..3 as ``TOPICS``), shuffled, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    texts, labels = [], []
    for topic in range(len(TOPICS)):
        for _ in range(per_class):
            other = int(rng.choice([t for t in range(len(TOPICS)) if t != topic]))
            main = _clause(rng, topic, with_place=True)
            side = _clause(rng, other, with_place=bool(rng.random() < 0.3))
            parts = [main, str(rng.choice(LINKS)), side]
            if rng.random() < 0.5:
                parts.append(", " + str(rng.choice(FILLERS)))
            texts.append(" ".join(parts).replace(" ,", ","))
            labels.append(topic)
    order = rng.permutation(len(texts))
    return [texts[i] for i in order], [labels[i] for i in order]


def keyword_vote_accuracy(texts: list[str], labels: list[int]) -> float:
    """Accuracy of voting by each topic's own words (actors, actions, places; ties to the lowest topic):
    how far a bag of keywords gets on the corpus."""
    vocab = [set(" ".join(ACTORS[t] + ACTIONS[t] + PLACES[t]).split()) for t in range(len(TOPICS))]
    hits = 0
    for text, label in zip(texts, labels):
        tokens = text.replace(",", " ").replace(";", " ").split()
        votes = [sum(tok in vocab[t] for tok in tokens) for t in range(len(TOPICS))]
        hits += int(np.argmax(votes)) == label
    return hits / len(texts)
