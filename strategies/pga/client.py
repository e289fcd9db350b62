"""PGA's client side: the leaving client unlearns itself by projected gradient ascent (``query.pga``).

In one message the leaving client (1) trains its own model ``w_i`` from the received global model
as in a FedAvg round (its pretraining data and epochs), (2) forms the reference model of the others
``w_ref = (w - p w_i) / (1 - p)`` (``p``: its FedAvg weight, sent by the server), (3) sets the
ball radius from the mean squared distance of ``w_ref`` to ``pga.random-models`` fresh models
(times ``pga.radius-fraction``, the notebook's 1/3), and (4) runs SGD (momentum 0.9) on the
negated cross-entropy of its forget data from ``w_ref``: each step's gradient clipped to
``pga.clip``, the weights projected back into the ball, and the ascent stopped once the squared
distance from ``w_i`` exceeds ``pga.stop-factor`` x that of ``w_ref`` (at most ``pga.epochs`` epochs).

The client's own model ``w_i`` is its local model of the last pretraining round, as the notebook
keeps it: pretraining asks every client to keep that model on its own disk (PGA ``needs``
``last-local-model``; ``client_app.kept_models``) and the query names the original it belongs to.
Where the client kept none (its disk was wiped, or the cached original predates keeping), it
retrains ``w_i`` from the received global model as in a FedAvg round (its pretraining data and
epochs) and says so (``own-model-kept`` = 0): an approximation, not the paper's model.

Class and sample requests (FedUP's Table 3 applies PGA there): every client holding forget data
runs the same ascent, on its forget set only; ``w_i`` is still its whole local model.
The notebook stops the ascent at an absolute squared distance of 2.2 from ``w_i`` (its MNIST
network). That number belongs to its network and data: on digits with LeNet-5 the reference model
itself already lies at a squared distance of tens from ``w_i``, so that rule would end the ascent
after one step. The threshold is therefore relative to where the ascent starts:
``pga.stop-factor`` x ``||w_ref - w_i||^2``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from strategies.pga.maths import project_to_ball, reference_model, squared_distance
from tasks.training import MomentumSGD, device_for, train_local


def _params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _load_params(model: torch.nn.Module, params: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(params[name])


def _own_model(task, cfg, data, model, kept: dict | None, seed: int, device) -> dict[str, torch.Tensor]:
    """``w_i``: the kept last-round local model, else one local round retrained from the global model."""
    own = task.client_model(cfg, model.state_dict(), [])
    if kept is not None:
        own.load_state_dict(kept)
    else:
        x_all, y_all = data.split("all")
        train_local(own, x_all, y_all, epochs=data.local_epochs("all", cfg, cfg["local-epochs"]),
                    batch_size=cfg["batch-size"], lr=cfg["lr"], momentum=cfg["momentum"], seed=seed, device=device)
    return {k: v.to("cpu") for k, v in _params(own).items()}


def pga_query(task, cfg, data, model, conf: dict, seed: int) -> dict:
    """The registered ``query.pga`` handler: the unlearned model and how the ascent went."""
    device = device_for()
    global_params = _params(model)
    own_params = _own_model(task, cfg, data, model, conf.get("kept-local-model"), seed, device)
    own_kept = conf.get("kept-local-model") is not None
    reference = reference_model(global_params, own_params, float(conf["weight"]))
    fresh = [_params(task.server_model(cfg, [], seed=seed + k)) for k in range(cfg["pga.random-models"])]
    radius_sq = cfg["pga.radius-fraction"] * sum(squared_distance(reference, f) for f in fresh) / len(fresh)

    _load_params(model, reference)
    model.to(device).train()
    optimizer = MomentumSGD(model.parameters(), lr=cfg["pga.lr"], momentum=0.9)
    x, y = data.split("forget")
    generator = torch.Generator().manual_seed(seed)
    start_own = squared_distance(reference, own_params)
    steps, stopped, distance_own = 0, False, start_own
    for _ in range(cfg["pga.epochs"]):
        order = torch.randperm(len(y), generator=generator)
        for start in range(0, len(y), cfg["pga.batch-size"]):
            idx = order[start:start + cfg["pga.batch-size"]]
            loss = -F.cross_entropy(model(x[idx].to(device)), y[idx].to(device))
            optimizer.zero_grad()
            loss.backward()
            if cfg["pga.clip"] > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["pga.clip"])
            optimizer.step()
            steps += 1
            current = {k: v.to("cpu") for k, v in _params(model).items()}
            projected = project_to_ball(current, reference, radius_sq)
            if projected is not current:
                _load_params(model, projected)
            distance_own = squared_distance(projected, own_params)
            if distance_own > cfg["pga.stop-factor"] * start_own:
                stopped = True
                break
        if stopped:
            break
    model.eval()
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    distance_reference = squared_distance({k: state[k] for k in reference}, reference)
    return {"arrays": state,
            "metrics": {"num-examples": len(y), "steps": steps, "own-model-kept": int(own_kept), "stopped-at-distance": int(stopped),
                        "distance-to-own": distance_own, "distance-to-reference": distance_reference,
                        "radius-sq": radius_sq,
                        "distance-reference-own": start_own}}
