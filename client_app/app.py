"""The fedunlearn ClientApp: message handlers around the client-side work in ``tasks/``.

Every handler rebuilds the client's data view from the run config and its node config
(``partition-id``, ``num-partitions``), cached per process, so simulation and real SuperNodes
behave the same. Raw data never leaves; replies carry model tensors, counts and model outputs.

Messages (DESIGN.md): ``query.hello`` -> client id and counts; ``train`` (config: role,
objective ``ce`` or ``adapter-ascent``, scope, plugins, epochs, lr, max-steps, report-loss-before) -> arrays +
num-examples/loss (+ ``loss-before`` for the forget role: the received backbone's loss on the forget data,
Lethe's adapter bypassed); role ``forget+retain`` -> the same per role under ``arrays.<role>`` /
``metrics.<role>`` (one download, two uploads); ``evaluate``
-> local metrics with counts and MIA confidences (config ``features``: plus a sample of
penultimate features for the diagnostics); ``query.centroids`` (FedUP) -> DP centroids;
``query.fisher`` (FIRM and its merge baselines, LLM task) -> task vector + diagonal Fisher.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app import llm_client
from client_app.fedup_client import centroid_release
from client_app.state import client_view, load_model, round_seed
from tasks.lethe_adapter import loss_without_adapter, train_adapter_ascent
from tasks.metrics import client_metrics, feature_sample
from tasks.model import PLUGIN_PREFIX
from tasks.training import train_local

torch.set_num_threads(1)

app = ClientApp()


@app.query("hello")
def hello(msg: Message, context: Context) -> Message:
    """Client id and data counts, so the server can address roles by node."""
    if llm_client.handles(context):
        return llm_client.hello(msg, context)
    cfg, data, _ = client_view(context)
    counts = data.counts()
    counts["n-all"] = counts["n-retain"] + counts["n-forget"]
    return Message(RecordDict({"hello": MetricRecord({"client-id": data.client_id, **counts})}), reply_to=msg)


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
    train_role = llm_client.train_role if llm_client.handles(context) else _train_role
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
        if role == "all" and cfg["scenario"] == "client" and len(data.forget_y) and cfg["poison-epochs"]:
            epochs = cfg["poison-epochs"]  # the leaving client poisons harder while the original trains
        loss = train_local(model, x, y, epochs=epochs,
                           batch_size=cfg["batch-size"], lr=lr, momentum=cfg["momentum"], seed=seed,
                           scope=scope, max_steps=int(conf.get("max-steps", 0)) or None, device=device)
    arrays = ArrayRecord({k: v.detach().cpu() for k, v in _uploaded_state(model, scope).items()})
    metrics = MetricRecord({"num-examples": len(y), "loss": float(loss), **before})
    return RecordDict({"arrays": arrays, "metrics": metrics})


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Local forget/retain/test metrics of the received model."""
    if llm_client.handles(context):
        return llm_client.evaluate(msg, context)
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
    cfg, data, _ = client_view(context)
    model = load_model(cfg, msg.content["arrays"], str(msg.content["config"].get("plugins", "")))
    return Message(centroid_release(cfg, data, model), reply_to=msg)


@app.query("fisher")
def fisher(msg: Message, context: Context) -> Message:
    """FIRM: task vector + diagonal Fisher of the received LoRA adapter (``client_app.llm_client``)."""
    if not llm_client.handles(context):
        raise ValueError("query.fisher (FIRM and the merge baselines) needs an LLM task (task='llm-tofu')")
    return llm_client.fisher(msg, context)
