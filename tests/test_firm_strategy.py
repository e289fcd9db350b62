"""FIRM server aggregator and merge baselines over synthetic client uploads."""

import json
import logging
import math

import pytest
import torch

from strategies.firm.aggregate import FIRM, firm_aggregate, validate_uploads
from strategies.merges.merge import merge_baseline
from strategies.firm.maths import firm_merge
from strategies.firm.projection import proxy_damage

SHAPES = {"layer.0.weight": (12, 8), "layer.1.weight": (16,)}


def upload(client_id, role, seed, domain="bio", scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {
        "client_id": client_id,
        "role": role,
        "domain": domain,
        "task_vector": {n: scale * torch.randn(s, generator=g) for n, s in SHAPES.items()},
        "fisher": {n: torch.rand(s, generator=g).square() for n, s in SHAPES.items()},
        "num_examples": 10,
    }


def federation(forget=2, retain=2):
    return [upload(f"f{i}", "forget", i, domain=f"d{i % 2}") for i in range(forget)] + [
        upload(f"r{i}", "retain", 100 + i) for i in range(retain)
    ]


def test_malformed_uploads_are_dropped_with_a_warning(caplog):
    good = federation()
    bad_shape = upload("x1", "forget", 7)
    bad_shape["task_vector"]["layer.1.weight"] = torch.zeros(5)
    negative = upload("x2", "retain", 8)
    negative["fisher"]["layer.0.weight"] = -negative["fisher"]["layer.0.weight"]
    nan = upload("x3", "forget", 9)
    nan["task_vector"]["layer.0.weight"][0, 0] = math.nan
    bad_role = upload("x4", "helper", 10)
    missing = {k: v for k, v in upload("x5", "forget", 11).items() if k != "fisher"}
    duplicate = upload("f0", "retain", 12)
    with caplog.at_level(logging.WARNING, logger="strategies.firm.aggregate"):
        merged, report = FIRM(gamma=1.0).aggregate(good + [bad_shape, negative, nan, bad_role, missing, duplicate])
    assert set(report.dropped) == {"x1", "x2", "x3", "x4", "x5", "f0"}  # the second "f0" is dropped
    assert "duplicate" in report.dropped["f0"]
    assert report.used == [u["client_id"] for u in good]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 6
    clean, _ = FIRM(gamma=1.0).aggregate(good)
    assert all(torch.equal(merged[n], clean[n]) for n in SHAPES)


def test_no_usable_forget_upload_raises_one_line_error():
    broken = upload("f0", "forget", 0)
    broken["fisher"] = {n: torch.full(s, math.inf) for n, s in SHAPES.items()}
    for uploads in ([broken, upload("r0", "retain", 1)], [upload("r0", "retain", 1)], [], ["junk"]):
        with pytest.raises(ValueError, match="forget upload") as info:
            FIRM().aggregate(uploads)
        assert "\n" not in str(info.value)


def test_expected_shapes_from_the_server_override_the_majority():
    uploads = [upload("f0", "forget", 0), upload("f1", "forget", 1)]
    odd = {n: (s[0] + 1,) + tuple(s[1:]) for n, s in SHAPES.items()}
    with pytest.raises(ValueError, match="forget upload"):
        validate_uploads(uploads, expected_shapes=odd)
    kept, dropped = validate_uploads(uploads, expected_shapes=SHAPES)
    assert [u.client_id for u in kept] == ["f0", "f1"] and not dropped


def test_merged_update_does_not_grow_with_the_number_of_clients():
    firm_norms, sum_norms = [], []
    for n in (1, 4, 12):
        uploads = [upload(f"f{i}", "forget", i, domain=f"d{i}") for i in range(n)] + [upload("r", "retain", 99)]
        merged, report = FIRM(gamma=1.0).aggregate(uploads)
        taus = torch.stack([u["task_vector"]["layer.0.weight"] for u in uploads[:n]]).abs().max(0).values
        retain_tau = uploads[-1]["task_vector"]["layer.0.weight"].abs()
        assert bool((merged["layer.0.weight"].abs() <= (taus + retain_tau) * (1 + 1e-6)).all())
        firm_norms.append(report.merged_norm)
        sum_norms.append(merge_baseline("sum", uploads, 1.0)[1].merged_norm)
    assert firm_norms[2] < 2.0 * firm_norms[0]
    assert sum_norms[2] > 2.0 * sum_norms[0]  # the summing baseline does grow


def test_infinite_epsilon_returns_the_base_merge_unprojected():
    uploads = federation()
    merged, report = FIRM(gamma=0.7, epsilon=math.inf).aggregate(uploads)
    forget = [u for u in uploads if u["role"] == "forget"]
    retain = [u for u in uploads if u["role"] == "retain"]
    base, _ = firm_merge([u["task_vector"] for u in forget], [u["fisher"] for u in forget],
                         [u["domain"] for u in forget], [u["task_vector"] for u in retain],
                         [u["fisher"] for u in retain], 0.7)
    assert all(torch.equal(merged[n], base[n]) for n in SHAPES)
    assert all(t.lambdas == [0.0, 0.0] and t.base_norm == t.merged_norm for t in report.tensors.values())


def test_finite_epsilon_projection_satisfies_every_retain_budget():
    uploads = federation(forget=3, retain=3)
    free, free_report = FIRM(gamma=2.0, alpha=0.5).aggregate(uploads)
    epsilon = 0.3 * min(min(t.damages) for t in free_report.tensors.values())
    merged, report = FIRM(gamma=2.0, alpha=0.5, epsilon=epsilon).aggregate(uploads)
    assert report.merged_norm < free_report.merged_norm
    for name, tensor_report in report.tensors.items():
        assert len(tensor_report.damages) == 3
        assert all(b <= epsilon * (1 + 1e-6) for b in tensor_report.damages)
        assert tensor_report.residuals.worst() <= 1e-6
        assert max(tensor_report.lambdas) > 0
        assert bool((merged[name].abs() <= free[name].abs() * (1 + 1e-6)).all())
        assert tensor_report.base_norm == pytest.approx(float(free[name].double().norm()), rel=1e-12)  # before
    json.dumps(report.to_dict())  # serialisable for results.json


def test_settings_are_validated_and_read_from_run_config():
    firm = FIRM.from_config({"firm.gamma": 2, "firm.alpha": 0.2, "firm.epsilon": "inf", "other": 1})
    assert (firm.gamma, firm.alpha, firm.eps0, firm.epsilon) == (2.0, 0.2, 1e-8, math.inf)
    for kwargs, key in (({"gamma": -1}, "firm.gamma"), ({"alpha": 0}, "firm.alpha"),
                        ({"eps0": 0}, "firm.eps0"), ({"epsilon": 0}, "firm.epsilon")):
        with pytest.raises(ValueError, match=key):
            firm_aggregate(federation(), **kwargs)


@pytest.mark.parametrize("name, roles", [("avg", 4), ("sum", 2), ("ties", 2), ("fulm", 4)])
def test_merge_baselines_use_the_papers_roles(name, roles):
    uploads = federation() + [{"client_id": "bad"}]
    merged, report = merge_baseline(name, uploads, 0.5)
    assert len(report.used) == roles and "bad" in report.dropped
    assert set(merged) == set(SHAPES)
    doubled, _ = merge_baseline(name, uploads, 1.0)
    assert all(torch.allclose(2 * merged[n], doubled[n]) for n in SHAPES)
    with pytest.raises(ValueError, match="merge baseline"):
        merge_baseline("median", uploads, 1.0)


def test_proxy_damages_in_report_are_those_of_the_delivered_update():
    uploads = federation(forget=1, retain=1)
    merged, report = FIRM(alpha=1.0, epsilon=1e-3).aggregate(uploads)
    from strategies.firm.maths import normalise_and_sparsify

    fisher = normalise_and_sparsify(uploads[1]["fisher"], 1.0, 1e-8)
    for name in SHAPES:
        assert report.tensors[name].damages[0] == pytest.approx(proxy_damage(merged[name], fisher[name]), rel=1e-9)
