"""FIRM's server-side aggregation of one round of client uploads, and the merge baselines over the same
uploads, as pure functions (no Flower): the Strategy calls them once every ``query.fisher`` reply is in.

An upload is one client's reply, a mapping with

    client_id      str or int, unique within the round
    role           "forget" or "retain"
    domain         forget domain (str; forget clients of one domain are pooled); ignored for retain
    task_vector    {tensor name: tensor}, the client's update: in weight space (``firm_release``'s default) or
                   in the LoRA space of the federated adapter, as the app's methods send it (``strategies.firm.strategy``)
    fisher         {tensor name: tensor}, its raw diagonal Fisher on the same names and shapes
    num_examples   int >= 0 (reported; FIRM weights clients by Fisher, not by counts)

Malformed uploads (missing field, unknown role, keys/shapes differing from the model, NaN/inf, negative
Fisher, duplicate client id) are dropped with a logged warning and listed in the report; aggregation
goes on while at least one forget upload remains, otherwise it raises a one-line ``ValueError``.
The model's layout is ``expected_shapes`` when the caller knows it (the server does), else the
layout most uploads agree on (first seen wins a tie).

``FIRM(gamma, alpha, eps0, epsilon).aggregate(uploads)`` runs ``strategies.firm.maths``: pool forget
domains, normalise + Top-alpha, ``gamma * (D_F + D_R)``; then ``strategies.firm.projection``: the per-tensor
retention projection (``epsilon = inf``: FIRM-base, no projection). ``merge_baseline(name, uploads, scale, **params)`` runs
AVG / SUM / TIES / FULM with the paper's role choice (App. C): AVG and FULM merge forget and retain
task vectors, SUM and TIES only forget ones.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import torch

from strategies.firm.maths import check_alpha, check_eps0, check_epsilon, check_gamma, firm_merge, validate_upload
from strategies.firm.projection import KKTResiduals, firm_project_all

logger = logging.getLogger(__name__)

ROLES = ("forget", "retain")
REQUIRED_FIELDS = ("client_id", "role", "domain", "task_vector", "fisher", "num_examples")
TensorDict = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Upload:
    """One well-formed client upload."""

    client_id: str | int
    role: str
    domain: str
    task_vector: Mapping[str, torch.Tensor]
    fisher: Mapping[str, torch.Tensor]
    num_examples: int


@dataclass(frozen=True)
class TensorReport:
    """Projection outcome for one tensor: multipliers, damages b_k of the delivered update (one per
    retain client), KKT residuals, solver iterations, and the L2 norms before/after the projection."""

    lambdas: list[float]
    damages: list[float]
    residuals: KKTResiduals
    iterations: int
    base_norm: float
    merged_norm: float


@dataclass(frozen=True)
class MergeReport:
    """What a merge used and produced. ``merged_norm`` is the L2 norm of the whole merged update."""

    method: str
    settings: dict
    used: list
    dropped: dict
    merged_norm: float
    tensors: dict[str, TensorReport] = field(default_factory=dict)

    def to_dict(self) -> dict:
        """Plain JSON-ready dict (residuals as dicts, client ids as given)."""
        return asdict(self)


# ----------------------------------------------------------------------------------------- uploads


def _layout(upload: Mapping) -> tuple | None:
    tv = upload.get("task_vector") if isinstance(upload, Mapping) else None
    if not isinstance(tv, Mapping) or not all(torch.is_tensor(t) for t in tv.values()):
        return None
    return tuple(sorted((str(name), tuple(t.shape)) for name, t in tv.items()))


def _majority_layout(uploads: Sequence) -> dict[str, tuple[int, ...]] | None:
    layouts = [layout for layout in map(_layout, uploads) if layout]
    if not layouts:
        return None
    counts = Counter(layouts)
    best = max(counts.values())
    winner = next(layout for layout in layouts if counts[layout] == best)
    return dict(winner)


def _problem(upload, shapes: Mapping[str, Sequence[int]] | None, seen: set) -> str | None:
    """Why ``upload`` must be dropped, or ``None``."""
    if not isinstance(upload, Mapping):
        return f"upload is a {type(upload).__name__}, not a mapping"
    missing = [key for key in REQUIRED_FIELDS if key not in upload]
    if missing:
        return f"missing fields {missing}"
    client_id, role = upload["client_id"], upload["role"]
    if not isinstance(client_id, (str, int)) or isinstance(client_id, bool):
        return f"client_id must be a str or int, got {type(client_id).__name__}"
    if client_id in seen:
        return f"duplicate client_id {client_id!r}"
    if role not in ROLES:
        return f"role must be one of {list(ROLES)}, got {role!r}"
    if role == "forget" and not (isinstance(upload["domain"], str) and upload["domain"]):
        return f"forget upload needs a non-empty str domain, got {upload['domain']!r}"
    count = upload["num_examples"]
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        return f"num_examples must be an int >= 0, got {count!r}"
    if not isinstance(upload["task_vector"], Mapping) or not isinstance(upload["fisher"], Mapping):
        return "task_vector and fisher must be {name: tensor} mappings"
    if shapes is None:
        return "no upload has a readable task vector"
    return validate_upload(upload["task_vector"], upload["fisher"], shapes)


def validate_uploads(
    uploads: Sequence, expected_shapes: Mapping[str, Sequence[int]] | None = None
) -> tuple[list[Upload], dict]:
    """Well-formed uploads (in order) and ``{client id or position: reason}`` for the dropped ones.

    Each drop is logged as a warning. Raises ``ValueError`` when no forget upload is left.
    """
    shapes = dict(expected_shapes) if expected_shapes is not None else _majority_layout(uploads)
    kept: list[Upload] = []
    dropped: dict = {}
    seen: set = set()
    for position, upload in enumerate(uploads):
        reason = _problem(upload, shapes, seen)
        if reason is not None:
            key = upload.get("client_id", f"#{position}") if isinstance(upload, Mapping) else f"#{position}"
            key = key if isinstance(key, (str, int)) and key not in dropped else f"#{position}"
            dropped[key] = reason
            logger.warning("FIRM: dropping upload of client %r: %s", key, reason)
            continue
        seen.add(upload["client_id"])
        domain = upload["domain"] if upload["role"] == "forget" else ""
        kept.append(Upload(upload["client_id"], upload["role"], domain, upload["task_vector"], upload["fisher"],
                           upload["num_examples"]))
    if not any(u.role == "forget" for u in kept):
        raise ValueError(f"FIRM needs at least one well-formed forget upload; got {len(uploads)} uploads, "
                         f"{len(dropped)} dropped ({'; '.join(f'{k}: {v}' for k, v in list(dropped.items())[:3])})")
    return kept, dropped


def _norm(update: Mapping[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float(t.to(torch.float64).square().sum()) for t in update.values()))


# -------------------------------------------------------------------------------------------- FIRM


@dataclass(frozen=True)
class FIRM:
    """FIRM aggregator; settings as the run-config keys firm.gamma, firm.alpha, firm.eps0, firm.epsilon.

    Defaults are the paper's: gamma 1.0, Top-10% (alpha 0.1), eps0 1e-8, epsilon inf (FIRM-base; the
    paper's QP runs use 4.1e-5 for a 7B model; the budget is per tensor and per retain client).
    """

    gamma: float = 1.0
    alpha: float = 0.1
    eps0: float = 1e-8
    epsilon: float = math.inf

    def __post_init__(self) -> None:
        check_gamma(self.gamma)
        check_alpha(self.alpha)
        check_eps0(self.eps0)
        check_epsilon(self.epsilon)

    @classmethod
    def from_config(cls, config: Mapping) -> "FIRM":
        """Build from a run config (``firm.*`` keys; absent keys take the defaults)."""
        keys = {"firm.gamma": "gamma", "firm.alpha": "alpha", "firm.eps0": "eps0", "firm.epsilon": "epsilon"}
        return cls(**{attr: float(config[key]) for key, attr in keys.items() if key in config})

    def aggregate(
        self, uploads: Sequence, expected_shapes: Mapping[str, Sequence[int]] | None = None
    ) -> tuple[TensorDict, MergeReport]:
        """The merged (projected) update ``{name: float32 tensor}`` and its report."""
        kept, dropped = validate_uploads(uploads, expected_shapes)
        forget = [u for u in kept if u.role == "forget"]
        retain = [u for u in kept if u.role == "retain"]
        base, constraints = firm_merge(
            [u.task_vector for u in forget], [u.fisher for u in forget], [u.domain for u in forget],
            [u.task_vector for u in retain], [u.fisher for u in retain], self.gamma, self.alpha, self.eps0,
        )
        base_norms = {name: _norm({name: tensor}) for name, tensor in base.items()}
        merged, projections = firm_project_all(base, constraints, self.epsilon, overwrite=True)  # base is ours
        tensors = {
            name: TensorReport(r.lambdas, r.damages, r.residuals, r.iterations,
                               base_norms[name], _norm({name: merged[name]}))
            for name, r in projections.items()
        }
        report = MergeReport("firm", asdict(self), [u.client_id for u in kept], dropped, _norm(merged), tensors)
        return merged, report


def firm_aggregate(uploads: Sequence, *, gamma: float = 1.0, alpha: float = 0.1, eps0: float = 1e-8,
                   epsilon: float = math.inf, expected_shapes=None) -> tuple[TensorDict, MergeReport]:
    """``FIRM(gamma, alpha, eps0, epsilon).aggregate(uploads, expected_shapes)``."""
    return FIRM(gamma, alpha, eps0, epsilon).aggregate(uploads, expected_shapes)
