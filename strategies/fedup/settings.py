"""FedUP's run-config keys (``fedup.*``): centroids and their privacy, the filter and its training.

Every default is the paper's, or its official code's where the paper is silent (``docs/fedup.md``,
"Paper, official code, here"). Two defaults are sentinels resolved per run: ``fedup.delta=0`` is
``1/n_i`` for each client ``i`` (its own number of released samples, paper sec. 3.2.4), and
``fedup.lr=0`` is the run's ``lr`` (the official code trains the filter with the federation's own
learning rate).
"""

from __future__ import annotations

import math

from core.config import Setting, at_least, in_range, one_of, positive, setting

OPTIMIZERS = ("sgd", "adam")
FILTER_SHAPES = ("official", "signed")
FORGET_CENTROIDS = ("paper", "drop", "divert")
DP_BOUNDS = ("eq21", "fixed-clusters", "any-clustering")

SETTINGS: tuple[Setting, ...] = (
    setting("fedup.rho", float, 0.0,
        "KMeans clusters per class = ceil(rho * n); 0 = paper default by scenario (0.8/0.1/0.5)",
        ((lambda v: 0 <= v <= 1), "0 (scenario default) or in (0, 1]")),
    setting("fedup.clip", float, math.inf,
        "L2 bound every feature vector is clipped to before KMeans; inf = no clipping (the paper)",
        positive(), allow_inf=True),
    setting("fedup.sigma", float, 0.0, "centroid noise std; 0 = calibrate from fedup.epsilon/fedup.delta",
        at_least(0)),
    setting("fedup.epsilon", float, 10.0,
        "target (epsilon, delta)-DP of each client's upload (paper: about 10); inf = no noise",
        positive(), allow_inf=True),
    setting("fedup.delta", float, 0.0, "delta of the DP target; 0 = 1/n_i, each client's own sample count (paper)",
        ((lambda v: 0 <= v < 1), "0 (1/n_i) or in (0, 1)")),
    setting("fedup.dp-bound", str, "eq21",
        "sensitivity: eq21 (paper: feature diameter / n_i), fixed-clusters (2*clip / smallest cluster) "
        "or any-clustering (2*clip*sqrt(centroids), valid for KMeans as run); the last two need a finite fedup.clip",
        one_of(DP_BOUNDS)),
    setting("fedup.bottleneck", int, 32, "filter bottleneck width (paper Table 5)", positive()),
    setting("fedup.filter", str, "official",
        "filter shape: official (Linear-ReLU-Linear-ReLU, no biases) or signed (biases, no output ReLU)",
        one_of(FILTER_SHAPES)),
    setting("fedup.alpha", float, 0.5, "filter loss = alpha*CE + (1-alpha)*reconstruction (paper: 0.5)",
        in_range(0, 1)),
    setting("fedup.epochs", int, 50, "server-side filter training epochs (official code: 50)", positive()),
    setting("fedup.lr", float, 0.0, "filter learning rate; 0 = the run's lr (official code: the federation's lr)",
        at_least(0)),
    setting("fedup.batch-size", int, 10, "filter mini-batch size (official code: 10)", positive()),
    setting("fedup.optimizer", str, "sgd", "filter optimiser (official code: plain SGD)", one_of(OPTIMIZERS)),
    setting("fedup.forget-centroids", str, "paper",
        "forget-set features: paper (dropped in the client and sample scenarios, relabelled to another class "
        "in the class scenario), drop (dropped everywhere) or divert (sent flagged, the server diverts them)",
        one_of(FORGET_CENTROIDS)),
    setting("fedup.targets", str, "random",
        "with divert: each flagged centroid gets one random other class (random) or uniform targets over "
        "the other classes (soft)", one_of(("random", "soft"))),
)


def filter_lr(cfg) -> float:
    """The filter's learning rate: ``fedup.lr``, or the run's ``lr`` when it is 0."""
    return cfg["fedup.lr"] or cfg["lr"]


def check_settings(cfg) -> None:
    """A clip-based sensitivity bound needs a finite ``fedup.clip`` (one-line error)."""
    from core.config import ConfigError

    if cfg["fedup.dp-bound"] != "eq21" and math.isinf(cfg["fedup.clip"]):
        raise ConfigError(f"run-config 'fedup.dp-bound'={cfg['fedup.dp-bound']!r} bounds the sensitivity by "
                          "fedup.clip: set a finite 'fedup.clip' (e.g. 20)")
