"""Lethe's exact fallback: which classes a request removes most of, read from the nodes' label counts."""

from strategies.common.federation import NodeInfo
from strategies.lethe.exact import mostly_removed_classes


class _Fed:
    """What ``mostly_removed_classes`` reads of a federation: its nodes."""

    def __init__(self, *class_counts):
        self.nodes = {i: NodeInfo(i, i, class_counts=counts) for i, counts in enumerate(class_counts)}


def test_a_class_mostly_removed_but_not_entirely_is_named_with_its_share():
    fed = _Fed({"retain": [0, 1, 50, 0], "removed": [40, 9, 50, 0]},  # the leaving node
               {"retain": [10, 0, 50, 7], "removed": [0, 0, 0, 0]})
    # class 0: 40 of 50 removed (0.8); class 1: 9 of 10 (0.9); class 2: half; class 3: none
    assert mostly_removed_classes(fed, 0.8) == {0: 0.8, 1: 0.9}
    assert mostly_removed_classes(fed, 0.85) == {1: 0.9}
    assert mostly_removed_classes(fed, 1.0) == {}


def test_a_class_removed_entirely_or_a_federation_without_label_counts_names_nothing():
    whole_class = _Fed({"retain": [30, 0], "removed": [0, 25]}, {"retain": [30, 0], "removed": [0, 12]})
    assert mostly_removed_classes(whole_class, 0.5) == {}  # the class scenario: nothing of class 1 is kept
    assert mostly_removed_classes(_Fed({}, {}), 0.5) == {}  # no node sent counts (a task without classes)
