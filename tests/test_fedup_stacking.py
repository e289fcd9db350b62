"""Stacked FedUP filters: which centroids are a request's forget data, and what a later filter keeps."""

import torch
from torch import nn

from strategies.fedup.stacking import earlier_rows, forget_rows


class Shift(nn.Module):
    """A stand-in filter that adds a constant: easy to follow through a stack."""

    def __init__(self, by: float):
        super().__init__()
        self.by = by

    def forward(self, z):
        return z + self.by


def _head() -> nn.Linear:
    """Class 0 for a negative first coordinate, class 1 for a positive one."""
    head = nn.Linear(2, 2, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[-1.0, 0.0], [1.0, 0.0]]))
    return head


def test_forget_rows_are_the_flagged_ones_or_those_the_start_model_gives_the_relabelled_class():
    centroids = torch.tensor([[-1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    flagged = torch.tensor([True, False, False])
    assert forget_rows(_head(), centroids, flagged, None).tolist() == [True, False, False]
    assert forget_rows(_head(), centroids, flagged, 1).tolist() == [True, True, True]
    assert forget_rows(_head(), centroids, torch.zeros(3, dtype=torch.bool), 0).tolist() == [True, False, False]


def test_earlier_rows_pass_each_request_with_its_filter_in_place_and_removed():
    plugins = nn.ModuleList([Shift(-10.0), Shift(0.5)])
    kept = {0: torch.tensor([[2.0, 0.0]])}
    features, classes = earlier_rows(plugins, _head(), kept, removed_class=None)
    # in place: -10 then +0.5; removed: +0.5 only
    assert torch.equal(features, torch.tensor([[-7.5, -9.5], [2.5, 0.5]]))
    assert classes.tolist() == [0, 1]
    # the class the new request removes is not kept
    features, classes = earlier_rows(plugins, _head(), kept, removed_class=1)
    assert torch.equal(features, torch.tensor([[-7.5, -9.5]])) and classes.tolist() == [0]


def test_earlier_rows_ignore_filters_the_starting_model_does_not_hold():
    features, classes = earlier_rows(nn.ModuleList([Shift(1.0)]), _head(), {3: torch.ones(2, 2)}, None)
    assert features.shape == (0, 2) and classes.shape == (0,)
    features, _ = earlier_rows(nn.ModuleList(), _head(), {}, None)
    assert len(features) == 0
