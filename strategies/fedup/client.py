"""FedUP's client side (the FedUP paper, sec. 3.2.2 and 3.2.4): DP class centroids of the client's features.

With the frozen extractor (and any earlier plug-ins) of the received model, the client embeds its
data, optionally clips every feature to ``fedup.clip`` (default: no clipping, as the paper),
compresses each class into ceil(rho * n) KMeans centroids, and adds Gaussian noise whose scale is
``fedup.sigma`` or is calibrated to (``fedup.epsilon``, ``fedup.delta``) at the sensitivity of
``fedup.dp-bound``. ``fedup.delta=0`` is ``1/n_i``, ``n_i`` this client's released samples. It
replies with centroids, labels, cluster sizes, a ``forget`` flag per centroid and the privacy it spent.

Forget features (``fedup.forget-centroids``):

* ``paper`` (default): the client and sample scenarios drop them before anything is computed
  (eq. 8): the leaving client of the client scenario holds nothing else and is not asked at all;
  the sample scenario's forget client releases its other samples only. The class scenario relabels
  the forgotten class's features to one random other class per client (official code; paper sec.
  4.2) and clusters them with that class's retained features; nothing is flagged.
* ``drop``: dropped in every scenario.
* ``divert``: kept in every scenario, clustered apart from the retained features and flagged, so the
  server can point them away from their label (``fedup.targets``).
"""

from __future__ import annotations

import math
import time

import torch

from core.config import Config
from strategies.fedup.centroids import (
    add_gaussian_noise,
    class_centroids,
    clip_rows,
    feature_diameter,
    relabel_per_class,
)
from strategies.fedup.maths import (
    calibrate_sigma,
    centroid_sensitivity,
    epsilon_spent,
    paper_eq22_epsilon,
    resolve_delta,
)
from tasks.requests import ClientData
from tasks.training import penultimate_features

RHO_BY_SCENARIO = {"client": 0.8, "class": 0.1, "sample": 0.5}


def fedup_rho(cfg: Config) -> float:
    """``fedup.rho``, or the paper's value for the scenario when it is 0."""
    return cfg["fedup.rho"] or RHO_BY_SCENARIO[cfg["scenario"]]


def forget_handling(cfg: Config) -> str:
    """What this run does with forget features: ``drop``, ``relabel`` (class scenario, paper) or ``divert``."""
    mode = cfg["fedup.forget-centroids"]
    if mode == "paper":
        return "relabel" if cfg["scenario"] == "class" else "drop"
    return mode


def centroid_query(task, cfg: Config, data: ClientData, model: torch.nn.Module, conf: dict, seed: int) -> dict:
    """The registered ``query.centroids`` handler (``tasks.base``'s query signature)."""
    return centroid_release(cfg, data, model)


def _empty_reply(feature_dim: int, started: float, **metrics) -> dict:
    """No centroids (the server drops the empty upload with a warning); ``skipped`` = 1."""
    empty = torch.zeros(0, dtype=torch.long)
    return {"centroids": {"centroids": torch.zeros(0, feature_dim), "labels": empty, "counts": empty,
                          "forget": empty},
            "metrics": {"num-examples": 0, "sigma": 0.0, "epsilon": math.inf, "delta": 0.0,
                        "epsilon-eq22": math.inf, "epsilon-fixed-clusters": math.inf, "sensitivity": 0.0,
                        "num-centroids": 0, "seconds": time.perf_counter() - started, "skipped": 1, **metrics}}


def centroid_release(cfg: Config, data: ClientData, model: torch.nn.Module) -> dict:
    """The ``query.centroids`` reply of one client: ``centroids`` (tensors) and ``metrics``
    (numbers; ``seconds``: its compute time; ``dropped`` / ``relabelled``: forget samples not sent /
    sent under another label)."""
    started = time.perf_counter()
    seed = cfg["seed"] * 7919 + data.client_id
    handling = forget_handling(cfg)
    n_forget = len(data.forget_y)
    clip = cfg["fedup.clip"]
    # (features, labels, flag): what is clustered, each part separately
    parts = []
    if handling == "relabel":
        relabelled = relabel_per_class(data.forget_y, cfg.num_classes, seed=seed)
        kept = [(x, y) for x, y in ((data.retain_x, data.retain_y), (data.forget_x, relabelled)) if len(y)]
        if kept:
            parts.append((torch.cat([x for x, _ in kept]), torch.cat([y for _, y in kept]), 0))
    else:
        parts.append((data.retain_x, data.retain_y, 0))
        if handling == "divert":
            parts.append((data.forget_x, data.forget_y, 1))
    features = [(clip_rows(penultimate_features(model, x), clip), y, flag) for x, y, flag in parts if len(y)]
    counters = {"dropped": n_forget if handling == "drop" else 0,
                "relabelled": n_forget if handling == "relabel" else 0}
    feature_dim = model.feature_dim
    if not features:
        return _empty_reply(feature_dim, started, **counters)
    everything = torch.cat([z for z, _, _ in features])
    diameter = feature_diameter(everything)
    n_used = len(everything)
    bound = cfg["fedup.dp-bound"]
    noise = cfg["fedup.sigma"] > 0 or math.isfinite(cfg["fedup.epsilon"])
    if noise and ((bound == "eq21" and not diameter > 0) or (not cfg["fedup.delta"] and n_used < 2)):
        # one sample (or all features equal): eq. 21's sensitivity is 0 and delta = 1/n is 1; nothing
        # can be calibrated, so nothing is released
        return _empty_reply(feature_dim, started, **counters)
    centroids, labels, counts, flags = [], [], [], []
    for z, y, flag in features:
        c, l, n = class_centroids(z, y, rho=fedup_rho(cfg), seed=seed + flag)
        centroids.append(c), labels.append(l), counts.append(n)
        flags.append(torch.full((len(l),), flag, dtype=torch.long))
    centroids, labels, counts, flags = (torch.cat(t) for t in (centroids, labels, counts, flags))
    sigma, epsilon, eq22, cluster_epsilon, sensitivity = 0.0, math.inf, math.inf, math.inf, 0.0
    delta = cfg["fedup.delta"] or (1.0 / n_used if n_used >= 2 else 0.0)
    if noise:
        sensitivity = centroid_sensitivity(clip, counts, bound=bound, diameter=diameter)
        delta = resolve_delta(cfg["fedup.delta"], n_used)
        sigma = cfg["fedup.sigma"] or calibrate_sigma(cfg["fedup.epsilon"], delta, sensitivity)
        epsilon = epsilon_spent(sigma, delta, sensitivity)
        eq22 = paper_eq22_epsilon(sigma, n_used, sensitivity)
        # the same noise read with a per-cluster count (each centroid moves by diameter / its cluster size)
        per_cluster = diameter / int(counts.min())
        cluster_epsilon = epsilon_spent(sigma, delta, per_cluster) if per_cluster > 0 else math.inf
    noisy = add_gaussian_noise(centroids, sigma, seed=seed + 1) if sigma > 0 else centroids
    return {
        "centroids": {"centroids": noisy.float(), "labels": labels.long(), "counts": counts.long(), "forget": flags},
        "metrics": {"num-examples": n_used, "sigma": float(sigma), "epsilon": float(epsilon), "delta": float(delta),
                    "epsilon-eq22": float(eq22), "epsilon-fixed-clusters": float(cluster_epsilon),
                    "sensitivity": float(sensitivity), "diameter": float(diameter),
                    "num-centroids": int(len(labels)), "seconds": time.perf_counter() - started, "skipped": 0,
                    **counters},
    }
