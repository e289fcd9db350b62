"""ClientApp handlers of the LLM task (``task='llm-tofu'``); ``client_app.app`` dispatches to them.

Same messages as the vision task: ``query.hello`` -> client id and record counts; ``train``
(config: role, objective ``ce``/``ascent``/``npo``/``simnpo``, optional ``llm-epochs`` / ``llm-lr``,
else the run's ``llm-local-epochs`` / ``llm-lr``, optional ``report-loss-before``) -> the trained LoRA adapter +
num-examples/loss (+ ``loss-before``, the received adapter's answer loss on those records);
``evaluate`` -> the sums of ``tasks.llm.federation_metrics``; ``query.fisher`` (FIRM and the merge
baselines; config: role, objective, llm-epochs, llm-lr, fisher-batches) -> ``task-vector`` and
``fisher`` ArrayRecords on the adapter's keys + num-examples. Only the LoRA adapter travels (the
base model is rebuilt from the config on every node). The vision keys ``epochs`` / ``lr`` that
shared strategies put into train configs are ignored here: LLM training has its own settings.
"""

from __future__ import annotations

from functools import lru_cache

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from client_app.state import _node_partition, round_seed
from tasks.config import Config, parse_config
from tasks.llm.federation_data import LLMClientData, build_llm_client_data, load_author_records
from tasks.llm.federation_metrics import client_llm_metrics
from tasks.llm.federation_model import full_precision_twin, local_update, task_llm
from tasks.llm.firm_client import adapter_release
from tasks.llm.fisher import fisher_reference_model
from tasks.llm.model import adapter_state, load_adapter_state
from tasks.llm.train import mean_answer_loss, qa_batches
from tasks.training import device_for


@lru_cache(maxsize=4)
def _view(frozen_config: tuple, partition_id: int, num_partitions: int) -> tuple[Config, LLMClientData]:
    cfg = parse_config(dict(frozen_config), num_clients=num_partitions)
    return cfg, build_llm_client_data(cfg, load_author_records(cfg), partition_id, num_partitions)


def _client(context: Context):
    pid, n = _node_partition(context)
    cfg, data = _view(tuple(sorted(context.run_config.items())), pid, n)
    model, tokenizer, _ = task_llm(cfg, device_for())
    return cfg, data, model, tokenizer


def hello(msg: Message, context: Context) -> Message:
    pid, n = _node_partition(context)
    _, data = _view(tuple(sorted(context.run_config.items())), pid, n)
    counts = data.counts()
    counts["n-all"] = counts["n-retain"] + counts["n-forget"]
    return Message(RecordDict({"hello": MetricRecord({"client-id": data.client_id, **counts})}), reply_to=msg)


def train_role(content: RecordDict, context: Context, role: str) -> RecordDict:
    """Local (un)learning of the received adapter on the records of ``role``: ``arrays`` + ``metrics``
    (``client_app.app.train`` calls it once per role of the message)."""
    cfg, data, model, tokenizer = _client(context)
    conf = content["config"]
    load_adapter_state(model, content["arrays"].to_torch_state_dict())
    records = data.split(role)
    seed = round_seed(cfg, conf, data.client_id)
    before = {}
    if conf.get("report-loss-before", False) and role == "forget":
        before["loss-before"] = mean_answer_loss(model, qa_batches(records, tokenizer, cfg["llm-batch-size"], seed))
    loss = local_update(model, tokenizer, records, objective=str(conf.get("objective", "ce")), cfg=cfg,
                        epochs=int(conf.get("llm-epochs", cfg["llm-local-epochs"])),
                        lr=float(conf.get("llm-lr", cfg["llm-lr"])), seed=seed)
    metrics = MetricRecord({"num-examples": len(records), "loss": float(loss), **before})
    return RecordDict({"arrays": ArrayRecord(adapter_state(model)), "metrics": metrics})


def fisher(msg: Message, context: Context) -> Message:
    """FIRM's one-shot release of the received (original) adapter on the records of ``role``: the task
    vector after ``objective`` training and the diagonal Fisher at the received adapter (LoRA space;
    on a 4-bit model, on its full-precision twin with the same adapter, as the paper does).
    The seed is ``train``'s, so a forget client's ``ascent`` task vector is exactly the update ``ga`` gets."""
    cfg, data, model, tokenizer = _client(context)
    conf = msg.content["config"]
    load_adapter_state(model, msg.content["arrays"].to_torch_state_dict())
    role = str(conf["role"])
    seed = round_seed(cfg, conf, data.client_id)
    batches = qa_batches(data.split(role), tokenizer, cfg["llm-batch-size"], seed)
    twin = fisher_reference_model(model, load_full_precision=lambda: full_precision_twin(cfg, model, device_for()))
    upload = adapter_release(model, batches, role=role, objective=str(conf["objective"]),
                             epochs=int(conf["llm-epochs"]), lr=float(conf["llm-lr"]), seed=seed,
                             fisher_batches=int(conf["fisher-batches"]), fisher_model=twin)
    content = {"task-vector": ArrayRecord(upload["task_vector"]), "fisher": ArrayRecord(upload["fisher"]),
               "metrics": MetricRecord({"num-examples": upload["num_examples"]})}
    return Message(RecordDict(content), reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """Sums and counts of the received adapter's metrics on this client's forget/retain records."""
    cfg, data, model, tokenizer = _client(context)
    load_adapter_state(model, msg.content["arrays"].to_torch_state_dict())
    metrics = client_llm_metrics(model, tokenizer, data, cfg=cfg)
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
