"""FedUP's client side (the FedUP paper, sec. 3.2.2): DP class centroids of the retained features.

With the frozen extractor (and any earlier plug-ins) of the received model, the client embeds its
retained data, clips every feature to ``fedup-clip``, compresses each class into ceil(rho * n)
KMeans centroids, and adds Gaussian noise whose scale is ``fedup-sigma`` or is calibrated to
(``fedup-epsilon``, ``fedup-delta``). It replies with centroids, labels, cluster sizes, a
``forget`` flag per centroid and the privacy it spent.

Forget features (``fedup-forget-centroids``): the paper drops them (eq. 8) except in the class
scenario, where the forgotten class's features are kept and relabelled to other classes (sec.
4.2) so the filter learns to *divert* them. ``divert`` (default) applies that same rule to every
scenario: the forget set's features are compressed the same way, flagged, and the server trains
the filter to send them away from the label they were trained with (the flipped label, the
backdoor target, the forgotten class). Measured on digits: with ``drop`` the filter leaves a
backdoor intact (forget accuracy 1.0 after unlearning), because nothing in the retained centroids
tells it what to block. ``drop`` is the paper's literal eq. 8.
"""

from __future__ import annotations

import math
import time

import torch

from strategies.fedup.maths import calibrate_sigma, centroid_sensitivity, epsilon_spent, paper_eq22_epsilon
from strategies.fedup.centroids import add_gaussian_noise, class_centroids, clip_rows
from tasks.config import Config
from tasks.requests import ClientData
from tasks.training import penultimate_features

RHO_BY_SCENARIO = {"client": 0.8, "class": 0.1, "sample": 0.5}


def fedup_rho(cfg: Config) -> float:
    """``fedup-rho``, or the paper's value for the scenario when it is 0."""
    return cfg["fedup-rho"] or RHO_BY_SCENARIO[cfg["scenario"]]


def centroid_query(task, cfg: Config, data: ClientData, model: torch.nn.Module, conf: dict, seed: int) -> dict:
    """The registered ``query.centroids`` handler (``tasks.base``'s query signature)."""
    return centroid_release(cfg, data, model)


def centroid_release(cfg: Config, data: ClientData, model: torch.nn.Module) -> dict:
    """The ``query.centroids`` reply of one client: ``centroids`` (tensors) and ``metrics``
    (numbers; ``seconds``: its compute time)."""
    started = time.perf_counter()
    seed = cfg["seed"] * 7919 + data.client_id
    parts = [(data.retain_x, data.retain_y, False)]
    if cfg["fedup-forget-centroids"] == "divert":
        parts.append((data.forget_x, data.forget_y, True))
    centroids, labels, counts, flags = [], [], [], []
    for x, y, is_forget in parts:
        if len(y) == 0:
            continue
        features = clip_rows(penultimate_features(model, x), cfg["fedup-clip"])
        c, l, n = class_centroids(features, y, rho=fedup_rho(cfg), seed=seed + int(is_forget))
        centroids.append(c), labels.append(l), counts.append(n)
        flags.append(torch.full((len(l),), int(is_forget), dtype=torch.long))
    centroids, labels, counts, flags = (torch.cat(t) for t in (centroids, labels, counts, flags))
    n_used = int(counts.sum())
    sensitivity = centroid_sensitivity(cfg["fedup-clip"], counts, bound=cfg["fedup-dp-bound"])
    delta = cfg["fedup-delta"]
    sigma = cfg["fedup-sigma"] or calibrate_sigma(cfg["fedup-epsilon"], delta, sensitivity)
    noisy = add_gaussian_noise(centroids, sigma, seed=seed + 1) if sigma > 0 else centroids
    epsilon = epsilon_spent(sigma, delta, sensitivity) if sigma > 0 else math.inf
    eq22 = paper_eq22_epsilon(sigma, n_used, sensitivity) if sigma > 0 else math.inf
    return {
        "centroids": {"centroids": noisy.float(), "labels": labels.long(), "counts": counts.long(), "forget": flags},
        "metrics": {"num-examples": n_used, "sigma": float(sigma), "epsilon": float(epsilon), "delta": float(delta),
                    "epsilon-eq22": float(eq22), "sensitivity": float(sensitivity), "num-centroids": int(len(labels)),
                    "seconds": time.perf_counter() - started},
    }
