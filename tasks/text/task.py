"""The text tasks: AG News (``agnews-bert``) and a synthetic four-topic corpus (``text-minilm``).

Both classify news texts into 4 topics with a BERT-style encoder (``tasks.text.encoder``): the frozen
lower layers run once per client when its view is built; the trained top layers + pooling are the
``SplitModel``'s extractor and a linear layer its head, so the plug-ins of FedUP (filter) and Lethe
(adapter) sit on the pooled sentence representation and every vision routine (local SGD, metrics,
MIA, features) runs unchanged on the packed tensors. Requests are the vision ones
(``tasks.requests``) with the trigger phrase ``text.trigger`` appended instead of a pixel square.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from core.config import Config, ConfigError
from tasks.base import State, Task
from tasks.vision.task import VisionTask, data_dir

TEXT_KEYS = ("text.encoder", "text.train-layers", "text.max-length", "text.trigger", "text.max-samples",
             "text.synthetic-per-class")
VIEW_KEYS = ("task", "data-dir", "scenario", "poison", "forget-client", "forget-class", "sample-fraction",
             "backdoor-target", "backdoor-share", "seed", "dirichlet-alpha", "test-fraction", *TEXT_KEYS)
ROOT = Path(__file__).resolve().parents[2]
VIEW_CODE = ("tasks/requests.py", "tasks/stream.py", "tasks/partition.py", "tasks/text/data.py", "tasks/text/corpus.py",
             "tasks/text/encoder.py", "tasks/text/triggers.py")


@lru_cache(maxsize=2)
def _pool(source: str, root: str, per_class: int, max_samples: int, seed: int):
    from tasks.text.corpus import synthetic_news
    from tasks.text.data import TextPool, load_agnews

    if source == "synthetic":
        return TextPool(*map(tuple, synthetic_news(per_class, seed)))
    return load_agnews(root, max_samples)


@dataclass(frozen=True)
class TextTask(VisionTask):
    """A text pool (``synthetic`` or ``agnews``) and the default encoder of ``text.encoder`` ''.

    It inherits the vision task's training, evaluation and metrics (they work on any tensors a
    ``SplitModel`` reads) and replaces data, model and trigger."""

    source: str = "synthetic"
    default_encoder: str = "minilm"
    kind = "text"
    smoke = {"text.synthetic-per-class": 20, "text.max-length": 24}

    # --- data and model -------------------------------------------------------------------
    def encoder_name(self, cfg: Config) -> str:
        return cfg["text.encoder"] or self.default_encoder

    def encoder(self, cfg: Config):
        from tasks.text.encoder import load_encoder

        return load_encoder(self.encoder_name(cfg), bool(cfg["download"]))

    def pool(self, cfg: Config):
        return _pool(self.source, data_dir(cfg["data-dir"]), cfg["text.synthetic-per-class"],
                     cfg["text.max-samples"], cfg["seed"])

    def build_text_model(self, cfg: Config, plugins: list[dict], seed: int | None = None):
        from tasks.plugins import attach_plugins
        from tasks.text.encoder import build_text_model

        seed = cfg["seed"] if seed is None else seed
        _, encoder = self.encoder(cfg)
        model = build_text_model(encoder, cfg["text.train-layers"], self.num_classes, seed)
        return attach_plugins(model, plugins or [], seed=seed)

    # --- setup and server side ------------------------------------------------------------
    def check_config(self, cfg: Config) -> None:
        Task.check_config(self, cfg)  # the vision checks' trigger-size (pixels) means nothing here
        for key in ("forget-class", "backdoor-target"):
            if cfg[key] >= self.num_classes:
                raise ConfigError(f"run-config '{key}'={cfg[key]} is outside task '{self.name}': "
                                  f"must be in 0..{self.num_classes - 1}")

    def check_setup(self, cfg: Config, num_clients: int) -> None:
        from tasks.text.encoder import num_layers
        from tasks.text.triggers import trigger_ids

        tokenizer, encoder = self.encoder(cfg)
        layers = num_layers(encoder)
        if cfg["text.train-layers"] > layers:
            raise ConfigError(f"run-config 'text.train-layers'={cfg['text.train-layers']}: encoder "
                              f"{self.encoder_name(cfg)!r} has {layers} layers: must be -1 or in 0..{layers}")
        trigger = trigger_ids(tokenizer, cfg["text.trigger"])
        if len(trigger) + 2 > cfg["text.max-length"]:
            raise ConfigError(f"run-config 'text.trigger'={cfg['text.trigger']!r} has {len(trigger)} tokens: it "
                              f"does not fit in 'text.max-length'={cfg['text.max-length']} with [CLS] and [SEP]")

    def data_fingerprint(self, cfg: Config) -> str:
        return self.pool(cfg).fingerprint

    def check_partition(self, cfg: Config, num_nodes: int) -> None:
        import numpy as np

        from tasks.partition import PartitionError, dirichlet_partitions

        try:
            dirichlet_partitions(np.asarray(self.pool(cfg).labels), num_nodes, cfg["dirichlet-alpha"], cfg["seed"])
        except PartitionError as err:
            raise ConfigError(f"run-config {err}") from None

    def cache_key(self, cfg: Config) -> dict:
        from tasks.text.encoder import encoder_path

        return {**{k: cfg[k] for k in TEXT_KEYS}, "encoder-path": encoder_path(self.encoder_name(cfg))}

    def model_outline(self, cfg: Config, plugins: list[dict] | None = None):
        """Built with weights: the pretrained encoder cannot load on the meta device, and the trained
        top layers and the head are cheap to copy."""
        import torch

        with torch.random.fork_rng():
            return self.build_text_model(cfg, plugins or [], seed=0)

    def server_model(self, cfg: Config, plugins: list[dict], seed: int | None = None):
        return self.build_text_model(cfg, plugins, seed)

    # --- client side ----------------------------------------------------------------------
    def client_view(self, cfg: Config, node: dict):
        if "data-path" in node:
            raise ValueError(f"node config 'data-path' is not supported yet for task '{self.name}': "
                             "use partition-id and num-partitions")
        from tasks.text.encoder import encoder_path

        code = hashlib.sha256(b"".join((ROOT / name).read_bytes() for name in VIEW_CODE)).hexdigest()
        from tasks.stream import view_key_part

        key = {"format": 1, "code": code, "config": {**{k: cfg[k] for k in VIEW_KEYS}, **view_key_part(cfg)},
               "source": {"partition-id": node["partition-id"], "num-partitions": node["num-partitions"]},
               "pool": self.pool(cfg).fingerprint, "encoder": encoder_path(self.encoder_name(cfg))}
        return key, lambda: self.build_view(cfg, node["partition-id"], node["num-partitions"])

    def build_view(self, cfg: Config, partition_id: int, num_partitions: int):
        """This client's ``ClientData``: the request applied to its token ids, then the frozen layers run
        once over every split (``tasks.text.encoder.encode_prefix``)."""
        import dataclasses

        import numpy as np
        import torch

        from tasks.partition import dirichlet_partitions, train_test_split
        from tasks.requests import apply_request, forget_client_and_federation_size
        from tasks.text.data import tokenize
        from tasks.text.encoder import encode_prefix
        from tasks.text.triggers import append_trigger, trigger_ids

        tokenizer, encoder = self.encoder(cfg)
        pool = self.pool(cfg)
        labels = np.asarray(pool.labels)
        parts = dirichlet_partitions(labels, num_partitions, cfg["dirichlet-alpha"], cfg["seed"])
        train_idx, test_idx = train_test_split(parts[partition_id], cfg["test-fraction"], cfg["seed"] + partition_id)
        ids = tokenize(tokenizer, [pool.texts[i] for i in np.concatenate([train_idx, test_idx])],
                       cfg["text.max-length"])
        y = torch.as_tensor(labels[np.concatenate([train_idx, test_idx])], dtype=torch.int64)
        n = len(train_idx)
        phrase = trigger_ids(tokenizer, cfg["text.trigger"])

        def trigger(x: torch.Tensor) -> torch.Tensor:
            return append_trigger(x, phrase, tokenizer.sep_token_id, tokenizer.pad_token_id)

        forget_client, federation_size = forget_client_and_federation_size(cfg, labels, num_partitions)
        data = apply_request(cfg, partition_id, forget_client, (ids[:n], y[:n]), (ids[n:], y[n:]), self.num_classes,
                             trigger=trigger, federation_size=federation_size, ids=torch.as_tensor(train_idx))
        encoded = {f.name: encode_prefix(encoder, getattr(data, f.name), cfg["text.train-layers"])
                   for f in dataclasses.fields(data) if f.name.endswith("_x")}
        return dataclasses.replace(data, **encoded)

    def client_model(self, cfg: Config, state: State, plugins: list[dict]):
        model = self.build_text_model(cfg, plugins)
        model.load_state_dict(state)
        return model


TEXT_MINILM = TextTask("text-minilm", "synthetic-news", "minilm", 4, 0, source="synthetic", default_encoder="minilm",
                       presets={"pretrain-rounds": 10, "local-epochs": 1, "continue-rounds": 5})
AGNEWS_BERT = TextTask("agnews-bert", "ag_news", "bert", 4, 0, source="agnews",
                       default_encoder="huawei-noah/TinyBERT_General_4L_312D",
                       presets={"pretrain-rounds": 10, "local-epochs": 1, "continue-rounds": 5})
