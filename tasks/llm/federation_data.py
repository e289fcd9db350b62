"""The LLM task's federation: which authors each client holds and which of them are forgotten.

Records (TOFU format, ``tasks.llm.synthetic`` / ``tasks.llm.data``) are grouped by ``author``.
Every client rebuilds the same assignment from the run config and the seed; raw QA pairs never
leave a client. A node with its own files (node config ``data-path``) holds its records instead of
a share of the pool and applies the request to them itself: ``tasks.llm.node_data``.

Author partition (deterministic from ``seed``; the papers do not say how TOFU is split):

* ``scenario=client``: the authors are shuffled with ``random.Random(seed)`` and dealt into
  contiguous near-equal chunks (the first ``A mod n`` chunks hold one author more); chunk ``j``
  goes to client ``j``. The forget client's authors are all forgotten.
* ``scenario=sample``: the forget set is the last ``k = max(1, round(llm.forget-fraction * A))``
  authors in data order (on TOFU files that is exactly TOFU's ``forgetNN`` split, e.g. the last 20
  of 200 authors for 0.1; synthetic authors are random anyway). The sequence *forget authors, then
  the other authors shuffled* is dealt into the same near-equal chunks, chunk ``j`` going to client
  ``(forget-client + j) mod n``: the forget authors live on the forget client, and spill over to
  the next client(s) only when ``k`` exceeds one chunk.

``forget-client=-1`` means client 0: with near-equal chunks it is the client with the most
authors (ties: lowest id), as for the vision tasks' "largest client".

Evaluation uses the records that carry perturbed answers (truth ratios need them): every synthetic
record; on TOFU, the rows of ``full`` whose question appears in one of the ``*_perturbed`` splits
found in ``llm.data-dir`` (TOFU ships perturbed answers for its forget splits and for 400 retain
questions only).

Public evaluation sets (`load_public_sets`), which no client trains on; record ``i`` of each is
scored by client ``i mod n``, so the pooled figures cover each record once:

* ``holdout``: the non-members of the min-k% MIA. On TOFU files, the split ``holdoutNN`` with
  ``NN = 100 * llm.forget-fraction`` when present (open-unlearning pairs ``forget10`` with
  ``holdout10``), else the largest ``holdoutNN`` present, else none. Synthetic: as many further
  invented authors as the sample scenario forgets, ``max(1, round(llm.forget-fraction * A))``
  (``synthetic.holdout_authors``, drawn apart from the training authors).
* ``real-authors`` / ``world-facts`` (TOFU files only): ``real_authors_perturbed`` and
  ``world_facts_perturbed`` when present, for TOFU's nine-value model utility.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

from tasks.llm import synthetic
from tasks.llm.data import has_tofu_split, load_tofu_split

PERTURBED_SPLITS = ("forget01_perturbed", "forget05_perturbed", "forget10_perturbed", "retain_perturbed")


@dataclass
class LLMClientData:
    """One client's QA records split by the request (``forget``: the forgotten authors' records)."""

    client_id: int
    authors: list[str]
    retain: list[dict]
    forget: list[dict]
    forget_authors: list[str] = field(default_factory=list)
    public: dict[str, list[dict]] = field(default_factory=dict)
    """This client's share of the public evaluation sets (module docstring), by set name."""
    protocol: str = ""
    """The evaluation protocol its data asks for (``tasks.llm.federation_metrics``); ``""``: by the run config."""
    removed_ids: list[int] = field(default_factory=list)
    """Stable ids of the forget records: their index in the pool of records (or in the node's own file)."""
    domain: str = ""
    """The forget domain of its forget records (declared in hello); ``""``: none."""

    def split(self, role: str) -> list[dict]:
        if role == "retain":
            return self.retain
        if role == "forget":
            return self.forget
        if role == "all":
            return self.retain + self.forget
        raise ValueError(f"role {role!r} is unknown: must be all, retain or forget")

    def evaluable(self, role: str) -> list[dict]:
        """Records of ``role`` that have perturbed answers (what the metrics can score)."""
        return [r for r in self.split(role) if r.get("perturbed_answer")]

    def content_bytes(self) -> bytes:
        """Everything this view holds, serialised (the node's content id, ``client_app.app``, hashes it)."""
        return json.dumps([self.retain, self.forget, self.public], sort_keys=True, default=str).encode()

    def counts(self) -> dict[str, int]:
        return {"n-retain": len(self.retain), "n-forget": len(self.forget),
                "n-eval-retain": len(self.evaluable("retain")), "n-eval-forget": len(self.evaluable("forget"))}


def _tofu_records(data_dir: str) -> list[dict]:
    """TOFU's ``full`` split with perturbed answers joined in (by question) from the perturbed splits."""
    return join_perturbed(data_dir, load_tofu_split(data_dir, "full"))


def join_perturbed(data_dir: str, records: list[dict]) -> list[dict]:
    """``records`` with paraphrased / perturbed answers joined in (by question, in place) from
    whichever ``PERTURBED_SPLITS`` ``data_dir`` holds."""
    extra: dict[str, dict] = {}
    for split in PERTURBED_SPLITS:
        if has_tofu_split(data_dir, split):
            extra.update({r["question"]: r for r in load_tofu_split(data_dir, split)})
    for record in records:
        joined = extra.get(record["question"])
        if joined is not None:
            record["paraphrased_answer"] = joined["paraphrased_answer"]
            record["perturbed_answer"] = joined["perturbed_answer"]
    return records


def load_author_records(cfg) -> list[dict]:
    """All QA records of the task: synthetic authors (offline default) or TOFU files in ``llm.data-dir``."""
    if cfg["llm.data-dir"]:
        return _tofu_records(cfg["llm.data-dir"])
    return synthetic.fictitious_authors(cfg["llm.num-authors"], cfg["llm.qa-per-author"], seed=cfg["seed"])


HOLDOUT_SPLITS = ("holdout10", "holdout05", "holdout01")


def load_public_sets(cfg, records: list[dict]) -> dict[str, list[dict]]:
    """The public evaluation sets of the run (module docstring), whole; ``records`` are the training
    records (their authors are kept out of the synthetic holdout)."""
    data_dir = cfg["llm.data-dir"]
    if not data_dir:
        count = max(1, round(cfg["llm.forget-fraction"] * cfg["llm.num-authors"]))
        return {"holdout": synthetic.holdout_authors(count, cfg["llm.qa-per-author"],
                                                     exclude=authors_in_order(records), seed=cfg["seed"])}
    return tofu_public_sets(data_dir, cfg["llm.forget-fraction"])


def tofu_public_sets(data_dir: str, forget_fraction: float) -> dict[str, list[dict]]:
    """The public sets TOFU files in ``data_dir`` hold: real authors, world facts, the holdout
    matching ``forget_fraction`` (else the largest present); absent files are absent sets."""
    sets = {name: load_tofu_split(data_dir, split)
            for name, split in (("real-authors", "real_authors_perturbed"), ("world-facts", "world_facts_perturbed"))
            if has_tofu_split(data_dir, split)}
    matching = f"holdout{round(100 * forget_fraction):02d}"
    present = [split for split in (matching, *HOLDOUT_SPLITS)
               if split in HOLDOUT_SPLITS and has_tofu_split(data_dir, split)]
    if present:
        sets["holdout"] = load_tofu_split(data_dir, present[0])
    return sets


def authors_in_order(records: list[dict]) -> list[str]:
    """Distinct authors in order of first appearance."""
    return list(dict.fromkeys(r["author"] for r in records))


def forget_client_of(cfg) -> int:
    return max(cfg["forget-client"], 0)


def shards(items: list, count: int) -> list[list]:
    """``items`` cut into ``count`` contiguous near-equal parts (the first ``len mod count`` one longer)."""
    base, extra = divmod(len(items), count)
    parts, start = [], 0
    for j in range(count):
        size = base + (1 if j < extra else 0)
        parts.append(items[start:start + size])
        start += size
    return parts


def author_partition(cfg, authors: list[str], num_clients: int) -> tuple[list[list[str]], list[str]]:
    """(authors of each client, forgotten authors) per the module docstring."""
    if len(authors) < num_clients:
        raise ValueError(f"the data has {len(authors)} authors but the federation {num_clients} clients: "
                         "raise llm.num-authors (every client needs at least one author)")
    fc = forget_client_of(cfg)
    rng = random.Random(cfg["seed"])
    if cfg["scenario"] == "sample":
        k = max(1, round(cfg["llm.forget-fraction"] * len(authors)))
        forgotten = authors[len(authors) - k:]
        rest = authors[: len(authors) - k]
        rng.shuffle(rest)
        sequence, first_client = forgotten + rest, fc
    else:
        sequence = list(authors)
        rng.shuffle(sequence)
        first_client, forgotten = 0, []
    parts: list[list[str]] = [[] for _ in range(num_clients)]
    for j, shard in enumerate(shards(sequence, num_clients)):
        parts[(first_client + j) % num_clients] = shard
    if cfg["scenario"] == "client":
        forgotten = list(parts[fc])
    return parts, forgotten


def build_llm_client_data(cfg, records: list[dict], partition_id: int, num_partitions: int,
                          public: dict[str, list[dict]] | None = None) -> LLMClientData:
    """Client ``partition_id``'s retain and forget records, and its share of the public sets
    (``public``, by default `load_public_sets`)."""
    parts, forgotten = author_partition(cfg, authors_in_order(records), num_partitions)
    mine, gone = set(parts[partition_id]), set(forgotten)
    own = [r for r in records if r["author"] in mine]
    public = load_public_sets(cfg, records) if public is None else public
    return LLMClientData(client_id=partition_id, authors=parts[partition_id],
                         retain=[r for r in own if r["author"] not in gone],
                         forget=[r for r in own if r["author"] in gone],
                         forget_authors=sorted(mine & gone),
                         removed_ids=[i for i, r in enumerate(records) if r["author"] in mine & gone],
                         public={name: rows[partition_id::num_partitions] for name, rows in public.items()})
