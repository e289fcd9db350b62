"""Server-side checks of an LLM run before any node is asked anything (one-line ``ConfigError``s).

Building the model checks ``llm.model`` (a local folder with a config.json, or 'tiny'),
``llm.target-modules`` (each must name a linear module of the model) and ``llm.lora-rank``;
loading the data checks ``llm.data-dir`` (TOFU's ``full`` split present, required columns there, and
the public evaluation sets parse);
the author partition checks that every client gets at least one author.
"""

from __future__ import annotations

from core.config import ConfigError
from tasks.llm.federation_data import (
    author_partition,
    authors_in_order,
    load_author_records,
    load_public_sets,
)
from tasks.llm.federation_model import task_llm


def check_llm_setup(cfg, num_clients: int) -> None:
    try:
        task_llm(cfg)
    except ValueError as err:
        raise ConfigError(f"run-config: {err}") from None
    try:
        records = load_author_records(cfg)
        load_public_sets(cfg, records)  # real authors, world facts, holdout: a broken file fails here, not in round 1
    except ValueError as err:
        raise ConfigError(f"run-config 'llm.data-dir': {err}") from None
    try:
        _, forgotten = author_partition(cfg, authors_in_order(records), num_clients)
    except ValueError as err:
        raise ConfigError(f"run-config 'llm.num-authors': {err}") from None
    if not forgotten:
        raise ConfigError("the request selects no forget authors: nothing to unlearn")
