"""Classification metrics: what each client measures locally, and how the server pools it.

Per client (``client_metrics``): correct/total counts on retained training data, the forget set
(with the labels it was trained with, so ``forget_acc`` is Lethe's KR, eq. 3), the local test split
(also per class: ``test_acc_by_class`` shows which classes a method gave up, e.g. those a leaving
client held nearly alone), the forget-class test samples, triggered test samples (share sent to the
backdoor target), and the class-0 precision counts; plus a seeded subsample of per-sample
confidences for the MIA.

MIA, Unlearn-Sparse's SVC attack (``evaluation/SVC_MIA.py``, confidence feature): the feature of a
sample is the model's softmax probability of its label; an SVC (RBF kernel, C = 3, gamma = 'auto')
is fitted with retained training samples as members (label 1, "shadow train") and test samples as
non-members (label 0, "shadow test"), balanced by a seeded draw of ``min(n_retain, n_test)`` of
each (Unlearn-Sparse: the first ``n_test`` retain samples and the whole test set), then predicts
the forget set. Two figures of that one prediction:

* ``mia_efficacy`` = share of the forget set judged *non-member* (Unlearn-Sparse's MIA-Efficacy,
  ``1 - mean(predict(forget))``, what unlearning tables report): high = forgotten.
* ``mia`` = share judged *member* = ``1 - mia_efficacy`` (kept for compatibility): high = the model
  still treats the forget set like training data.

Clients send confidences (model outputs), never samples.
"""

from __future__ import annotations

import numpy as np
import torch

from tasks.requests import ClientData
from tasks.training import penultimate_features, predict_proba

COUNT_KEYS = ("retain", "forget", "test", "forget-test", "triggered")


def _label_confidence(probs: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return probs[torch.arange(len(y)), y] if len(y) else torch.zeros(0)


def _subsample(values: torch.Tensor, limit: int, seed: int) -> list[float]:
    if len(values) > limit:
        values = values[torch.randperm(len(values), generator=torch.Generator().manual_seed(seed))[:limit]]
    return [float(v) for v in values]


def client_metrics(model: torch.nn.Module, data: ClientData, *, target: int, mia_max_samples: int,
                   seed: int, device: torch.device | None = None) -> dict[str, int | float | list[float]]:
    """Counts and MIA confidences of one client, ready for a MetricRecord."""
    out: dict[str, int | float | list[float]] = {}
    sets = {
        "retain": (data.retain_x, data.retain_y),
        "forget": (data.forget_x, data.forget_y),
        "test": (data.test_x, data.test_y),
        "forget-test": (data.forget_test_x, data.forget_test_y),
    }
    for name, (x, y) in sets.items():
        probs = predict_proba(model, x, device=device)
        pred = probs.argmax(dim=1) if len(y) else y
        out[f"{name}-n"] = len(y)
        out[f"{name}-correct"] = int((pred == y).sum())
        if name == "test":
            out["test-class-n"] = torch.bincount(y, minlength=probs.shape[1]).tolist()
            out["test-class-correct"] = torch.bincount(y[pred == y], minlength=probs.shape[1]).tolist()
            out["pred-target-n"] = int((pred == target).sum())
            out["pred-target-correct"] = int(((pred == target) & (y == target)).sum())
            out["test-target-n"] = int((y == target).sum())
        if name in ("retain", "test", "forget"):
            out[f"conf-{name}"] = _subsample(_label_confidence(probs, y), mia_max_samples, seed)
    trig = predict_proba(model, data.triggered_test_x, device=device)
    out["triggered-n"] = len(data.triggered_test_y)
    out["triggered-hit"] = int((trig.argmax(dim=1) == target).sum()) if len(trig) else 0
    return out


def feature_sample(model: torch.nn.Module, data: ClientData, limit: int, seed: int) -> dict[str, torch.Tensor]:
    """Up to ``limit`` seeded penultimate-feature rows of the retained and the forget set (diagnostics)."""
    generator = torch.Generator().manual_seed(seed)
    out = {}
    for name, x in (("retain", data.retain_x), ("forget", data.forget_x)):
        chosen = x[torch.randperm(len(x), generator=generator)[:limit]]
        out[name] = penultimate_features(model, chosen).float()
    return out


def _ratio(num: float, den: float) -> float:
    return float(num) / float(den) if den else float("nan")


def _test_acc_by_class(per_client: list[dict]) -> list[float | None] | None:
    """Test accuracy per class pooled over clients from their ``test-class-n`` / ``test-class-correct``
    count lists (``None`` for a class no client has a test sample of; ``None`` in all when no client
    sent the lists)."""
    sent = [c for c in per_client if "test-class-n" in c]
    if not sent:
        return None
    classes = max(len(c["test-class-n"]) for c in sent)
    n, correct = np.zeros(classes, dtype=np.int64), np.zeros(classes, dtype=np.int64)
    for c in sent:
        counts, hits = list(c["test-class-n"]), list(c["test-class-correct"])
        n[:len(counts)] += np.asarray(counts, dtype=np.int64)
        correct[:len(hits)] += np.asarray(hits, dtype=np.int64)
    return [float(k) / float(m) if m else None for k, m in zip(correct, n)]


def mia_member_share(members: list[float], non_members: list[float], forget: list[float], seed: int) -> float:
    """Share of the forget set an SVC (fitted members vs non-members on confidence) calls member
    (module docstring; NaN when a set is empty)."""
    from sklearn.svm import SVC

    members, non_members, forget = ([v for v in values if np.isfinite(v)]
                                    for values in (members, non_members, forget))
    if not forget or not members or not non_members:
        return float("nan")
    rng = np.random.default_rng(seed)
    n = min(len(members), len(non_members))
    m = rng.choice(np.asarray(members), size=n, replace=False)
    nm = rng.choice(np.asarray(non_members), size=n, replace=False)
    x = np.concatenate([m, nm]).reshape(-1, 1)
    y = np.concatenate([np.ones(n), np.zeros(n)])
    if len(np.unique(y)) < 2:
        return float("nan")
    clf = SVC(C=3, gamma="auto", kernel="rbf", random_state=seed).fit(x, y)
    return float(clf.predict(np.asarray(forget).reshape(-1, 1)).mean())


def pool_metrics(per_client: list[dict], *, seed: int, with_trigger: bool, with_forget_test: bool) -> dict:
    """Pool client counts into the results contract's model entry (fractions in [0, 1])."""
    total = {k: sum(int(c.get(k, 0)) for c in per_client)
             for k in [f"{s}-{x}" for s in COUNT_KEYS[:4] for x in ("n", "correct")]
             + ["triggered-n", "triggered-hit", "pred-target-n", "pred-target-correct"]}
    conf = {name: [v for c in per_client for v in c.get(f"conf-{name}", [])] for name in ("retain", "test", "forget")}
    entry = {
        "retain_acc": _ratio(total["retain-correct"], total["retain-n"]),
        "forget_acc": _ratio(total["forget-correct"], total["forget-n"]),
        "test_acc": _ratio(total["test-correct"], total["test-n"]),
        "mia": mia_member_share(conf["retain"], conf["test"], conf["forget"], seed),
    }
    entry["mia_efficacy"] = 1.0 - entry["mia"]
    by_class = _test_acc_by_class(per_client)
    if by_class is not None:
        entry["test_acc_by_class"] = by_class
    if with_forget_test:
        entry["forget_test_acc"] = _ratio(total["forget-test-correct"], total["forget-test-n"])
    if with_trigger:
        entry["target_rate"] = _ratio(total["triggered-hit"], total["triggered-n"])
        entry["target_precision"] = _ratio(total["pred-target-correct"], total["pred-target-n"])
    return entry
