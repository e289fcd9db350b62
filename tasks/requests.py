"""Unlearning requests: how each client derives its own retain / forget / test data.

Every client rebuilds the whole federation's partition from the seed, takes its own share, and
applies the request to it. Raw data never leaves the client; only counts and model outputs do.

Scenarios (the papers' setups):

- ``client``: the forget client leaves. Its data is made measurable by poisoning, because a
  clean client's knowledge is mostly shared with the others: ``label-flip`` (y -> (y+1) mod C,
  FedUP's Byzantine setup) or ``backdoor`` (every sample whose true label is not the backdoor
  target gets the trigger and the target label, Lethe's setup). Its whole training split leaves
  the retained data; the forget set is its flipped or triggered samples. A triggered sample of the
  target class would be a hit for any model that knows the class (with them in the forget set,
  even retrain keeps a U-KR far above 0), so, as in the sample scenario, it is not poisoned: the
  papers' retrain references sit near 0 (Lethe's client table: 0.3 % on LeNet-5), and FedOSD's
  public code relabels every poisoned sample to a class other than its own. While the original
  model is trained, a backdoor client also trains on a clean copy of each of its samples (its
  true label), as a backdoor attacker that keeps the main task does: trained on triggered samples
  alone, a large client teaches the federation to predict the target for everything. A label-flip
  client trains ``poison-epochs`` instead (:meth:`ClientData.local_epochs`).
  The triggered samples are capped at ``backdoor-share`` (0.1) of the federation's training
  samples: a client that holds more triggers a seeded draw of its samples (:func:`poisoned_subset`).
  Lethe's client setup triggers all of one client's data among 10 equal clients, a tenth of the
  federation; the default forget client is the *largest* one, which at alpha 0.1–0.3 holds a
  fifth to a half of the data. Triggering that much can teach the federation to predict the
  target for everything, depending on nothing but the initial weights, and so can a share of 0.2;
  the cap keeps the triggered share at Lethe's tenth.
  With the clients' own files (``tasks.node_data``) no client knows the federation's size: the
  cap is not applied there, and every sample is triggered.
- ``class``: every client forgets its samples of ``forget-class``; their local test samples of
  that class form the *forget test* set, and ``test_acc`` is measured on the other classes.
- ``sample``: ``sample-fraction`` of the forget client's training samples, drawn among those whose
  true label is not the backdoor target (so a hit is the backdoor, never the true class), get the
  trigger and the target label; those samples are the forget set.

The default forget client (-1) is the client with the most training samples: a small client's
poison is drowned by the others and leaves nothing measurable to unlearn.

A stream of requests (``requests``, ``tasks.stream``) sets every request's poisoning up at once
and gives each request its own view of what is left (:func:`apply_stream`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from core.config import Config
from tasks.partition import dirichlet_partitions, train_test_split

EMPTY_X_SHAPE = (0,)


@dataclass
class ClientData:
    """One client's view of the request. ``forget_y`` are the labels the forget set was trained with."""

    client_id: int
    retain_x: torch.Tensor
    retain_y: torch.Tensor
    forget_x: torch.Tensor
    forget_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    forget_test_x: torch.Tensor
    forget_test_y: torch.Tensor
    triggered_test_x: torch.Tensor
    triggered_test_y: torch.Tensor
    pretrain_only_x: torch.Tensor = field(default_factory=lambda: torch.zeros(EMPTY_X_SHAPE))
    pretrain_only_y: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    #: the true labels of the training samples the request takes from this client (before any poisoning):
    #: all of a leaving client's, the chosen ones of the sample scenario, the forget class's
    removed_y: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    #: stable ids of those samples among the node's records (the shared pool's index, or the position in
    #: the node's own training files): what the forget set's hash in the receipt is made of, never the data
    removed_ids: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.int64))
    #: this client's training labels were flipped (a label-flip client of the client scenario)
    label_flipped: bool = False

    def split(self, role: str, *, all_data: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Training data of a role: ``all`` (retain + forget, plus ``pretrain_only``: the backdoor
        client's clean copies, see :func:`apply_request`), ``retain`` or ``forget``. ``all_data``: the
        ``forget`` role also holds the clean copies, so that it is all the data this client trained (a
        method whose forget stream is the leaving client's whole contribution)."""
        if role == "retain":
            return self.retain_x, self.retain_y
        if role == "forget":
            if all_data and len(self.pretrain_only_y):
                return (torch.cat([self.forget_x, self.pretrain_only_x]),
                        torch.cat([self.forget_y, self.pretrain_only_y]))
            return self.forget_x, self.forget_y
        if role == "all":
            parts = [(self.retain_x, self.retain_y), (self.forget_x, self.forget_y)]
            if len(self.pretrain_only_y):
                parts.append((self.pretrain_only_x, self.pretrain_only_y))
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        raise ValueError(f"role {role!r} is unknown: must be all, retain or forget")

    def local_epochs(self, role: str, cfg: Config, epochs: int) -> int:
        """Local epochs of one training round in ``role``: ``epochs``, except for the leaving client of
        the client scenario with ``poison='label-flip'`` while the original model is trained (role
        ``all``), which runs ``poison-epochs`` (0 = ``epochs``): flipped labels contradict the other
        clients' data and are drowned by them at the federation's epochs.

        A backdoor client runs ``epochs`` like everyone else: its clean copies (``pretrain_only``)
        make the trigger learnable without pulling the model to the target class. Without them, a
        large leaving client's triggered samples make the original predict the target for
        everything, at few epochs as at many; with them, the federation's epochs give a clean
        federation's accuracy and learn the trigger, while label-flip's extra poison epochs would
        destroy it again."""
        poisoning = role == "all" and self.label_flipped and len(self.forget_y) > 0
        return (cfg["poison-epochs"] or epochs) if poisoning else epochs

    def counts(self) -> dict[str, int]:
        return {"n-retain": len(self.retain_y), "n-forget": len(self.forget_y), "n-test": len(self.test_y),
                "n-forget-test": len(self.forget_test_y), "n-triggered-test": len(self.triggered_test_y)}


def request_rng(cfg: Config, partition_id: int) -> np.random.Generator:
    """The seeded draw of which samples of client ``partition_id`` a request poisons."""
    return np.random.default_rng(cfg["seed"] + 7919 * (partition_id + 1))


def poisoned_subset(cfg: Config, candidates: np.ndarray, partition_id: int, federation_size: int | None) -> np.ndarray:
    """The leaving backdoor client's samples that get the trigger (client scenario): all
    ``candidates``, or, when they exceed ``backdoor-share`` of the federation's ``federation_size``
    training samples, a seeded draw of that many (in index order). ``None``: the size is unknown
    (clients' own files), nothing is capped."""
    if federation_size is None:
        return candidates
    cap = max(1, int(cfg["backdoor-share"] * federation_size))
    if len(candidates) <= cap:
        return candidates
    return np.sort(request_rng(cfg, partition_id).choice(candidates, size=cap, replace=False))


def partition_train_sizes(cfg: Config, labels: np.ndarray, num_partitions: int) -> list[int]:
    """Training-split size of every client (what the default forget client is chosen by)."""
    parts = dirichlet_partitions(labels, num_partitions, cfg["dirichlet-alpha"], cfg["seed"])
    return [len(train_test_split(p, cfg["test-fraction"], cfg["seed"] + i)[0]) for i, p in enumerate(parts)]


def resolve_forget_client(cfg: Config, labels: np.ndarray, num_partitions: int) -> int:
    """The configured forget client, or the largest one for -1 (ties: lowest id)."""
    return forget_client_and_federation_size(cfg, labels, num_partitions)[0]


def forget_client_and_federation_size(cfg: Config, labels: np.ndarray, num_partitions: int) -> tuple[int, int]:
    """What a client's view needs of the whole partition, from one pass over it: the forget client
    (:func:`resolve_forget_client`) and the federation's training samples (the backdoor cap's base,
    :func:`poisoned_subset`)."""
    sizes = partition_train_sizes(cfg, labels, num_partitions)
    forget_client = cfg["forget-client"] if cfg["forget-client"] >= 0 else int(np.argmax(sizes))
    return forget_client, sum(sizes)


def uses_trigger(cfg: Config) -> bool:
    """Whether the request plants a backdoor (so triggered test samples measure it)."""
    return cfg["scenario"] == "sample" or (cfg["scenario"] == "client" and cfg["poison"] == "backdoor")


def build_client_data(cfg: Config, images, partition_id: int, num_partitions: int) -> ClientData:
    """Apply the run's request to client ``partition_id`` of an ``ImageData`` training pool."""
    labels = images.y.numpy()
    parts = dirichlet_partitions(labels, num_partitions, cfg["dirichlet-alpha"], cfg["seed"])
    train_idx, test_idx = train_test_split(parts[partition_id], cfg["test-fraction"], cfg["seed"] + partition_id)
    forget_client, federation_size = forget_client_and_federation_size(cfg, labels, num_partitions)
    return apply_request(cfg, partition_id, forget_client,
                         (images.x[train_idx], images.y[train_idx]), (images.x[test_idx], images.y[test_idx]),
                         images.num_classes, federation_size=federation_size, ids=torch.as_tensor(train_idx))


def apply_request(cfg: Config, partition_id: int, forget_client: int, train: tuple[torch.Tensor, torch.Tensor],
                  test: tuple[torch.Tensor, torch.Tensor], num_classes: int,
                  trigger: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  federation_size: int | None = None, ids: torch.Tensor | None = None) -> ClientData:
    """Apply the run's request to one client's own (training, local test) data: client
    ``partition_id``, with ``forget_client`` the client the client/sample scenario selects.
    ``trigger(x)`` plants the backdoor in samples ``x``; default: the vision trigger square of
    ``trigger-size`` (a text task appends its trigger phrase). ``federation_size``: the
    federation's training samples, which cap a backdoor client's triggered samples (None: unknown,
    no cap). ``ids``: a stable id of each training sample (default: its position in ``train``). In a
    stream of requests (``requests``) the view is that of the config's request (:func:`apply_stream`)."""
    if trigger is None:
        from tasks.vision.triggers import apply_trigger

        def trigger(samples: torch.Tensor) -> torch.Tensor:
            return apply_trigger(samples, cfg["trigger-size"])

    from tasks.stream import is_stream

    if is_stream(cfg):
        return apply_stream(cfg, partition_id, forget_client, train, test, num_classes, trigger, federation_size, ids)
    (x, y), (tx, ty) = train, test
    removal = _removal(cfg, cfg["scenario"], cfg["forget-class"], partition_id, forget_client, x, y, num_classes,
                       trigger, federation_size)
    test_keep = ty != cfg["forget-class"] if cfg["scenario"] == "class" else torch.ones(len(ty), dtype=torch.bool)
    pretrain_only = (x, y) if removal.clean_copies else (x[:0], y[:0])
    return _client_data(cfg, partition_id, (x, y), (tx, ty), ~removal.mask, (removal.fx, removal.fy), test_keep,
                        ~test_keep, pretrain_only, removal.mask, uses_trigger(cfg), trigger, removal.label_flipped, ids)


@dataclass
class Removal:
    """What one request takes from one client's training samples: ``mask`` (they leave the retained
    data), the forget set as it was trained (``fx``, ``fy``: poisoned where the request poisons; the
    samples at ``forget_idx``), whether pretraining also saw clean copies of the masked samples
    (a backdoor client) and whether the labels were flipped (a label-flip client)."""

    mask: torch.Tensor
    forget_idx: torch.Tensor
    fx: torch.Tensor
    fy: torch.Tensor
    clean_copies: bool = False
    label_flipped: bool = False


def _removal(cfg: Config, scenario: str, forget_class: int, partition_id: int, forget_client: int,
             x: torch.Tensor, y: torch.Tensor, num_classes: int, trigger, federation_size: int | None) -> Removal:
    """The :class:`Removal` of one request (``scenario``; ``forget_class`` for a class, ``forget_client``
    for a client or samples) on client ``partition_id``'s training samples ``(x, y)``."""
    target = cfg["backdoor-target"]
    nothing = torch.zeros(0, dtype=torch.int64)
    if scenario == "class":
        mask = y == forget_class
        return Removal(mask, torch.nonzero(mask).flatten(), x[mask], y[mask])
    if partition_id != forget_client:
        return Removal(torch.zeros(len(y), dtype=torch.bool), nothing, x[:0], y[:0])
    if scenario == "client":
        mask = torch.ones(len(y), dtype=torch.bool)
        if cfg["poison"] == "label-flip":
            return Removal(mask, torch.arange(len(y)), x, (y + 1) % num_classes, label_flipped=True)
        candidates = np.flatnonzero((y != target).numpy())
        if not len(candidates):
            raise ValueError(f"forget-client {partition_id} holds only samples of backdoor-target {target}: "
                             "its backdoor would be measurable on nothing; choose another forget-client or "
                             "backdoor-target")
        poisoned = torch.as_tensor(poisoned_subset(cfg, candidates, partition_id, federation_size))
        return Removal(mask, poisoned, trigger(x[poisoned]), torch.full((len(poisoned),), target), clean_copies=True)
    candidates = np.flatnonzero((y != target).numpy())
    n_forget = min(len(candidates), max(1, int(round(cfg["sample-fraction"] * len(y)))))
    chosen = request_rng(cfg, partition_id).choice(candidates, size=n_forget, replace=False)
    mask = torch.zeros(len(y), dtype=torch.bool)
    mask[torch.as_tensor(chosen)] = True
    return Removal(mask, torch.nonzero(mask).flatten(), trigger(x[mask]), torch.full((n_forget,), target))


def _client_data(cfg: Config, partition_id: int, train, test, retain_mask: torch.Tensor, forget,
                 test_mask: torch.Tensor, forget_test_mask: torch.Tensor, pretrain_only, removed_mask: torch.Tensor,
                 triggered: bool, trigger, label_flipped: bool, ids: torch.Tensor | None = None) -> ClientData:
    """The :class:`ClientData` of the given masks (training: retained, removed; local test: test,
    forget test), forget set and clean copies; ``triggered``: with the triggered test samples;
    ``ids``: the training samples' stable ids (default: their positions)."""
    (x, y), (tx, ty), (fx, fy) = train, test, forget
    non_target = ty != cfg["backdoor-target"]
    if triggered:
        trig_x, trig_y = trigger(tx[non_target]), ty[non_target]
    else:
        trig_x, trig_y = tx[:0], ty[:0]
    return ClientData(
        client_id=partition_id,
        retain_x=x[retain_mask], retain_y=y[retain_mask],
        forget_x=fx, forget_y=fy.to(torch.int64),
        test_x=tx[test_mask], test_y=ty[test_mask],
        forget_test_x=tx[forget_test_mask], forget_test_y=ty[forget_test_mask],
        triggered_test_x=trig_x, triggered_test_y=trig_y,
        pretrain_only_x=pretrain_only[0], pretrain_only_y=pretrain_only[1].to(torch.int64),
        removed_y=y[removed_mask].to(torch.int64),
        removed_ids=(torch.arange(len(y)) if ids is None else torch.as_tensor(ids))[removed_mask].to(torch.int64),
        label_flipped=label_flipped,
    )


def apply_stream(cfg: Config, partition_id: int, forget_client: int, train: tuple[torch.Tensor, torch.Tensor],
                 test: tuple[torch.Tensor, torch.Tensor], num_classes: int, trigger,
                 federation_size: int | None, ids: torch.Tensor | None = None) -> ClientData:
    """This client's view of request ``k`` of a stream (``tasks.stream``; ``k`` = the config's
    request index, 0 = the federation as set up, before any request).

    Every request's removal is computed on the client's raw samples; a request without a client id
    names ``forget_client`` (the run's, -1 resolved). View 0 trains on everything, each poisoned
    sample as poisoned (plus a backdoor client's clean copies). View ``k``: the forget set is request
    ``k``'s, less the samples an earlier request removed; the retained data is what no request up to
    ``k`` removed; the local test split leaves out every class removed up to ``k``, and its forget
    test holds request ``k``'s class."""
    from tasks.stream import parse_requests, plants_trigger, request_index

    (x, y), (_, ty) = train, test
    requests, index = parse_requests(cfg), request_index(cfg) or 0
    removals = [_removal(cfg, r.scenario, r.target, partition_id, forget_client if r.target < 0 else r.target,
                         x, y, num_classes, trigger, federation_size) for r in requests]
    label_flipped = any(r.label_flipped for r in removals)
    nothing = torch.zeros(len(y), dtype=torch.bool)
    if index == 0:
        poisoned = [r for r, request in zip(removals, requests) if request.scenario != "class"]
        out = nothing.clone()
        for r in poisoned:
            out |= r.mask
        forget = (torch.cat([x[:0], *[r.fx for r in poisoned]]), torch.cat([y[:0], *[r.fy for r in poisoned]]))
        clean = [r.mask for r in poisoned if r.clean_copies]
        pretrain_only = (torch.cat([x[:0], *[x[m] for m in clean]]), torch.cat([y[:0], *[y[m] for m in clean]]))
        return _client_data(cfg, partition_id, train, test, ~out, forget, torch.ones(len(ty), dtype=torch.bool),
                            torch.zeros(len(ty), dtype=torch.bool), pretrain_only, nothing, False, trigger,
                            label_flipped, ids)
    before = nothing.clone()
    for r in removals[:index - 1]:
        before |= r.mask
    current, request = removals[index - 1], requests[index - 1]
    keep = ~before[current.forget_idx]
    removed = current.mask & ~before
    pretrain_only = (x[removed], y[removed]) if current.clean_copies else (x[:0], y[:0])
    gone = torch.as_tensor([r.target for r in requests[:index] if r.scenario == "class"], dtype=ty.dtype)
    forget_test = (ty == request.target) if request.scenario == "class" else torch.zeros(len(ty), dtype=torch.bool)
    return _client_data(cfg, partition_id, train, test, ~(before | current.mask), (current.fx[keep], current.fy[keep]),
                        ~torch.isin(ty, gone), forget_test, pretrain_only, removed, plants_trigger(cfg, request),
                        trigger, label_flipped, ids)
