"""The fedunlearn ClientApp: message handlers around the client-side work in ``tasks/``.

Every handler finds the client's data view from the run config and its node config
(``partition-id`` + ``num-partitions``, or ``data-path``; ``client_app.state``), cached per node on
disk and per process, so simulation and real SuperNodes behave the same. Raw data never leaves;
replies carry model tensors, counts and model outputs.

Cold start: the Deployment Engine starts a fresh ClientApp process for every message, so this
module imports only what every vision handler needs; the LLM stack (transformers, peft) is
imported by the LLM branch only, FedUP's centroid code (scikit-learn's KMeans) by
``query.centroids`` only.

Messages: ``query.hello`` -> client id and counts; ``train`` (config: role,
objective ``ce`` or ``adapter-ascent``, scope, plugins, epochs, lr, max-steps, report-loss-before) -> arrays +
num-examples/loss (+ ``loss-before`` for the forget role: the received backbone's loss on the forget data,
Lethe's adapter bypassed); role ``forget+retain`` -> the same per role under ``arrays.<role>`` /
``metrics.<role>`` (one download, two uploads); ``evaluate``
-> local metrics with counts and MIA confidences (config ``features``: plus a sample of
penultimate features for the diagnostics); ``query.centroids`` (FedUP) -> DP centroids;
``query.fisher`` (FIRM and its merge baselines, LLM task) -> task vector + diagonal Fisher.
"""

from __future__ import annotations

from logging import INFO

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.logger import log

from client_app.state import client_view, load_model, round_seed
from tasks.config import LLM_TASKS
from tasks.lethe_adapter import loss_without_adapter, train_adapter_ascent
from tasks.metrics import client_metrics, feature_sample
from tasks.model import PLUGIN_PREFIX
from tasks.training import train_local

torch.set_num_threads(1)

app = ClientApp()


def _llm_client(context: Context):
    """``client_app.llm_client`` when this run's task is an LLM task, else None (imported only then)."""
    if str(context.run_config.get("task", "")) not in LLM_TASKS:
        return None
    if "data-path" in context.node_config:
        raise ValueError(f"node config 'data-path' is not supported yet for task "
                         f"'{context.run_config['task']}': use partition-id and num-partitions")
    from client_app import llm_client

    return llm_client


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Client id and data counts, so the server can address roles by node."""
    llm = _llm_client(context)
    if llm:
        return llm.hello(msg, context)
    cfg, data, _ = client_view(context)
    counts = data.counts()
    counts["n-all"] = counts["n-retain"] + counts["n-forget"]
    log(INFO, "fedunlearn client %d: request scenario '%s': %d of %d training samples to forget, %d kept; "
        "only model updates, counts and model outputs leave this node", data.client_id, cfg["scenario"],
        counts["n-forget"], counts["n-all"], counts["n-retain"])
    identity = {"data-id": _content_id(data)} if "data-path" in context.node_config else {}
    return Message(RecordDict({"hello": MetricRecord({"client-id": data.client_id, **counts, **identity})}),
                   reply_to=msg)


def _content_id(data) -> int:
    """A node's own files (``data-path``) as one integer: the first 60 bits of the SHA-256 of its
    training and test arrays. The server cannot read those files, so it keys its model cache by
    this (a metric record holds numbers, not strings)."""
    import hashlib

    digest = hashlib.sha256()
    for tensor in (*data.split("all"), data.test_x, data.test_y):
        digest.update(tensor.contiguous().numpy().tobytes())
    return int(digest.hexdigest()[:15], 16)


def _uploaded_state(model: torch.nn.Module, scope: str) -> dict[str, torch.Tensor]:
    """Only what was trained goes back up: plug-ins for ``plugins``, the base for ``base``."""
    state = model.state_dict()
    if scope == "plugins":
        return {k: v for k, v in state.items() if k.startswith(PLUGIN_PREFIX)}
    if scope == "base":
        return {k: v for k, v in state.items() if not k.startswith(PLUGIN_PREFIX)}
    return state


@app.train()
def train(msg: Message, context: Context) -> Message:
    """Local training of the received model on the data of ``role`` with ``objective``.

    ``role`` may name several roles joined by ``+`` (Lethe: ``forget+retain`` for a client holding
    both): the client trains a fresh copy of the received model once per role and replies with
    ``arrays.<role>`` / ``metrics.<role>``, so one download serves both streams."""
    llm = _llm_client(context)
    train_role = llm.train_role if llm else _train_role
    roles = str(msg.content["config"]["role"]).split("+")
    if len(roles) == 1:
        return Message(train_role(msg.content, context, roles[0]), reply_to=msg)
    content = RecordDict()
    for role in roles:
        for key, record in train_role(msg.content, context, role).items():
            content[f"{key}.{role}"] = record
    return Message(content, reply_to=msg)


def _train_role(content: RecordDict, context: Context, role: str) -> RecordDict:
    """One role's local training (vision tasks): ``arrays`` (what ``scope`` trained) + ``metrics``."""
    cfg, data, device = client_view(context)
    conf = content["config"]
    scope = str(conf.get("scope", "all"))
    model = load_model(cfg, content["arrays"], str(conf.get("plugins", "")))
    x, y = data.split(role)
    seed = round_seed(cfg, conf, data.client_id)
    lr = float(conf.get("lr", cfg["lr"]))
    report_before = conf.get("report-loss-before", False) and role == "forget"
    before = {"loss-before": loss_without_adapter(model, x, y)} if report_before else {}
    if conf.get("objective", "ce") == "adapter-ascent":  # Lethe phase 1: only the adapter moves
        loss = train_adapter_ascent(model, len(model.plugins) - 1, (x, y), steps=int(conf["max-steps"]),
                                    lr=lr, seed=seed, batch_size=cfg["batch-size"],
                                    max_loss=cfg["lethe-adapter-max-loss"])["loss_end"]
    else:
        epochs = int(conf.get("epochs", cfg["local-epochs"]))
        epochs = data.local_epochs(role, cfg, epochs)  # the leaving client's poisoning (tasks.requests)
        loss = train_local(model, x, y, epochs=epochs,
                           batch_size=cfg["batch-size"], lr=lr, momentum=cfg["momentum"], seed=seed,
                           scope=scope, max_steps=int(conf.get("max-steps", 0)) or None, device=device)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in _uploaded_state(model, scope).items()})
    metrics = MetricRecord({"num-examples": len(y), "loss": float(loss), **before})
    return RecordDict({"arrays": arrays, "metrics": metrics})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Local forget/retain/test metrics of the received model."""
    llm = _llm_client(context)
    if llm:
        return llm.evaluate(msg, context)
    cfg, data, device = client_view(context)
    conf = msg.content["config"]
    model = load_model(cfg, msg.content["arrays"], str(conf.get("plugins", "")))
    seed = cfg["seed"] + data.client_id
    metrics = client_metrics(model, data, target=cfg["backdoor-target"],
                             mia_max_samples=cfg["mia-max-samples"], seed=seed, device=device)
    content = {"metrics": MetricRecord(metrics)}
    if conf.get("features", False) and cfg["diagnostic-samples"]:
        content["features"] = ArrayRecord(feature_sample(model, data, cfg["diagnostic-samples"], seed))
    return Message(RecordDict(content), reply_to=msg)


@app.query("centroids")
def centroids(msg: Message, context: Context) -> Message:
    """FedUP: DP class centroids of this client's retained features (``client_app.fedup_client``)."""
    from client_app.fedup_client import centroid_release

    cfg, data, _ = client_view(context)
    model = load_model(cfg, msg.content["arrays"], str(msg.content["config"].get("plugins", "")))
    return Message(centroid_release(cfg, data, model), reply_to=msg)


@app.query("fisher")
def fisher(msg: Message, context: Context) -> Message:
    """FIRM: task vector + diagonal Fisher of the received LoRA adapter (``client_app.llm_client``)."""
    llm = _llm_client(context)
    if not llm:
        raise ValueError("query.fisher (FIRM and the merge baselines) needs an LLM task (task='llm-tofu')")
    return llm.fisher(msg, context)
