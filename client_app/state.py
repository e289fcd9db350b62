"""Per-process client state: the parsed config, this client's data view (built by the run's task), models.

A node's data is either a partition of the shared pool (node config ``partition-id`` and
``num-partitions``) or its own files (node config ``data-path``, with ``partition-id`` as its client
id; format in ``tasks.node_data``, for the LLM task ``tasks.llm.node_data``). The view is built once per node and kept on disk
(``client_app.view_cache``: the Deployment Engine starts a fresh process for every message) and in
memory (Ray keeps a simulated client's process alive across rounds); the Dirichlet assignment is kept
there too, apart from the request, so a new deletion request does not recompute it.
"""

from __future__ import annotations

import os
from functools import lru_cache

from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from client_app.view_cache import PartitionFiles, cache_folder, cached_view
from core.config import Config
from strategies.run_config import parse_config
from tasks import partition
from tasks.plugins import specs_from_json
from tasks.stream import REQUEST_RECORD, request_config


def _int(node: dict, key: str) -> int:
    try:
        return int(node[key])
    except (TypeError, ValueError):
        raise ValueError(f"node config {key!r}={node[key]!r} must be an integer") from None


def _partition(node: dict) -> tuple[int, int]:
    if "partition-id" not in node or "num-partitions" not in node:
        raise ValueError("node config needs 'partition-id' and 'num-partitions' "
                         "(e.g. --node-config \"partition-id=0 num-partitions=3\") or 'data-path' and "
                         "'partition-id'")
    pid, n = _int(node, "partition-id"), _int(node, "num-partitions")
    if not 0 <= pid < n:
        raise ValueError(f"node config 'partition-id'={pid} must be in 0..{n - 1}")
    return pid, n


def _own_data_id(node: dict) -> int:
    if "partition-id" not in node or _int(node, "partition-id") < 0:
        raise ValueError("node config 'data-path' needs 'partition-id' too (this node's client id, >= 0, "
                         "unique in the federation)")
    return _int(node, "partition-id")


def data_source(node: dict) -> dict:
    """Where this node's data comes from, checked: ``partition-id`` + ``num-partitions`` of the shared
    pool, or its own ``data-path`` (with ``partition-id`` as its client id)."""
    if "data-path" in node:
        path = os.path.abspath(os.path.expanduser(str(node["data-path"])))
        return {"data-path": path, "partition-id": _own_data_id(node)}
    pid, n = _partition(node)
    return {"partition-id": pid, "num-partitions": n}


#: the hello message's config entry, and the node's ``context.state`` record, holding the keys the
#: user set (space-separated) where the run config Flower hands the node holds every key
GIVEN_KEYS = "given-keys"
RUN_RECORD = "fedunlearn-run"


def remember_given_keys(context: Context, config) -> None:
    """Keep the keys the user set, as the server sent them in hello, in this node's state for the
    run's later messages: the node then parses the run config as the server did."""
    if GIVEN_KEYS in config:
        context.state[RUN_RECORD] = ConfigRecord({GIVEN_KEYS: str(config[GIVEN_KEYS])})


def given_keys(context: Context) -> tuple[str, ...] | None:
    """The keys the user set (:func:`remember_given_keys`); None where the server sent none (its run
    config then holds only what the user set, as in the in-process runner)."""
    record = context.state.get(RUN_RECORD)
    if record is None or GIVEN_KEYS not in record:
        return None
    return tuple(str(record[GIVEN_KEYS]).split())


@lru_cache(maxsize=16)
def _view(frozen_config: tuple, frozen_node: tuple, request: int | None, given: tuple[str, ...] | None):
    run, node = dict(frozen_config), dict(frozen_node)
    source = data_source(node)
    cfg = parse_config(run, num_clients=source.get("num-partitions"), given=given, on_node=True)
    if request is not None:
        cfg = request_config(cfg, request)
    key, build = cfg.task.client_view(cfg, source)
    partition.use_store(PartitionFiles(cache_folder(node)))  # a new request over the same partition skips it
    return cfg, (cached_view(cache_folder(node), key, build) if key is not None else build())


def client_view_of(run_config: dict, node_config: dict, request: int | None = None,
                   given: tuple[str, ...] | None = None):
    """(config, the data view) of the node with ``node_config`` in the run with ``run_config``; in a
    stream of requests, of request ``request`` (0: before any request; ``tasks.stream``); ``given``: the
    keys the user set (``strategies.run_config.parse_config``)."""
    return _view(tuple(sorted(run_config.items())), tuple(sorted(node_config.items())), request,
                 None if given is None else tuple(sorted(given)))


def request_of(content: RecordDict) -> int | None:
    """The request of a stream that a message's ``content`` is about (``Federation.request_index``), or None."""
    return int(content[REQUEST_RECORD]["request"]) if REQUEST_RECORD in content else None


def client_view(context: Context, content: RecordDict | None = None):
    """(config, this client's data view) for the current run and the request the message
    ``content`` is about."""
    return client_view_of(context.run_config, context.node_config, None if content is None else request_of(content),
                          given_keys(context))


def round_seed(cfg: Config, conf, client_id: int) -> int:
    """The seed of one client's local work in one round (message config ``conf``): distinct per run
    seed, round and client, and the same for every role a client trains in that round."""
    return cfg["seed"] * 1_000_003 + int(conf.get("server-round", 0)) * 1009 + client_id


def load_model(cfg: Config, arrays: ArrayRecord, plugins_json: str):
    """The task's model with the given plug-ins, loaded with the received weights."""
    return cfg.task.client_model(cfg, arrays.to_torch_state_dict(), specs_from_json(plugins_json))
