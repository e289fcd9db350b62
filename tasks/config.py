"""Every run-config key in one table: its type, default, allowed values and meaning.

Flower hands the ServerApp and every ClientApp the same flat run config (``pyproject.toml``'s
``[tool.flwr.app.config]`` merged with ``--run-config`` overrides). ``parse_config`` turns it into
a typed :class:`Config` and rejects bad input with a one-line ``ConfigError`` that names the key
and what is allowed, before any training starts. The README's key table and pyproject's defaults
are checked against :data:`SETTINGS` by the tests, so the three never drift apart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

LLM_TASKS = ("llm-tofu",)
TASKS = ("digits-lenet5", "mnist-lenet5", "cifar10-resnet18", "cifar100-resnet34", "cifar10-vit") + LLM_TASKS
MERGE_BASELINES = ("avg", "sum", "ties", "fulm")
LLM_METHODS = ("ga", "npo", "simnpo", "firm") + MERGE_BASELINES
METHODS = ("none", "retrain", "fedup", "lethe") + LLM_METHODS
SCENARIOS = ("client", "class", "sample")
POISONS = ("label-flip", "backdoor")
OPTIMIZERS = ("adam", "sgd")
NUM_CLASSES = {"digits-lenet5": 10, "mnist-lenet5": 10, "cifar10-resnet18": 10,
               "cifar100-resnet34": 100, "cifar10-vit": 10}


class ConfigError(ValueError):
    """A run-config value that is not allowed; the message is one line naming the key."""


@dataclass(frozen=True)
class Setting:
    """One run-config key: ``check`` returns the description of what is allowed when the value fails."""

    key: str
    kind: type
    default: Any
    help: str
    check: Callable[[Any], bool] | None = None
    allowed: str = ""


def _one_of(values: tuple[str, ...]) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v in values), "one of " + ", ".join(values)


def _positive() -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v > 0), "> 0"


def _at_least(low: float) -> tuple[Callable[[Any], bool], str]:
    return (lambda v: v >= low), f">= {low:g}"


def _open_unit(include_one: bool) -> tuple[Callable[[Any], bool], str]:
    if include_one:
        return (lambda v: 0 < v <= 1), "in (0, 1]"
    return (lambda v: 0 < v < 1), "in (0, 1)"


def _finite(low: float, include_low: bool) -> tuple[Callable[[Any], bool], str]:
    if include_low:
        return (lambda v: low <= v < math.inf), f">= {low:g} and finite"
    return (lambda v: low < v < math.inf), f"> {low:g} and finite"


def _s(key: str, kind: type, default: Any, help: str, rule=None) -> Setting:
    check, allowed = rule if rule else (None, "")
    return Setting(key, kind, default, help, check, allowed)


SETTINGS: tuple[Setting, ...] = (
    # what to run
    _s("task", str, "digits-lenet5", "dataset + model", _one_of(TASKS)),
    _s("method", str, "fedup", "unlearning method", _one_of(METHODS)),
    _s("scenario", str, "sample", "what is forgotten: one client, one class, or some samples",
       _one_of(SCENARIOS)),
    _s("poison", str, "label-flip", "how the leaving client's data is made measurable (client scenario)",
       _one_of(POISONS)),
    _s("forget-client", int, -1,
       "client whose data (client/sample scenario) is forgotten; -1 = the client with the most samples",
       _at_least(-1)),
    _s("poison-epochs", int, 15,
       "local epochs of the leaving client on its flipped labels while the original model is trained "
       "(client scenario, poison label-flip; a Byzantine client works harder); 0 = local-epochs", _at_least(0)),
    _s("forget-class", int, 3, "class removed in the class scenario", _at_least(0)),
    _s("sample-fraction", float, 0.2,
       "share of the forget client's samples that carry the backdoor (sample scenario)", _open_unit(True)),
    _s("backdoor-target", int, 0, "label the backdoor trigger maps to", _at_least(0)),
    _s("trigger-size", int, 8, "side in pixels of the white bottom-right trigger square", _positive()),
    _s("seed", int, 42, "seed of every random choice: partitions, requests, init, sampling",
       ((lambda v: 0 <= v < 2**32), "in 0..4294967295")),  # numpy needs >= 0; torch overflows past 64 bits
    # federation and training
    _s("dirichlet-alpha", float, 0.5, "Dirichlet concentration of the non-IID label split", _positive()),
    _s("test-fraction", float, 0.2, "share of each client's partition kept as its local test split",
       _open_unit(False)),
    _s("pretrain-rounds", int, 20, "FedAvg rounds that train the original model", _positive()),
    _s("retrain-rounds", int, 0, "FedAvg rounds of the retrain oracle; 0 = pretrain-rounds", _at_least(0)),
    _s("continue-rounds", int, 10, "FedAvg rounds on retained data after unlearning (resurfacing)",
       _at_least(0)),
    _s("local-epochs", int, 3, "local epochs per training round", _positive()),
    _s("batch-size", int, 32, "local mini-batch size", _positive()),
    _s("lr", float, 0.05, "local SGD learning rate", _positive()),
    _s("momentum", float, 0.9, "local SGD momentum", _at_least(0)),
    _s("fraction-train", float, 1.0, "share of eligible clients sampled per training round",
       _open_unit(True)),
    _s("min-reply-fraction", float, 0.5,
       "a round goes on when at least this share of the nodes it asked replied", _open_unit(True)),
    _s("round-timeout", float, 600.0, "seconds to wait for the replies of one round", _positive()),
    # where things go
    _s("data-dir", str, "", "folder of real datasets (MNIST/CIFAR); empty = ~/.cache/fedunlearn/data"),
    _s("download", bool, False, "allow torchvision to download missing datasets"),
    _s("cache-dir", str, "", "cache of original/retrained models; empty = ~/.cache/fedunlearn/models"),
    _s("outputs-dir", str, "outputs", "folder that receives results.json, results.csv and plots"),
    _s("mia-max-samples", int, 200, "per client and set, samples whose confidence feeds the MIA",
       _positive()),
    _s("diagnostic-samples", int, 50,
       "per client and set, penultimate features sent for the FD/PCA diagnostics; 0 = off",
       _at_least(0)),
    # FedUP (paper 000): DP class centroids -> server-trained plug-in filter
    _s("fedup-rho", float, 0.0,
       "KMeans clusters per class = ceil(rho * n); 0 = paper default by scenario (0.8/0.1/0.5)",
       ((lambda v: 0 <= v <= 1), "0 (scenario default) or in (0, 1]")),
    _s("fedup-clip", float, 20.0, "L2 bound that every feature vector is clipped to before KMeans",
       _positive()),
    _s("fedup-sigma", float, 0.0, "centroid noise std; 0 = calibrate from fedup-epsilon/fedup-delta",
       _at_least(0)),
    _s("fedup-epsilon", float, math.inf,
       "target (epsilon, delta)-DP of each client's upload; inf = no noise (the paper's released setting)",
       _positive()),
    _s("fedup-delta", float, 1e-5, "delta of the DP target", _open_unit(False)),
    _s("fedup-dp-bound", str, "fixed-clusters",
       "sensitivity bound: fixed-clusters (paper: assignment taken as fixed) or any-clustering (safe)",
       _one_of(("fixed-clusters", "any-clustering"))),
    _s("fedup-bottleneck", int, 32, "filter bottleneck width (paper Table 5)", _positive()),
    _s("fedup-alpha", float, 0.8,
       "filter loss = alpha*CE + (1-alpha)*reconstruction (paper: 0.5; 0.8 measured to block backdoors)",
       ((lambda v: 0 <= v <= 1), "in [0, 1]")),
    _s("lethe-stop-forget-acc-client", float, 1.0,
       "lethe-stop-forget-acc of the client scenario (its forget set holds samples a model trained without the "
       "client still predicts as their label)", ((lambda v: 0 <= v <= 1), "in [0, 1]")),
    _s("fedup-epochs", int, 200, "server-side filter training epochs", _positive()),
    _s("fedup-lr", float, 3e-3, "filter learning rate", _positive()),
    _s("fedup-batch-size", int, 256, "filter mini-batch size", _positive()),
    _s("fedup-optimizer", str, "adam", "filter optimiser", _one_of(OPTIMIZERS)),
    _s("fedup-forget-centroids", str, "divert",
       "forget-set features: sent flagged so the filter diverts them (divert) or dropped (drop, eq. 8)",
       _one_of(("divert", "drop"))),
    _s("fedup-targets", str, "soft",
       "diverted centroids get uniform targets over the other classes (soft) "
       "or one random other class each (random, the paper's)", _one_of(("soft", "random"))),
    # Lethe (paper 001): amplify -> rectify -> restore
    _s("lethe-gamma", float, 0.2, "rectification penalty gamma of eq. 10", _positive()),
    _s("lethe-adapter-steps", int, 50, "gradient-ascent steps of the temporary adapter; 0 = no adapter",
       _at_least(0)),
    _s("lethe-adapter-lr", float, 0.05,
       "length of each normalised adapter ascent step (global L2 norm of the adapter's change)", _positive()),
    _s("lethe-adapter-max-loss", float, 10.0,
       "adapter ascent stops once a batch's forget loss reaches this (bounded amplification)", _positive()),
    _s("lethe-lr", float, 0.01,
       "local learning rate of both streams during rectification (client and sample scenarios; the paper "
       "uses 1e-3 for CV)", _positive()),
    _s("lethe-lr-class", float, 0.02, "lethe-lr of the class scenario", _positive()),
    _s("lethe-epochs", int, 1, "local epochs of both streams per rectification round (paper: 1)", _positive()),
    _s("lethe-gamma-mode", str, "upper",
       "fixed: lethe-gamma in every layer (paper); clamp: clipped into each layer's Prop. IV.1 bounds; "
       "upper: each layer's upper Prop. IV.1 bound (strongest forgetting it allows)",
       _one_of(("fixed", "clamp", "upper"))),
    _s("lethe-step-clip", float, 1.0,
       "each rectified update is scaled to at most this x the retain stream's L2 norm (client and sample "
       "scenarios); 0 = off", _at_least(0)),
    _s("lethe-step-clip-class", float, 5.0,
       "lethe-step-clip of the class scenario; 0 = off",
       _at_least(0)),
    _s("lethe-clip-floor", float, 0.1,
       "lethe-step-clip is a multiple of the larger of the retain stream's norm and this x the forget stream's "
       "norm, so the bound does not vanish with the retain stream (sample scenario); 0 = the retain "
       "stream alone", _at_least(0)),
    _s("lethe-clip-floor-class", float, 0.0, "lethe-clip-floor of the class scenario", _at_least(0)),
    _s("lethe-clip-floor-client", float, 0.03,
       "lethe-clip-floor of the client scenario (smaller: its steps must stay short enough for "
       "lethe-stop-at-reference-client to fire between them)", _at_least(0)),
    _s("lethe-stop-forget-acc", float, 0.05,
       "rectification stops only once the backbone (adapter bypassed) also predicts at most this share of the "
       "forget set as its label (one evaluate message to the forget clients at the stop); 1 = not asked",
       ((lambda v: 0 <= v <= 1), "in [0, 1]")),
    _s("lethe-stop-forget-acc-client", float, 1.0,
       "lethe-stop-forget-acc of the client scenario (its forget set holds samples a model trained without the "
       "client still predicts as their label)", ((lambda v: 0 <= v <= 1), "in [0, 1]")),
    _s("lethe-stop-at-reference-client", bool, True,
       "client scenario: rectification also stops once the backbone predicts no larger share of the forget set "
       "as the backdoor target than of the forget clients' clean local test data (one evaluate message a round)"),
    _s("lethe-max-backbone-rise", float, 0.5,
       "restore guard: while the first restore round's retained loss (the adapter-free backbone) is more than "
       "this many nats above the retained loss on the model rectification started from, one rectification step "
       "is undone", _positive()),
    _s("lethe-restore-retries", int, 2,
       "restore guard: when restore's own guard acts (a restore step rolled back or refused), restore again from "
       "the backbone one rectification step earlier, at most this many times", _at_least(0)),
    _s("lethe-rectify-rounds", int, 10, "most dual-stream rectification rounds", _at_least(0)),
    _s("lethe-stop-loss", float, 12.0,
       "rectification stops once the forget clients' mean forget loss (nats, backbone without the "
       "adapter) reaches this; inf = always lethe-rectify-rounds", _positive()),
    _s("lethe-max-retain-rise", float, 0.5,
       "rectification guard: a step after which the retained clients' reported loss is more than this many "
       "nats above their loss on the starting model is rolled back (and rectification stops)", _positive()),
    _s("lethe-restore-rounds", int, 5, "utility-recovery rounds after the adapter is dropped", _at_least(0)),
    _s("lethe-restore-mode", str, "rectified",
       "fedavg: FedAvg on retained clients (paper); rectified: forget clients also train and the "
       "retain update's component along their update is removed where they align",
       _one_of(("fedavg", "rectified"))),
    # LLM task (llm-tofu): TOFU-style fictitious authors, LoRA on a causal LM (docs/llm.md)
    _s("llm-model", str, "tiny", "'tiny' (a small Llama built from config, offline) or a local HF model folder"),
    _s("llm-data-dir", str, "", "folder of TOFU files (full.json, *_perturbed.json ...); empty = synthetic authors"),
    _s("llm-num-authors", int, 20, "synthetic fictitious authors (offline data)", _positive()),
    _s("llm-qa-per-author", int, 10, "synthetic QA pairs per author", ((lambda v: 1 <= v <= 20), "in 1..20")),
    _s("llm-forget-fraction", float, 0.1, "share of authors forgotten in the sample scenario", _open_unit(True)),
    _s("llm-lora-rank", int, 16, "LoRA rank r", _positive()),
    _s("llm-lora-alpha", float, 32.0, "LoRA scaling alpha (update = alpha/r * B A)", _positive()),
    _s("llm-target-modules", str, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
       "comma-separated linear modules that get LoRA adapters"),
    _s("llm-load-in-4bit", bool, False, "load the base model in 4-bit NF4 (bitsandbytes, CUDA only)"),
    _s("llm-local-epochs", int, 3, "local epochs per LLM training round (pretrain, retrain, continue, Lethe)",
       _positive()),
    _s("llm-lr", float, 5e-3, "local AdamW learning rate of the LoRA adapter", _positive()),
    _s("llm-batch-size", int, 16, "local mini-batch size (QA pairs)", _positive()),
    _s("llm-unlearn-epochs", int, 3,
       "epochs of the one-round ga/npo/simnpo unlearning on forget clients and of every FIRM/merge client release",
       _positive()),
    _s("llm-unlearn-lr", float, 1e-3, "learning rate of the ga/npo/simnpo unlearning and of the FIRM/merge releases",
       _positive()),
    _s("llm-npo-beta", float, 0.1, "NPO beta", _positive()),
    _s("llm-simnpo-beta", float, 2.5, "SimNPO beta", _positive()),
    _s("llm-simnpo-gamma", float, 0.0, "SimNPO reward margin gamma", _at_least(0)),
    _s("llm-max-new-tokens", int, 0, "greedy tokens generated per answer when evaluating; 0 = by data source "
       "(200 on TOFU files as TOFU/open-unlearning, 16 on synthetic authors)", _at_least(0)),
    _s("llm-eval-batch-size", int, 32, "evaluation batch size", _positive()),
    # FIRM (paper 002) and its merge baselines on the LLM task: one query.fisher round, one merge (docs/firm.md)
    _s("firm-gamma", float, 1.0, "FIRM base-merge scale gamma of gamma * (D_F + D_R) (paper: 1)", _finite(0, True)),
    _s("firm-alpha", float, 0.1, "share of each normalised Fisher kept (Top-alpha sparsification)", _open_unit(True)),
    _s("firm-eps0", float, 1e-8, "Fisher normalisation / merge denominator epsilon_0", _finite(0, False)),
    _s("firm-epsilon", float, math.inf,
       "retention budget per tensor and retain client of the projection; inf = FIRM-base (no projection)",
       _positive()),
    _s("firm-forget-objective", str, "ascent", "forget clients' local objective (retain clients: ce)",
       _one_of(("ascent", "rmu"))),
    _s("firm-fisher-batches", int, 20, "single sequences per client the diagonal Fisher is averaged over",
       _positive()),
    _s("avg-scale", float, 1.0, "AVG merge: scale x mean of forget and retain task vectors", _finite(0, False)),
    _s("sum-scale", float, 1.0, "SUM merge: scale x sum of forget task vectors", _finite(0, False)),
    _s("ties-scale", float, 1.0, "TIES merge of forget task vectors: scale", _finite(0, False)),
    _s("ties-density", float, 0.2, "TIES: share of each task vector's entries kept (per tensor)", _open_unit(True)),
    _s("fulm-scale", float, 1.0, "FULM merge of forget and retain task vectors: scale", _finite(0, False)),
    _s("fulm-threshold", float, 0.6, "FULM: cosine similarity that links two task vectors into one cluster",
       ((lambda v: -1 <= v <= 1), "in [-1, 1]")),
    _s("fulm-density", float, 0.3, "FULM: TIES density inside each cluster", _open_unit(True)),
)

SETTINGS_BY_KEY = {s.key: s for s in SETTINGS}

# Float settings whose inf is a documented choice (no DP noise, no projection, no early stop);
# every other float must be finite.
INFINITE_ALLOWED = ("fedup-epsilon", "firm-epsilon", "lethe-stop-loss")

# Which task or method a key prefix belongs to: a non-default value of such a key in a run of
# another task or method does nothing, which ``inapplicable_settings`` names.
KEY_OWNERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "llm-": ("task", LLM_TASKS),
    "fedup-": ("method", ("fedup",)),
    "lethe-": ("method", ("lethe",)),
    "firm-": ("method", ("firm",) + MERGE_BASELINES),
    **{f"{name}-": ("method", (name,)) for name in MERGE_BASELINES},
}


class Config:
    """Typed, validated run config; read values as ``cfg["pretrain-rounds"]`` or ``cfg.pretrain_rounds``."""

    def __init__(self, values: dict[str, Any]):
        self._values = dict(values)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name.replace("_", "-")]
        except KeyError as err:
            raise AttributeError(name) from err

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    @property
    def num_classes(self) -> int:
        """Classes of a vision task; LLM tasks have none (class settings do not apply: 0 checks skipped)."""
        return NUM_CLASSES.get(self["task"], 0)

    @property
    def rounds_of_retrain(self) -> int:
        return self["retrain-rounds"] or self["pretrain-rounds"]


def _coerce(setting: Setting, value: Any) -> Any:
    """Flower gives TOML/CLI scalars; accept ints for floats and 'true'/'false' strings for bools."""
    kind = setting.kind
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
    elif kind is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif isinstance(value, kind):
        return value
    raise ConfigError(f"run-config '{setting.key}' must be a {kind.__name__}, got {value!r}")


def parse_config(run_config: dict[str, Any], num_clients: int | None = None) -> Config:
    """Validate ``run_config`` (unknown keys rejected, missing keys defaulted) into a :class:`Config`.

    ``num_clients`` enables the checks that need the federation size (the forget client).
    """
    unknown = sorted(set(run_config) - set(SETTINGS_BY_KEY))
    if unknown:
        raise ConfigError(f"unknown run-config key(s) {', '.join(unknown)}; see the README's key table")
    values: dict[str, Any] = {}
    for setting in SETTINGS:
        value = _coerce(setting, run_config.get(setting.key, setting.default))
        if isinstance(value, float) and math.isnan(value):
            raise ConfigError(f"run-config '{setting.key}' is NaN")
        if isinstance(value, float) and math.isinf(value) and setting.key not in INFINITE_ALLOWED:
            raise ConfigError(f"run-config '{setting.key}'={value!r} is not allowed: must be finite")
        if setting.check is not None and not setting.check(value):
            raise ConfigError(f"run-config '{setting.key}'={value!r} is not allowed: must be {setting.allowed}")
        values[setting.key] = value
    cfg = Config(values)
    _check_combinations(cfg, num_clients)
    return cfg


def _check_llm_combinations(cfg: Config) -> None:
    """What the LLM task cannot do: classes, poisoning, FedUP, Lethe's (vision) adapter."""
    if cfg["scenario"] == "class":
        raise ConfigError(f"run-config 'scenario'='class' is not meaningful for task '{cfg['task']}': "
                          "must be sample or client")
    if cfg["poison"] != "label-flip":
        raise ConfigError(f"run-config 'poison'={cfg['poison']!r} is not meaningful for task '{cfg['task']}': "
                          "leave it at label-flip (it is ignored)")
    if cfg["method"] == "fedup":
        raise ConfigError(f"run-config 'method'='fedup' is not available for task '{cfg['task']}': "
                          f"must be one of {', '.join(m for m in METHODS if m != 'fedup')}")
    if cfg["method"] == "lethe" and cfg["lethe-adapter-steps"] != 0:
        raise ConfigError(f"run-config 'lethe-adapter-steps'={cfg['lethe-adapter-steps']} is not allowed for task "
                          f"'{cfg['task']}': must be 0 (Lethe rectifies the LoRA adapter directly)")


def _check_combinations(cfg: Config, num_clients: int | None) -> None:
    if cfg["task"] in LLM_TASKS:
        _check_llm_combinations(cfg)
    elif cfg["method"] in LLM_METHODS:
        raise ConfigError(f"run-config 'method'={cfg['method']!r} needs an LLM task: task must be one of "
                          f"{', '.join(LLM_TASKS)}")
    classes = cfg.num_classes
    if classes and cfg["forget-class"] >= classes:
        raise ConfigError(f"run-config 'forget-class'={cfg['forget-class']} is outside task "
                          f"'{cfg['task']}': must be in 0..{classes - 1}")
    if classes and cfg["backdoor-target"] >= classes:
        raise ConfigError(f"run-config 'backdoor-target'={cfg['backdoor-target']} is outside task "
                          f"'{cfg['task']}': must be in 0..{classes - 1}")
    if classes:
        from tasks.vision.datasets import IMAGE_SIZE

        if cfg["trigger-size"] > IMAGE_SIZE:
            raise ConfigError(f"run-config 'trigger-size'={cfg['trigger-size']} is larger than the "
                              f"{IMAGE_SIZE}x{IMAGE_SIZE} images of task '{cfg['task']}': must be in 1..{IMAGE_SIZE}")
    if num_clients is not None:
        if num_clients < 2:
            raise ConfigError(f"the federation has {num_clients} client(s): at least 2 are needed")
        if cfg["forget-client"] >= num_clients:
            raise ConfigError(f"run-config 'forget-client'={cfg['forget-client']} is outside the "
                              f"federation: must be -1 (largest) or in 0..{num_clients - 1}")


def inapplicable_settings(cfg: Config) -> list[str]:
    """Keys set away from their default that this run's task or method never reads, each as
    ``key (<owner> only)``, e.g. ``llm-lr (task llm-tofu only)`` on a vision task."""
    out = []
    for setting in SETTINGS:
        for prefix, (field, owners) in KEY_OWNERS.items():
            if (setting.key.startswith(prefix) and cfg[field] not in owners
                    and cfg[setting.key] != setting.default):
                out.append(f"{setting.key} ({field} {'/'.join(owners)} only)")
    return out
