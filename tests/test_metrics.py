"""What a client measures (``client_metrics``) and how the server pools it (``pool_metrics``): the
pooled test accuracy and its per-class figures come from the same counts."""

import torch
from torch import nn

from tasks.metrics import client_metrics, pool_metrics
from tasks.requests import ClientData


class ConstantClass(nn.Module):
    """Predicts class ``label`` of ``classes`` for every input."""

    def __init__(self, label: int, classes: int = 3):
        super().__init__()
        self.logits = torch.full((classes,), -5.0)
        self.logits[label] = 5.0

    def forward(self, x):
        return self.logits.expand(len(x), -1)


def _client(client_id: int, test_y: list[int]) -> ClientData:
    x = lambda n: torch.zeros(n, 1, 2, 2)  # noqa: E731
    y = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return ClientData(client_id=client_id, retain_x=x(2), retain_y=y([0, 1]), forget_x=x(1), forget_y=y([2]),
                      test_x=x(len(test_y)), test_y=y(test_y), forget_test_x=x(0), forget_test_y=y([]),
                      triggered_test_x=x(0), triggered_test_y=y([]))


def test_test_accuracy_per_class_is_pooled_from_every_clients_counts():
    model = ConstantClass(1)
    one = client_metrics(model, _client(0, [0, 1, 1, 2]), target=0, mia_max_samples=10, seed=0)
    two = client_metrics(model, _client(1, [1, 1]), target=0, mia_max_samples=10, seed=1)
    empty = client_metrics(model, _client(2, []), target=0, mia_max_samples=10, seed=2)
    assert one["test-class-n"] == [1, 2, 1] and one["test-class-correct"] == [0, 2, 0]
    assert empty["test-class-n"] == []  # no test split: nothing counted, nothing pooled from it
    entry = pool_metrics([one, two, empty], seed=0, with_trigger=False, with_forget_test=False)
    assert entry["test_acc_by_class"] == [0.0, 1.0, 0.0]
    assert entry["test_acc"] == 4 / 6  # the same counts: 4 of class 1 right, 2 others wrong


def test_a_class_no_client_tests_reads_none_and_old_clients_send_no_lists():
    model = ConstantClass(0)
    only_zero = client_metrics(model, _client(0, [0, 0]), target=0, mia_max_samples=10, seed=0)
    entry = pool_metrics([only_zero], seed=0, with_trigger=False, with_forget_test=False)
    assert entry["test_acc_by_class"] == [1.0, None, None]
    legacy = {k: v for k, v in only_zero.items() if not k.startswith("test-class")}
    assert "test_acc_by_class" not in pool_metrics([legacy], seed=0, with_trigger=False, with_forget_test=False)
