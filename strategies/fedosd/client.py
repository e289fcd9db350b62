"""FedOSD's client side (``query.fedosd``): the gradient of one round of local training.

As in the public code, a client trains a copy of the received model with plain SGD (no momentum;
``fedosd.epochs`` epochs of mini-batches of ``fedosd.batch-size``, learning rate ``lr`` from the
message) and reports the pseudo-gradient ``(w - w_local) / lr`` of the model's parameters. Role
``forget`` (the leaving client) minimises the unlearning cross-entropy ``-log(1 - p_y / 2)`` on its
forget data, role ``retain`` the cross-entropy on its retained data. Buffers (BatchNorm statistics)
are not sent: the server steps parameters only.
"""

from __future__ import annotations

from strategies.fedosd.maths import unlearning_cross_entropy
from tasks.training import device_for, train_local


def _uce(model, xb, yb):
    return unlearning_cross_entropy(model(xb), yb)


def fedosd_query(task, cfg, data, model, conf: dict, seed: int) -> dict:
    """The registered ``query.fedosd`` handler: ``gradient`` (parameter name -> tensor) and metrics."""
    role, lr = str(conf["role"]), float(conf["lr"])
    if role not in ("forget", "retain"):
        raise ValueError(f"query.fedosd role must be forget or retain, got {role!r}")
    start = {name: p.detach().cpu().clone() for name, p in model.named_parameters()}
    x, y = data.split(role)
    loss = train_local(model, x, y, epochs=cfg["fedosd.epochs"], batch_size=cfg["fedosd.batch-size"], lr=lr,
                       momentum=0.0, seed=seed, device=device_for(),
                       loss_fn=_uce if role == "forget" else None)
    gradient = {name: (start[name] - p.detach().cpu()) / lr for name, p in model.named_parameters()}
    return {"gradient": gradient, "metrics": {"num-examples": len(y), "loss": loss}}
