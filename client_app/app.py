"""The fedunlearn ClientApp: thin message handlers around the run's task and the registered methods.

Every handler finds the client's data view from the run config and its node config
(``partition-id`` + ``num-partitions``, or ``data-path``; ``client_app.state``), cached per node on
disk and per process, so simulation and real SuperNodes behave the same. The work itself is the
task's (``tasks.base.Task``: local training, evaluation) or a method's (the queries and objectives
it registered, ``strategies.registry``); handlers only turn Flower records into tensors and back.
Raw data never leaves; replies carry model tensors, counts and model outputs.

Cold start: the Deployment Engine starts a fresh ClientApp process for every message, so this
module imports only what every handler needs; a task's and a method's code is imported by the
handler that uses it (the LLM stack by an LLM run only, a method's client code by its query).

Messages: ``query.hello`` -> client id and counts, and the hash of its forget set's sample ids; ``train`` (config: role, objective — ``ce`` or
one a method registered —, scope, plugins, epochs, lr, max-steps, report-loss-before,
loss-before-bypass, keep-model-as, evaluate-received) -> arrays + num-examples/loss (+ ``loss-before`` for each role named in
``report-loss-before``, comma-separated: the received model's loss on that role's data, plug-ins of the
kinds in ``loss-before-bypass`` bypassed; ``epochs`` 0 reports without training);
role ``forget+retain`` -> the same per role under ``arrays.<role>`` / ``metrics.<role>`` (one
download, two uploads); ``evaluate`` -> local metrics with counts (config ``features``: plus a
sample of penultimate features for the diagnostics; config ``models``: several models in one
message, ``arrays.<name>`` / ``config.<name>`` -> ``metrics.<name>`` / ``features.<name>``);
``query.<name>`` for every query a method registered (``python -m strategies.registry`` lists
them); a query whose config names ``kept-model`` receives what this client kept from that original's pretraining
(``client_app.kept_models``) as ``conf["kept-local-model"]`` (None when it kept nothing). Every query,
and every objective marked ``wants_client_data`` (it then also receives ``data=``, the client's view),
gets ``conf["state-folder"]``: this node's own folder for what it keeps (``client_app.kept_models.folder``);
a query message without ``arrays`` gets ``model`` None.
"""

from __future__ import annotations

import hashlib
from logging import INFO

import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from client_app.state import client_view, load_model, remember_given_keys, round_seed
from strategies.registry import load, objective, queries

torch.set_num_threads(1)

app = ClientApp()


def _content_id(data) -> int:
    """A node's own files (``data-path``) as one integer: the first 60 bits of the SHA-256 of its
    training and test arrays (a view without tensors, the LLM task's, gives its ``content_bytes()``).
    The server cannot read those files, so it keys its model cache by this (a metric record holds
    numbers, not strings)."""
    digest = hashlib.sha256()
    if hasattr(data, "content_bytes"):
        digest.update(data.content_bytes())
    else:
        for tensor in (*data.split("all"), data.test_x, data.test_y):
            digest.update(tensor.contiguous().numpy().tobytes())
    return int(digest.hexdigest()[:15], 16)


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Client id and data counts, so the server can address roles by node; a view with a ``domain``
    also declares it (``hello-config``), so a method can pool clients of one forget domain."""
    remember_given_keys(context, msg.content["config"])
    cfg, data = client_view(context, msg.content)
    counts = data.counts()
    counts["n-all"] = counts["n-retain"] + counts["n-forget"]
    log(INFO, "fedunlearn client %d: request scenario '%s': %d of %d training samples to forget, %d kept; "
        "only model updates, counts and model outputs leave this node", data.client_id, cfg["scenario"],
        counts["n-forget"], counts["n-all"], counts["n-retain"])
    own_files = "data-path" in context.node_config
    identity = {"data-id": _content_id(data)} if own_files else {}
    content = RecordDict({"hello": MetricRecord({"client-id": data.client_id, **counts, **identity,
                                                 **_class_counts(cfg, data)}),
                          "forget-set": _forget_set(data, own_files)})
    if getattr(data, "domain", ""):  # the forget domain its data belongs to (tasks with several)
        content["hello-config"] = ConfigRecord({"domain": str(data.domain)})
    return Message(content, reply_to=msg)


def _forget_set(data, own_files: bool) -> ConfigRecord:
    """The hash of this node's forget set, made here of its samples' ids (``tasks.forget_ids``), and
    what those ids are: the receipt's record of exactly which samples the request removed."""
    from tasks.forget_ids import OWN_POSITION, POOL_INDEX, ids_sha256

    ids = data.removed_ids.tolist() if hasattr(data.removed_ids, "tolist") else list(data.removed_ids)
    return ConfigRecord({"ids-sha256": ids_sha256(ids), "ids": OWN_POSITION if own_files else POOL_INDEX})


def _class_counts(cfg, data) -> dict[str, list[int]]:
    """On a task with classes, this node's training samples per class that it keeps (``class-n-retain``)
    and that the request takes away (``class-n-removed``, by their true labels: a backdoor's triggered
    copies or flipped labels are not samples of the class they are labelled with). Label counts only,
    no samples: the server's record of how much of each class the request removes on each node."""
    if not cfg.num_classes:
        return {}
    return {"class-n-retain": torch.bincount(data.retain_y, minlength=cfg.num_classes).tolist(),
            "class-n-removed": torch.bincount(data.removed_y, minlength=cfg.num_classes).tolist()}


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the received model on the data of ``role`` with ``objective``.

    ``role`` may name several roles joined by ``+`` (a dual-stream method: ``forget+retain`` for a client holding
    both): the client trains a fresh copy of the received model once per role and replies with
    ``arrays.<role>`` / ``metrics.<role>``, so one download serves both streams. Config
    ``evaluate-received``: the received model's local metrics too, as an ``evaluate`` message would
    give them (``metrics.received``; continued training's per-round measurement)."""
    roles = str(msg.content["config"]["role"]).split("+")
    if len(roles) == 1:
        content = _train_role(msg.content, context, roles[0])
    else:
        content = RecordDict()
        for role in roles:
            for key, record in _train_role(msg.content, context, role).items():
                content[f"{key}.{role}"] = record
    if msg.content["config"].get("evaluate-received", False):  # after training: its randomness is untouched
        cfg, data = client_view(context, msg.content)
        measured = _evaluate_one(cfg, data, msg.content["arrays"],
                                 {"plugins": msg.content["config"].get("plugins", ""), "features": False})
        content["metrics.received"] = measured["metrics"]
    return Message(content, reply_to=msg)


def _train_role(content: RecordDict, context: Context, role: str) -> RecordDict:
    """One role's local training by the run's task: ``arrays`` (what travels back) + ``metrics``."""
    cfg, data = client_view(context, content)
    conf = dict(content["config"])
    model = load_model(cfg, content["arrays"], str(conf.get("plugins", "")))
    name = str(conf.get("objective", "ce"))
    fn = None if name == "ce" else objective(name)
    if getattr(fn, "wants_client_data", False):  # an objective that keeps state on this node (FedAU's head)
        from functools import partial

        from client_app.kept_models import folder

        conf["state-folder"] = folder(context.node_config, cfg)
        fn = partial(fn, data=data)
    state, metrics = cfg.task.train_role(cfg, data, model, role, conf, round_seed(cfg, conf, data.client_id), fn)
    if conf.get("keep-model-as"):  # the last pretraining round: this is the model a real client holds
        from client_app.kept_models import keep

        keep(context.node_config, cfg, data.client_id, str(conf["keep-model-as"]), state)
    return RecordDict({"arrays": ArrayRecord(state), "metrics": MetricRecord(metrics)})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Local metrics of the received model (sums and counts the server pools).

    A message whose ``config`` names ``models`` (comma-separated) carries several models, each as
    ``arrays.<name>`` with its own ``config.<name>``; the reply holds ``metrics.<name>`` (and
    ``features.<name>``) for each: one process start on a real node for all of them."""
    cfg, data = client_view(context, msg.content)
    names = str(msg.content["config"].get("models", ""))
    # one model: plain ``arrays`` / ``config`` in, ``metrics`` / ``features`` out
    suffixes = [f".{name}" for name in names.split(",")] if names else [""]
    content = RecordDict()
    for suffix in suffixes:
        part = _evaluate_one(cfg, data, msg.content[f"arrays{suffix}"], msg.content[f"config{suffix}"])
        for key, record in part.items():
            content[f"{key}{suffix}"] = record
    return Message(content, reply_to=msg)


def _evaluate_one(cfg, data, arrays: ArrayRecord, config) -> dict:
    """One model's local metrics (``metrics``) and, if asked, its feature sample (``features``)."""
    conf = dict(config)
    model = load_model(cfg, arrays, str(conf.get("plugins", "")))
    metrics, features = cfg.task.evaluate(cfg, data, model, conf)
    content = {"metrics": MetricRecord(metrics)}
    if features is not None:
        content["features"] = ArrayRecord(features)
    return content


def _records(reply: dict) -> RecordDict:
    """A method's plain reply (``{name: {key: tensor}}`` and ``metrics``) as Flower records."""
    return RecordDict({name: MetricRecord(part) if name == "metrics" else ArrayRecord(part)
                       for name, part in reply.items()})


def _query_handler(action: str, target: str, spec):
    def handle(msg: Message, context: Context) -> Message:
        cfg, data = client_view(context, msg.content)
        if cfg.task.kind not in spec.task_kinds:
            raise ValueError(f"query.{action} of method {spec.name} needs a task of kind "
                             f"{' or '.join(spec.task_kinds)}, not task '{cfg['task']}'")
        conf = dict(msg.content["config"])
        if conf.get("kept-model"):  # the method starts from what this client kept from pretraining
            from client_app.kept_models import kept

            conf["kept-local-model"] = kept(context.node_config, cfg, data.client_id, str(conf["kept-model"]))
        from client_app.kept_models import folder

        conf["state-folder"] = folder(context.node_config, cfg)  # where this node keeps its own state
        # a query without a model (FedAU asks for its kept head only) receives None
        model = load_model(cfg, msg.content["arrays"], str(conf.get("plugins", ""))) if "arrays" in msg.content else None
        reply = load(target)(cfg.task, cfg, data, model, conf, round_seed(cfg, conf, data.client_id))
        return Message(_records(reply), reply_to=msg)

    handle.__name__ = handle.__qualname__ = f"query_{action}"
    handle.__doc__ = f"``query.{action}``: the registered handler {target}."
    return handle


for _action, (_target, _spec) in queries().items():
    app.query(_action)(_query_handler(_action, _target, _spec))
