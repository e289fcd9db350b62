"""Lethe's exact fallback: the requests its rectification cannot approximate, read from label counts.

A request that removes most of a class's training samples but not all of them (a leaving client
that holds nearly every sample of a class, at a strongly non-IID split) asks for a model that knows
that class only as well as the few samples the other clients hold teach it. Exact retraining learns
it from those samples alone, and what it keeps varies with which samples they are; Lethe starts from
a model that knows the class and either forgets it or keeps it, never "as much as those few samples
teach". Measured on digits, 7 clients at alpha 0.1, client scenario (docs/lethe-log.md, "The leaving
client's classes, measured class by class" and "Lethe's exact fallback"): on such classes Lethe ended
from 0.54 below retrain's test accuracy to 0.27 above it, and every test miss of Lethe below retrain
on seeds 225-255 was such a cell, while outside those classes it stayed within 0.021 of retrain.

So where the request removes at least ``lethe-exact-share`` of some class and the retained clients
hold the rest, Lethe does not rectify: it returns exact retraining on the retained clients (the run's
retrain model, at retrain's cost), and says so in ``method.exact_fallback``. A request that removes a
class entirely (the class scenario) is not such a request: every method's target there is to know
the class not at all.
"""

from __future__ import annotations

from strategies.common.federation import Federation


def mostly_removed_classes(fed: Federation, share: float) -> dict[int, float]:
    """``{class: removed share}`` of every class of which the request removes at least ``share`` of
    the federation's training samples while the retained clients keep at least one (from the label
    counts every node sent with its hello, the removed ones by their true labels; empty where none sent
    them: a task without classes)."""
    removed, kept = _summed(fed, "removed"), _summed(fed, "retain")
    shares = {}
    for label, (gone, left) in enumerate(zip(removed, kept)):
        if gone and left and gone / (gone + left) >= share:
            shares[label] = round(gone / (gone + left), 4)
    return shares


def _summed(fed: Federation, role: str) -> list[int]:
    """Training samples per class of ``role`` (``retain`` or ``removed``) summed over the nodes that
    sent them (each sends one count per class of the task)."""
    lists = [node.class_counts[role] for node in fed.nodes.values() if role in node.class_counts]
    return [sum(column) for column in zip(*lists)]
