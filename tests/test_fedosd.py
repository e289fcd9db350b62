"""FedOSD: the unlearning cross-entropy, the orthogonal projection, the post-training rule, the client."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace

import pytest
import torch
from flwr.app import ArrayRecord
from flwr.supercore.task_identity import TaskIdentity

from core.config import ConfigError
from strategies.common.base import ModelState, UnlearnContext
from strategies.common.federation import PhaseCost
from strategies.fedosd.client import fedosd_query
from strategies.fedosd.maths import (
    flatten,
    orthogonal_direction,
    unflatten,
    unlearning_cross_entropy,
    without_component,
)
from strategies.fedosd.strategy import FedOSD
from strategies.run_config import parse_config
from tasks.registry import task_for
from tasks.requests import build_client_data


def test_unlearning_cross_entropy_is_minus_log_one_minus_half_p():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0]])
    labels = torch.tensor([0, 2])
    p = torch.softmax(logits, dim=-1)
    expected = -(math.log(1 - p[0, 0].item() / 2) + math.log(1 - p[1, 2].item() / 2)) / 2
    assert unlearning_cross_entropy(logits, labels).item() == pytest.approx(expected, rel=1e-6)
    confident = unlearning_cross_entropy(torch.tensor([[20.0, 0.0, 0.0]]), torch.tensor([0]))
    assert confident.item() == pytest.approx(math.log(2), rel=1e-6)  # bounded by log 2 where p_y = 1


def test_direction_is_orthogonal_to_every_retained_gradient_and_keeps_the_norm():
    generator = torch.Generator().manual_seed(0)
    retained = torch.randn(3, 10, generator=generator)
    g_u = torch.randn(10, generator=generator)
    d = orthogonal_direction(g_u, retained)
    assert torch.allclose(retained @ d, torch.zeros(3), atol=1e-4)
    assert torch.linalg.vector_norm(d).item() == pytest.approx(torch.linalg.vector_norm(g_u).item(), rel=1e-5)
    # a repeated row makes A Aᵀ singular: the pseudo-inverse still gives the projection
    d_repeated = orthogonal_direction(g_u, torch.cat([retained, retained[:1]]))
    assert torch.allclose(d_repeated, d, atol=1e-4)


def test_direction_is_g_u_when_nothing_conflicts():
    g_u = torch.tensor([1.0, 2.0, 0.0, 0.0])
    assert torch.equal(orthogonal_direction(g_u, torch.zeros(0, 4)), g_u)
    orthogonal = torch.tensor([[0.0, 0.0, 3.0, 0.0], [0.0, 0.0, 0.0, -1.0]])
    assert torch.allclose(orthogonal_direction(g_u, orthogonal), g_u)
    # g_u inside the span of A: nothing orthogonal is left, and the direction is zero, not 0/0
    assert torch.equal(orthogonal_direction(torch.tensor([0.0, 0.0, 1.0, 0.0]), orthogonal), torch.zeros(4))
    with pytest.raises(ValueError, match=r"\(k, n\) matrix"):
        orthogonal_direction(g_u, torch.zeros(2, 3))


def test_post_training_drops_the_component_along_the_movement():
    moved = torch.tensor([1.0, 0.0, 0.0])
    g = torch.tensor([3.0, 4.0, 0.0])
    out = without_component(g, moved)
    assert out @ moved == pytest.approx(0.0, abs=1e-6)
    assert torch.allclose(out, torch.tensor([0.0, 5.0, 0.0]))  # rescaled to ||g|| = 5
    assert torch.equal(without_component(g, torch.zeros(3)), g)


def test_flatten_round_trips():
    state = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.tensor([7.0])}
    vector = flatten(state, ["b", "a"])
    assert torch.equal(vector, torch.tensor([7.0, 0, 1, 2, 3, 4, 5]))
    back = unflatten(vector, state, ["b", "a"])
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_client_gradients_for_each_role_on_a_digits_partition():
    task = task_for("digits-lenet5")
    cfg = parse_config({"method": "fedosd", "scenario": "client", "poison": "backdoor", "forget-client": 0,
                        "fedosd.batch-size": 64}, num_clients=3)
    images = task.load_images()
    leaving, other = build_client_data(cfg, images, 0, 3), build_client_data(cfg, images, 1, 3)
    model = task.build_model([], seed=0)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    forget = fedosd_query(task, cfg, leaving, task.client_model(cfg, start, []), {"role": "forget", "lr": 0.01}, 1)
    retain = fedosd_query(task, cfg, other, task.client_model(cfg, start, []), {"role": "retain", "lr": 0.01}, 1)
    names = [n for n, _ in model.named_parameters()]
    assert set(forget["gradient"]) == set(names) == set(retain["gradient"])
    assert forget["metrics"]["num-examples"] == len(leaving.forget_y)
    assert 0 < forget["metrics"]["loss"] <= math.log(2)  # the unlearning cross-entropy is bounded
    assert retain["metrics"]["num-examples"] == len(other.retain_y)
    g = flatten(forget["gradient"], names)
    assert torch.isfinite(g).all() and torch.linalg.vector_norm(g) > 0
    with pytest.raises(ValueError, match="role must be forget or retain"):
        fedosd_query(task, cfg, other, task.client_model(cfg, start, []), {"role": "all", "lr": 0.01}, 1)


def test_fedosd_runs_in_the_client_scenario_only():
    with pytest.raises(ConfigError, match=r"'scenario'='class' is not supported by method 'fedosd'"):
        parse_config({"method": "fedosd", "scenario": "class"})
    with pytest.raises(ConfigError, match="'fedosd.lr-decay'"):
        parse_config({"method": "fedosd", "scenario": "client", "fedosd.lr-decay": 1.5})


class _FixedGradients:
    """A stand-in for the federation: node 0 leaves, nodes 1 and 2 stay; every node answers
    ``query.fedosd`` with a fixed gradient, and what was asked is recorded."""

    phase = "unlearn"

    def __init__(self, gradients: dict[int, torch.Tensor]):
        self.gradients, self.asked = gradients, []
        self.counts = {0: {"n-forget": 5}, 1: {"n-retain": 5}, 2: {"n-retain": 5}}
        self.spent = PhaseCost()

    def nodes_with(self, key):
        return [n for n, counts in self.counts.items() if counts.get(key, 0) > 0]

    def exchange(self, messages, *, round_no):
        self.asked.append({m.metadata.dst_node_id: m.content["config"]["role"] for m in messages})
        return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=m.metadata.dst_node_id),
                                content={"gradient": ArrayRecord({"weight": self.gradients[m.metadata.dst_node_id]})})
                for m in messages]

    def cost(self, phase):
        return self.spent


def test_server_steps_orthogonally_then_post_trains_without_the_movement(monkeypatch):
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # as the in-process grid
        monkeypatch.setattr(TaskIdentity, name, value)
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.zero_()
    g_forget, g_one, g_two = torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0.0, 2.0, 0.0]])
    fed = _FixedGradients({0: g_forget, 1: g_one, 2: g_two})
    cfg = parse_config({"method": "fedosd", "scenario": "client", "fedosd.unlearn-rounds": 1, "fedosd.recovery-rounds": 1,
                        "fedosd.lr": 0.5, "fedosd.recovery-lr": 0.1, "fedosd.lr-decay": 1.0})
    ctx = UnlearnContext(fed, cfg, ModelState(ArrayRecord(model.state_dict())), lambda plugins: model, lambda: None)
    result = FedOSD().unlearn(ctx)
    assert fed.asked == [{1: "retain", 2: "retain", 0: "forget"}, {1: "retain", 2: "retain"}]
    # round 1: g_u = (1, 1, 1) loses its parts along both retained gradients -> (0, 0, 1), rescaled to sqrt(3)
    after_unlearning = -0.5 * torch.tensor([0.0, 0.0, math.sqrt(3)])
    # round 2: each retained gradient is already orthogonal to w - w_start = (0, 0, -); their mean is (0.5, 1, 0)
    expected = after_unlearning - 0.1 * torch.tensor([0.5, 1.0, 0.0])
    assert torch.allclose(result.model.arrays.to_torch_state_dict()["weight"].view(-1), expected, atol=1e-6)
    assert fed.spent.rounds == 2 and result.details["forget_gradient_norm_first"] == pytest.approx(math.sqrt(3))


def test_a_forget_loss_without_gradient_is_said_and_counted(monkeypatch, caplog):
    """A saturated original gives the leaving client a zero gradient: the unlearning rounds cannot
    move the model, and the run says so once in the log and counts the rounds in its details."""
    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):
        monkeypatch.setattr(TaskIdentity, name, value)
    model = torch.nn.Linear(3, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(1.0)
    fed = _FixedGradients({0: torch.zeros(1, 3), 1: torch.tensor([[1.0, 0.0, 0.0]]),
                           2: torch.tensor([[0.0, 2.0, 0.0]])})
    cfg = parse_config({"method": "fedosd", "scenario": "client", "fedosd.unlearn-rounds": 3,
                        "fedosd.recovery-rounds": 0})
    ctx = UnlearnContext(fed, cfg, ModelState(ArrayRecord(model.state_dict())), lambda plugins: model, lambda: None)
    with caplog.at_level(logging.WARNING, logger="fedunlearn"):
        result = FedOSD().unlearn(ctx)
    assert result.details["forget_gradient_zero_rounds"] == 3
    assert torch.equal(result.model.arrays.to_torch_state_dict()["weight"], torch.ones(1, 3))
    said = [r.getMessage() for r in caplog.records if "no gradient" in r.getMessage()]
    assert len(said) == 1 and "round 1" in said[0]
