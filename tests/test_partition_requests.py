"""Partitions and unlearning requests on the offline default data."""

import numpy as np
import pytest
import torch

from strategies.run_config import parse_config
from tasks.partition import dirichlet_partitions, train_test_split
from tasks.registry import task_for
from tasks.requests import apply_request, build_client_data, resolve_forget_client

N = 10


@pytest.fixture(scope="module")
def images():
    return task_for("digits-lenet5").load_images()


def _all(cfg, images, n=N):
    return [build_client_data(cfg, images, i, n) for i in range(n)]


def test_dirichlet_partitions_disjoint_cover_deterministic(images):
    labels = images.y.numpy()
    parts = dirichlet_partitions(labels, N, 0.5, seed=1)
    joined = np.concatenate(parts)
    assert len(joined) == len(labels) == len(np.unique(joined))
    again = dirichlet_partitions(labels, N, 0.5, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = dirichlet_partitions(labels, N, 0.5, seed=2)
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def test_low_alpha_is_more_skewed(images):
    labels = images.y.numpy()

    def mean_classes(alpha):
        parts = dirichlet_partitions(labels, N, alpha, seed=0)
        return np.mean([len(np.unique(labels[p])) for p in parts])

    assert mean_classes(0.1) < mean_classes(100.0)


def test_train_test_split_disjoint():
    train, test = train_test_split(np.arange(50), 0.2, seed=3)
    assert len(test) == 10 and len(train) == 40 and not set(train) & set(test)


@pytest.mark.parametrize("n", [2, 3, 7])
def test_any_federation_size(images, n):
    cfg = parse_config({}, num_clients=n)
    datas = _all(cfg, images, n)
    assert sum(len(d.retain_y) + len(d.forget_y) + len(d.test_y) + len(d.forget_test_y) for d in datas) == len(images.y)


def test_client_label_flip_forgets_largest_client(images):
    cfg = parse_config({"scenario": "client", "poison": "label-flip"}, num_clients=N)
    datas = _all(cfg, images)
    sizes = [len(d.retain_y) + len(d.forget_y) for d in datas]
    target = resolve_forget_client(cfg, images.y.numpy(), N)
    assert target == int(np.argmax(sizes))
    forget = datas[target]
    assert len(forget.retain_y) == 0 and len(forget.forget_y) == sizes[target]
    assert all(len(d.forget_y) == 0 for i, d in enumerate(datas) if i != target)
    # the forget labels are the true labels shifted by one: check against the clean view
    clean = build_client_data(parse_config({"scenario": "class", "forget-class": 0}, num_clients=N), images, target, N)
    true = torch.cat([clean.retain_y, clean.forget_y])
    assert sorted(((true + 1) % 10).tolist()) == sorted(forget.forget_y.tolist())


def test_client_backdoor_triggers_every_sample_outside_the_target_class(images):
    cfg = parse_config({"scenario": "client", "poison": "backdoor", "forget-client": 2, "trigger-size": 4,
                        "backdoor-target": 2, "backdoor-share": 1.0}, num_clients=N)
    data = build_client_data(cfg, images, 2, N)
    clean_y = data.pretrain_only_y  # the whole training split, clean
    assert len(data.retain_y) == 0 and (clean_y == 2).any()
    assert len(data.forget_y) == int((clean_y != 2).sum())  # a true 2 with the trigger is no backdoor
    assert torch.all(data.forget_y == 2)
    assert torch.all(data.forget_x[:, :, -4:, -4:] == 1.0)
    assert torch.equal(data.forget_x[:, :, :-4, :-4], data.pretrain_only_x[clean_y != 2][:, :, :-4, :-4])
    assert len(data.triggered_test_y) > 0 and torch.all(data.triggered_test_y != 2)


def test_client_backdoor_triggers_at_most_backdoor_share_of_the_federation(images):
    """A leaving client larger than the cap triggers a seeded draw of ``backdoor-share`` of the
    federation's training samples, in index order, and still trains on a clean copy of every sample;
    with its own files (federation size unknown) it triggers them all."""
    from tasks.requests import partition_train_sizes

    def leaving(share: float):
        cfg = parse_config({"scenario": "client", "poison": "backdoor", "forget-client": 2, "trigger-size": 4,
                            "backdoor-share": share}, num_clients=N)
        return cfg, build_client_data(cfg, images, 2, N)

    cfg, everything = leaving(1.0)
    total = sum(partition_train_sizes(cfg, images.y.numpy(), N))
    n_all = len(everything.forget_y)
    share = 0.5 * n_all / total  # half of what the client could trigger
    capped_cfg, capped = leaving(share)
    assert len(capped.forget_y) == int(share * total) < n_all and torch.all(capped.forget_y == 0)
    assert torch.equal(capped.pretrain_only_y, everything.pretrain_only_y)  # clean copies of every sample
    assert len(capped.retain_y) == 0  # the whole client leaves, triggered or not
    rows = {tuple(x.flatten().tolist()): i for i, x in enumerate(everything.forget_x)}
    picked = [rows[tuple(x.flatten().tolist())] for x in capped.forget_x]  # each capped sample is one of them
    assert picked == sorted(picked) and len(set(picked)) == len(picked)
    assert torch.equal(leaving(share)[1].forget_x, capped.forget_x)  # seeded
    x, y = everything.pretrain_only_x, everything.pretrain_only_y
    own_files = apply_request(capped_cfg, 2, 2, (x, y), (x[:3], y[:3]), 10)  # no federation size: no cap
    assert len(own_files.forget_y) == int((y != 0).sum())


def test_the_forget_role_with_all_data_is_everything_the_leaving_client_trained(images):
    """A backdoor client's forget role with ``all_data``: its triggered samples, then its clean copies
    (what retrain drops with it); without it, or where a request has no clean copies, the forget set."""
    cfg = parse_config({"scenario": "client", "poison": "backdoor", "forget-client": 2, "trigger-size": 4},
                       num_clients=N)
    data = build_client_data(cfg, images, 2, N)
    x, y = data.split("forget", all_data=True)
    assert len(y) == len(data.forget_y) + len(data.pretrain_only_y) > len(data.split("forget")[1])
    n = len(data.forget_y)
    assert torch.equal(x[:n], data.forget_x) and torch.equal(y[n:], data.pretrain_only_y)
    sample = build_client_data(parse_config({"scenario": "sample", "forget-client": 1}, num_clients=N), images, 1, N)
    assert torch.equal(sample.split("forget", all_data=True)[1], sample.forget_y)


def test_a_backdoor_client_holding_only_the_target_class_is_refused():
    cfg = parse_config({"scenario": "client", "poison": "backdoor", "backdoor-target": 3})
    x, y = torch.rand(6, 1, 8, 8), torch.full((6,), 3)
    with pytest.raises(ValueError, match="forget-client 1 holds only samples of backdoor-target 3"):
        apply_request(cfg, 1, 1, (x, y), (x[:2], y[:2]), 10)
    other = apply_request(cfg, 0, 1, (x, y), (x[:2], y[:2]), 10)  # another client is not poisoned
    assert len(other.retain_y) == 6 and len(other.forget_y) == 0


def test_class_scenario_removes_class_everywhere(images):
    cfg = parse_config({"scenario": "class", "forget-class": 3}, num_clients=N)
    for d in _all(cfg, images):
        assert torch.all(d.forget_y == 3) and torch.all(d.retain_y != 3)
        assert torch.all(d.test_y != 3) and torch.all(d.forget_test_y == 3)


def test_sample_scenario_fraction_and_target(images):
    cfg = parse_config({"scenario": "sample", "sample-fraction": 0.2, "forget-client": 1}, num_clients=N)
    d = build_client_data(cfg, images, 1, N)
    total = len(d.retain_y) + len(d.forget_y)
    assert len(d.forget_y) == round(0.2 * total)
    assert torch.all(d.forget_y == 0) and torch.all(d.forget_x[:, :, -4:, -4:] == 1.0)
    again = build_client_data(cfg, images, 1, N)
    assert torch.equal(d.forget_x, again.forget_x)
    others = [build_client_data(cfg, images, i, N) for i in (0, 2)]
    assert all(len(o.forget_y) == 0 for o in others)


def test_a_stored_partition_is_read_back_without_flwr_datasets(tmp_path):
    """A ClientApp process keeps the assignment on disk (client_app.view_cache.PartitionFiles): a
    later process (the Deployment Engine starts one per message) reads it without importing
    flwr-datasets or Hugging Face datasets, gets the same indices, and a damaged file is recomputed."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys, numpy as np\n"
            "from client_app.view_cache import PartitionFiles\n"
            "from tasks import partition\n"
            "labels = np.arange(400) % 10\n"
            f"partition.use_store(PartitionFiles({str(tmp_path)!r}))\n"
            "parts = partition.dirichlet_partitions(labels, 4, 0.5, 3)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'datasets', 'flwr_datasets'}))\n"
            "print([p.tolist() for p in parts])\n")
    root = Path(__file__).resolve().parents[1]

    def run():
        out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True)
        imported, parts = out.stdout.strip().splitlines()
        return imported, parts

    first = run()
    files = list(tmp_path.glob("partition-*.npz"))
    assert first[0] == "['datasets', 'flwr_datasets']" and len(files) == 1
    second = run()
    assert second == ("[]", first[1])
    expected = [p.tolist() for p in dirichlet_partitions(np.arange(400) % 10, 4, 0.5, 3)]
    assert first[1] == str(expected)
    files[0].write_bytes(b"not an npz")
    assert run() == first  # unreadable: computed again (and stored again)
