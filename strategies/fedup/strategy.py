"""FedUP (the FedUP paper): one-shot unlearning with DP class centroids and a reversible plug-in filter.

One round: the clients that hold something to release receive the model and answer
``query.centroids`` with noised class centroids (``strategies.fedup.client``): in the client and
sample scenarios the clients with retained data (the leaving client of the client scenario holds
none and is not asked), in the class scenario every client with data (the forgotten class's
features relabelled on the client). The server drops malformed uploads (NaN/Inf, wrong width,
labels outside the task, empty) with a warning, concatenates the rest (eq. 12), and trains a fresh
encoder-decoder filter on them with alpha*CE + (1-alpha)*MSE (eqs. 16-19), extractor, earlier
plug-ins and head frozen. The filter is appended to the model's plug-ins, between extractor and
head; the base weights are never touched.

With ``fedup.forget-centroids=divert`` (not the paper's) the forget centroids come flagged and get
one random other class each (``fedup.targets=random``) or targets spread over the other classes
(``soft``, see ``strategies.fedup.centroids.divert_targets``).

Several requests **stack** (a stream of requests, ``requests``): each adds its own filter after the
existing ones, trained on the features those produce and on the earlier requests' forget centroids,
which it leaves as it finds them (``strategies.fedup.stacking``). ``restore`` removes the filter this request
added (the last one) and gives back exactly the model the request started from; ``unplug`` removes
any one request's filter alone and keeps the others where they are (the later filters then receive
the features the earlier ones produce without it).
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from strategies.common.base import ModelState, UnlearnContext, UnlearnResult, UnlearningMethod, without_plugins
from strategies.common.federation import RunStopped
from strategies.fedup.maths import aggregate_centroids, validate_centroid_upload
from strategies.fedup.centroids import divert_targets, relabel_forget_rows
from strategies.fedup.client import forget_handling
from strategies.fedup.filter import FILTER_KIND, train_filter
from strategies.fedup.settings import filter_lr
from strategies.fedup.stacking import earlier_rows, forget_rows
from tasks.model import PLUGIN_PREFIX
from tasks.plugins import specs_to_json

log = logging.getLogger("fedunlearn")


#: what results.json keeps of each client's reply (``method.privacy.clients``)
PRIVACY_KEYS = ("epsilon", "epsilon-eq22", "epsilon-fixed-clusters", "delta", "sigma", "sensitivity",
                "num-examples", "num-centroids", "dropped", "relabelled", "seconds")


class NoUsableCentroids(RunStopped):
    """No retained client sent a usable centroid upload."""


class FedUP(FedAvg, UnlearningMethod):
    """Server side of FedUP; reversible."""

    name = "fedup"
    reversible = True
    stacks = True

    def __init__(self):
        super().__init__(fraction_train=0.0, fraction_evaluate=0.0)
        #: plug-in index of each filter this run trained -> its request's forget centroids as received
        #: (the features at that filter's input), which later filters leave as they find them
        #: (``strategies.fedup.stacking``)
        self.forget_centroids: dict[int, torch.Tensor] = {}

    def collect(self, ctx: UnlearnContext) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Query the releasing clients once; validated, concatenated centroids and privacy report."""
        cfg, fed = ctx.cfg, ctx.fed
        role_key = "n-retain" if forget_handling(cfg) == "drop" else "n-all"
        content = RecordDict({"arrays": ctx.original.arrays,
                              "config": ConfigRecord({"plugins": specs_to_json(ctx.original.plugins)})})
        replies = fed.broadcast(fed.nodes_with(role_key), "query.centroids", content, round_no=1)
        fed.cost(fed.phase).rounds += 1
        feature_dim = ctx.model_factory(ctx.original.plugins).feature_dim
        uploads, privacy, dropped = [], {}, {}
        for reply in replies:
            client = fed.client_id(reply.metadata.src_node_id)
            record = reply.content["centroids"].to_torch_state_dict()
            reason = validate_centroid_upload(record.get("centroids", torch.zeros(0)),
                                              record.get("labels", torch.zeros(0)),
                                              feature_dim=feature_dim, num_classes=cfg.num_classes)
            flags = record.get("forget")
            if reason is None and (flags is None or flags.shape != record["labels"].shape
                                   or bool(((flags != 0) & (flags != 1)).any())):
                reason = "forget flags missing, mis-shaped or not 0/1"
            if reason is not None:
                log.warning("[fedup] dropping the upload of client %d: %s", client, reason)
                dropped[client] = reason
                continue
            uploads.append((record["centroids"], record["labels"], record["forget"].bool()))
            metrics = reply.content["metrics"]
            privacy[client] = {k: metrics[k] for k in PRIVACY_KEYS if k in metrics}
        if not uploads:
            raise NoUsableCentroids("phase 'unlearn': no retained client sent usable centroids "
                                    f"({len(dropped)} upload(s) dropped): FedUP cannot train its filter")
        centroids, labels = aggregate_centroids([(c, y) for c, y, _ in uploads])
        forget = torch.cat([f for _, _, f in uploads])
        return centroids, labels, forget, {"clients": privacy, "dropped": dropped}

    def targets(self, ctx: UnlearnContext, labels: torch.Tensor, forget: torch.Tensor) -> torch.Tensor:
        """Training targets: the labels; with ``divert``, flagged centroids pointed at the other classes."""
        cfg = ctx.cfg
        if not bool(forget.any()):
            return labels
        if cfg["fedup.targets"] == "soft":
            return divert_targets(labels, forget, cfg.num_classes)
        return relabel_forget_rows(labels, forget, cfg.num_classes, seed=cfg["seed"])

    def training_rows(self, ctx: UnlearnContext, model: torch.nn.Module, centroids: torch.Tensor,
                      targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The new filter's training rows and targets: this request's centroids, then the rows of the
        earlier requests' forget centroids it leaves as it finds them (``strategies.fedup.stacking``),
        and how many of those there are."""
        cfg = ctx.cfg
        removed_class = cfg["forget-class"] if cfg["scenario"] == "class" else None
        earlier, classes = earlier_rows(model.plugins[:-1], model.head, self.forget_centroids, removed_class)
        if not len(earlier):
            return centroids, targets, 0
        if targets.ndim == 2:  # soft targets
            classes = torch.nn.functional.one_hot(classes, cfg.num_classes).float()
        return torch.cat([centroids, earlier]), torch.cat([targets, classes]), len(earlier)

    def unlearn(self, ctx: UnlearnContext) -> UnlearnResult:
        cfg = ctx.cfg
        centroids, labels, forget, privacy = self.collect(ctx)
        spec = {"kind": FILTER_KIND, "bottleneck": cfg["fedup.bottleneck"], "shape": cfg["fedup.filter"],
                "seed": cfg["seed"]}
        plugins = ctx.original.plugins + [spec]
        model = ctx.model_factory(plugins)
        model.load_state_dict({**model.state_dict(), **ctx.original.arrays.to_torch_state_dict()})
        inputs, targets, earlier = self.training_rows(ctx, model, centroids, self.targets(ctx, labels, forget))
        relabelled = cfg["forget-class"] if forget_handling(cfg) == "relabel" else None
        self.forget_centroids[len(plugins) - 1] = centroids[forget_rows(model.head, centroids, forget, relabelled)]
        started = time.perf_counter()
        history = train_filter(model.plugins[-1], model.head, inputs, targets,
                               alpha=cfg["fedup.alpha"], epochs=cfg["fedup.epochs"], lr=filter_lr(cfg),
                               batch_size=cfg["fedup.batch-size"], optimizer=cfg["fedup.optimizer"],
                               seed=cfg["seed"])
        filter_seconds = time.perf_counter() - started
        epsilons = [c["epsilon"] for c in privacy["clients"].values()]
        log.info("[fedup] filter trained on %d centroids from %d clients (lr %g); max client epsilon %s",
                 len(labels), len(privacy["clients"]), filter_lr(cfg), max(epsilons))
        details = {"privacy": privacy, "filter_seconds": round(filter_seconds, 4),
                   "centroid_seconds": {c: round(p["seconds"], 4) for c, p in privacy["clients"].items()},
                   "num_centroids": int(len(labels)), "num_forget_centroids": int(forget.sum()),
                   "num_kept_forget_centroids": len(self.forget_centroids[len(plugins) - 1]),
                   "num_earlier_forget_rows": earlier,
                   "forget_features": forget_handling(cfg), "filter_lr": filter_lr(cfg),
                   "centroids_per_class": dict(sorted(Counter(labels.tolist()).items())),
                   "filter_final_loss": {k: v[-1] for k, v in history.items()},
                   "max_epsilon": max(epsilons) if all(math.isfinite(e) for e in epsilons) else None}
        # the base tensors are the original's own (not a round trip through the module, which would
        # cast e.g. averaged BatchNorm counters), so unplugging gives the original bit for bit
        prefix = f"{PLUGIN_PREFIX}{len(plugins) - 1}."
        new_filter = {k: v for k, v in model.state_dict().items() if k.startswith(prefix)}
        state = {**ctx.original.arrays.to_torch_state_dict(), **new_filter}
        return UnlearnResult(ModelState(ArrayRecord(state), plugins), details)

    def restore(self, unlearned: ModelState, ctx: UnlearnContext) -> ModelState:
        """Unplug the filter this request added: the model it started from, bit for bit."""
        return without_plugins(unlearned, [len(unlearned.plugins) - 1])
