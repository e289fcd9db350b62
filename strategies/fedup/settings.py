"""FedUP's run-config keys (``fedup-*``): centroids and their privacy, the filter and its training."""

from __future__ import annotations

import math

from tasks.config import Setting, at_least, in_range, one_of, open_unit, positive, setting

OPTIMIZERS = ("adam", "sgd")

SETTINGS: tuple[Setting, ...] = (
    setting("fedup-rho", float, 0.0,
        "KMeans clusters per class = ceil(rho * n); 0 = paper default by scenario (0.8/0.1/0.5)",
        ((lambda v: 0 <= v <= 1), "0 (scenario default) or in (0, 1]")),
    setting("fedup-clip", float, 20.0, "L2 bound that every feature vector is clipped to before KMeans",
        positive()),
    setting("fedup-sigma", float, 0.0, "centroid noise std; 0 = calibrate from fedup-epsilon/fedup-delta",
        at_least(0)),
    setting("fedup-epsilon", float, math.inf,
        "target (epsilon, delta)-DP of each client's upload; inf = no noise (the paper's released setting)",
        positive(), allow_inf=True),
    setting("fedup-delta", float, 1e-5, "delta of the DP target", open_unit(False)),
    setting("fedup-dp-bound", str, "fixed-clusters",
        "sensitivity bound: fixed-clusters (paper: assignment taken as fixed) or any-clustering (safe)",
        one_of(("fixed-clusters", "any-clustering"))),
    setting("fedup-bottleneck", int, 32, "filter bottleneck width (paper Table 5)", positive()),
    setting("fedup-alpha", float, 0.8,
        "filter loss = alpha*CE + (1-alpha)*reconstruction (paper: 0.5; 0.8 measured to block backdoors)",
        in_range(0, 1)),
    setting("fedup-epochs", int, 200, "server-side filter training epochs", positive()),
    setting("fedup-lr", float, 3e-3, "filter learning rate", positive()),
    setting("fedup-batch-size", int, 256, "filter mini-batch size", positive()),
    setting("fedup-optimizer", str, "adam", "filter optimiser", one_of(OPTIMIZERS)),
    setting("fedup-forget-centroids", str, "divert",
        "forget-set features: sent flagged so the filter diverts them (divert) or dropped (drop, eq. 8)",
        one_of(("divert", "drop"))),
    setting("fedup-targets", str, "soft",
        "diverted centroids get uniform targets over the other classes (soft) "
        "or one random other class each (random, the paper's)", one_of(("soft", "random"))),
)
