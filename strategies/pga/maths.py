"""PGA's pure math on parameter dicts: the reference model, squared distances, the projection.

"Federated Unlearning: How to Efficiently Erase a Client in FL?" (Halimi et al.) constrains the
leaving client's gradient ascent to an L2 ball around a reference model: the average of the other
clients' models, recovered from the global model and the leaving client's own model as
``w_ref = (w - p_i w_i) / (1 - p_i)``. The public notebook uses equal party sizes
(``N/(N-1) w - 1/(N-1) w_i``); here ``p_i`` is the client's FedAvg weight (its share of the
examples), which is that formula when the sizes are equal. Distances are squared L2 norms of the
flattened parameters, as in the notebook; buffers (BatchNorm statistics) take no part.
"""

from __future__ import annotations

import torch

Params = dict[str, torch.Tensor]


def reference_model(global_params: Params, own_params: Params, weight: float) -> Params:
    """``(w - p w_i) / (1 - p)``: the weighted mean of every other client's model."""
    if not 0 <= weight < 1:
        raise ValueError(f"the leaving client's FedAvg weight must be in [0, 1), got {weight!r}")
    return {k: (global_params[k].double() - weight * own_params[k].double()).div(1 - weight).to(global_params[k].dtype)
            for k in global_params}


def squared_distance(a: Params, b: Params) -> float:
    """``||a - b||^2`` over every tensor of ``a`` (the notebook's ``get_distance``)."""
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a))


def project_to_ball(params: Params, center: Params, radius_sq: float) -> Params:
    """``params`` if within ``sqrt(radius_sq)`` of ``center``, else its projection onto that sphere."""
    distance_sq = squared_distance(params, center)
    if distance_sq <= radius_sq:
        return params
    scale = (radius_sq / distance_sq) ** 0.5
    return {k: center[k] + (params[k] - center[k]) * scale for k in params}
