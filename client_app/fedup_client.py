"""FedUP's client side (paper 000, sec. 3.2.2): DP class centroids of the retained features.

With the frozen extractor (and any earlier plug-ins) of the received model, the client embeds its
data, drops its forget set — except in the class scenario, where the forgotten class's features
are kept (the server diverts them to the other classes, paper sec. 4.2) — clips every feature to
``fedup-clip``, compresses each class into ceil(rho * n) KMeans centroids, and adds Gaussian
noise whose scale is ``fedup-sigma`` or is calibrated to (``fedup-epsilon``, ``fedup-delta``).
It replies with centroids, labels, cluster sizes and the privacy it spent.
"""

from __future__ import annotations

import math
import time

import torch
from flwr.app import ArrayRecord, MetricRecord, RecordDict

from strategies.fedup_math import calibrate_sigma, centroid_sensitivity, epsilon_spent, paper_eq22_epsilon
from tasks.centroids import add_gaussian_noise, class_centroids, clip_rows
from tasks.config import Config
from tasks.requests import ClientData
from tasks.training import penultimate_features

RHO_BY_SCENARIO = {"client": 0.8, "class": 0.1, "sample": 0.5}


def fedup_rho(cfg: Config) -> float:
    """``fedup-rho``, or the paper's value for the scenario when it is 0."""
    return cfg["fedup-rho"] or RHO_BY_SCENARIO[cfg["scenario"]]


def centroid_release(cfg: Config, data: ClientData, model: torch.nn.Module) -> RecordDict:
    """The ``query.centroids`` reply content of one client (``seconds``: its compute time)."""
    started = time.perf_counter()
    x, y = data.retain_x, data.retain_y
    if cfg["scenario"] == "class":
        x, y = torch.cat([x, data.forget_x]), torch.cat([y, data.forget_y])
    features = clip_rows(penultimate_features(model, x), cfg["fedup-clip"])
    seed = cfg["seed"] * 7919 + data.client_id
    centroids, labels, counts = class_centroids(features, y, rho=fedup_rho(cfg), seed=seed)
    sensitivity = centroid_sensitivity(cfg["fedup-clip"], counts, bound=cfg["fedup-dp-bound"])
    delta = cfg["fedup-delta"]
    sigma = cfg["fedup-sigma"] or calibrate_sigma(cfg["fedup-epsilon"], delta, sensitivity)
    noisy = add_gaussian_noise(centroids, sigma, seed=seed + 1) if sigma > 0 else centroids
    epsilon = epsilon_spent(sigma, delta, sensitivity) if sigma > 0 else math.inf
    eq22 = paper_eq22_epsilon(sigma, len(y), sensitivity) if sigma > 0 else math.inf
    return RecordDict({
        "centroids": ArrayRecord({"centroids": noisy.float(), "labels": labels.long(), "counts": counts.long()}),
        "metrics": MetricRecord({"num-examples": len(y), "sigma": float(sigma), "epsilon": float(epsilon),
                                 "delta": float(delta), "epsilon-eq22": float(eq22),
                                 "sensitivity": float(sensitivity), "num-centroids": int(len(labels)),
                                 "seconds": time.perf_counter() - started}),
    })
