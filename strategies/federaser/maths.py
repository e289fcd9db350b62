"""FedEraser's calibration, on ``{layer: tensor}`` dicts (no Flower).

"FedEraser: Enabling Efficient Client-Level Data Removal from Federated Learning Models" (Liu et
al.) rebuilds the global model round by round without the leaving client. At a kept round the
remaining clients' old update ``U = mean(oldCM) - oldGM`` says how far the round moved the model;
a short calibration training from the new global model says where to go now,
``Ũ = mean(newCM) - newGM``. The calibrated model takes the old step length in the new direction,
layer by layer:

    newGM' = newGM + ||U||_layer * Ũ / ||Ũ||_layer

Means are FedAvg means weighted by the clients' example counts (the public code averages
equal-sized clients, which is that mean). A layer whose new direction is zero keeps ``newGM``
(there is no direction to step in). Integer buffers (BatchNorm's counters) are taken from the
calibration mean.
"""

from __future__ import annotations

import torch

from strategies.common.updates import weighted_average

Layers = dict[str, torch.Tensor]


def calibrate(new_global: Layers, old_global: Layers, old_mean: Layers, new_mean: Layers) -> Layers:
    """``newGM + ||oldCM - oldGM|| * (newCM - newGM) / ||newCM - newGM||`` per layer."""
    result: Layers = {}
    for name, start in new_global.items():
        if not start.is_floating_point():
            result[name] = new_mean[name].clone()
            continue
        old_step = (old_mean[name].double() - old_global[name].double()).norm()
        direction = new_mean[name].double() - start.double()
        length = direction.norm()
        step = direction * (old_step / length) if length > 0 else torch.zeros_like(direction)
        result[name] = (start.double() + step).to(start.dtype)
    return result


def mean_model(models: list[Layers], counts: list[int]) -> Layers:
    """The example-count-weighted mean of client models (FedAvg's aggregate)."""
    return weighted_average(models, [float(c) for c in counts])
