"""Stacked FedUP filters (a stream of requests, not in the paper): what a later filter keeps as it finds it.

The paper trains one filter for one request. In a stream each request adds a filter after the
earlier ones, and any one of them can be unplugged alone. A later filter is trained on the
centroids of the data retained at its request, which no longer hold an earlier request's forget
data: left to itself it maps those features wherever the retained classes pull them, so
unplugging the earlier filter would not give its request's knowledge back.

The server therefore keeps each request's forget centroids, as it received them when it answered
that request (:func:`forget_rows`), and adds them to every later filter's training rows
(:func:`earlier_rows`), twice: as they reach the new filter with the earlier filter in place and
with it removed. Each such row's target is the class the model without the new filter gives it,
and its reconstruction target is itself (the loss is the filter's usual one): the new filter
leaves them as it finds them. These are centroids the clients already sent (DP-noised where the
request was), so nothing new is uploaded and no privacy is spent.
"""

from __future__ import annotations

import torch
from torch import nn


def predicted_classes(head: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """The class ``head`` gives each row of ``features`` (eval mode, no gradients, its mode restored)."""
    was_training = head.training
    head.eval()
    try:
        with torch.no_grad():
            return head(features.to(next(head.parameters()).device).float()).argmax(dim=1).cpu()
    finally:
        head.train(was_training)


def forget_rows(head: nn.Module, centroids: torch.Tensor, flagged: torch.Tensor,
                relabelled_class: int | None) -> torch.Tensor:
    """Which of a request's centroids are its forget data: the ``flagged`` ones (``divert``) and, where
    the clients relabelled a forgotten class (``relabelled_class``, the paper's class request: its
    features arrive under other labels, unflagged), those the model the request starts from
    (``head`` on the centroids) assigns to that class."""
    if relabelled_class is None:
        return flagged.clone()
    return flagged | (predicted_classes(head, centroids) == relabelled_class)


def earlier_rows(plugins: nn.ModuleList, head: nn.Module, kept: dict[int, torch.Tensor],
                 removed_class: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows a new filter placed after ``plugins`` (the starting model's filters) keeps as it finds
    them: for every filter index in ``kept`` (its request's forget centroids, at that filter's
    input), those centroids passed through ``plugins`` from that filter on (it in place) and from
    the next one on (it removed), with the class ``head`` gives each.

    Rows given ``removed_class`` (the class the new request removes) are left out: keeping them would
    keep that class, and the new request asks for it to go. Returns ``(features (M, d), classes (M,))``.
    """
    rows = []
    modes = [plugin.training for plugin in plugins]
    plugins.eval()
    try:
        with torch.no_grad():
            for index in sorted(i for i in kept if i < len(plugins)):
                for first in (index, index + 1):
                    features = kept[index]
                    for plugin in plugins[first:]:
                        features = plugin(features)
                    rows.append(features)
    finally:
        for plugin, mode in zip(plugins, modes):
            plugin.train(mode)
    if not rows:
        width = next((c.shape[1] for c in kept.values()), 0)
        return torch.zeros(0, width), torch.zeros(0, dtype=torch.long)
    features = torch.cat(rows)
    classes = predicted_classes(head, features)
    if removed_class is not None:
        keep = classes != removed_class
        features, classes = features[keep], classes[keep]
    return features, classes
