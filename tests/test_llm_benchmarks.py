"""The FIRM paper's LLM benchmark federations: WMDP-style, MUSE-style and TOFU forget01 tasks."""

from __future__ import annotations

import json
import math
import os
from types import SimpleNamespace

import pytest

from core.config import ConfigError
from strategies.firm.strategy import _upload
from strategies.run_config import parse_config
from tasks.llm.benchmark_synthetic import muse_tables, wmdp_tables
from tasks.llm.muse import FILES, passages
from tasks.llm.tokenizer import synthetic_tokenizer
from tasks.llm.wmdp import table_file
from tasks.registry import task_for
from tests.benchmark_tables import HUB_SHARD, write_tables


def config(task: str, **values):
    return parse_config({"task": task, "method": "firm", **values})


def test_wmdp_synthetic_files_read_back_through_the_real_loader(tmp_path):
    cfg = config("llm-wmdp", **{"llm.synthetic-size": 6})
    task = task_for("llm-wmdp")
    write_tables(tmp_path, {table_file(name) + HUB_SHARD: rows
                            for name, rows in wmdp_tables(["bio", "cyber"], 6, cfg["seed"]).items()})
    assert (tmp_path / "wmdp-bio" / "test-00000-of-00001.parquet").is_file()  # as `hf download cais/wmdp` stores it
    assert (tmp_path / "mmlu" / "all" / "test-00000-of-00001.parquet").is_file()
    from_files = task.tables(config("llm-wmdp", **{"llm.data-dir": str(tmp_path)}))
    assert from_files == task.tables(cfg)
    assert set(from_files) == {"wmdp-bio", "wmdp-cyber", "mmlu"}
    assert all(len(q["choices"]) == 4 and 0 <= q["answer"] < 4 for rows in from_files.values() for q in rows)


def test_only_mmlus_all_test_split_is_the_utility_table(tmp_path):
    rows = wmdp_tables(["bio"], 8, 0)
    write_tables(tmp_path, {"wmdp-bio/test/0000.parquet": rows["wmdp-bio"],  # the hub's Parquet export layout
                            "mmlu/all/test-00000-of-00001.parquet": rows["mmlu"][:5],
                            "mmlu/all/dev-00000-of-00001.parquet": rows["mmlu"][5:],
                            "mmlu/anatomy/test-00000-of-00001.parquet": rows["mmlu"][5:]})
    tables = task_for("llm-wmdp").tables(config("llm-wmdp", **{"llm.data-dir": str(tmp_path),
                                                                "llm.forget-domains": "bio"}))
    assert tables["mmlu"] == rows["mmlu"][:5] and tables["wmdp-bio"] == rows["wmdp-bio"]


def test_muse_synthetic_files_read_back_through_the_real_loader(tmp_path):
    cfg = config("llm-muse", **{"llm.num-authors": 6, "llm.qa-per-author": 4, "llm.synthetic-size": 5})
    write_tables(tmp_path, {FILES[name] + HUB_SHARD: rows for name, rows in muse_tables(6, 4, 5, cfg["seed"]).items()})
    assert (tmp_path / "raw" / "forget-00000-of-00001.parquet").is_file()  # as `hf download muse-bench/MUSE-Books`
    assert (tmp_path / "knowmem" / "retain_qa-00000-of-00001.parquet").is_file()
    write_tables(tmp_path, {"knowmem/retain_qa_icl-00000-of-00001.parquet": [{"question": "q", "answer": "a"}]})
    files_cfg = config("llm-muse", **{"llm.data-dir": str(tmp_path)})
    assert task_for("llm-muse").tables(files_cfg) == task_for("llm-muse").tables(cfg)


def test_a_book_is_cut_into_passages_of_at_most_4096_characters():
    book = " ".join(f"Word{i} said it." for i in range(3000))
    pieces = passages(book)
    assert len(pieces) > 1 and all(len(p) <= 4096 for p in pieces)
    assert " ".join(pieces) == book and passages("A short text.") == ["A short text."]
    cfg = config("llm-muse", **{"llm.num-authors": 6, "llm.qa-per-author": 4, "llm.synthetic-size": 5})
    tables = {**task_for("llm-muse").tables(cfg), "raw/forget": [{"text": book}]}
    views = task_for("llm-muse").views(cfg, tables, 3)
    assert sum(len(v.forget) for v in views) == len(pieces)


def test_a_missing_table_is_one_line_naming_it_and_how_to_fetch_it(tmp_path):
    write_tables(tmp_path, {"wmdp-bio/test-00000-of-00001.parquet": wmdp_tables(["bio"], 3, 0)["wmdp-bio"]})
    cfg = config("llm-wmdp", **{"llm.data-dir": str(tmp_path), "llm.forget-domains": "bio"})
    with pytest.raises(ConfigError, match="llm.data-dir.*'mmlu/all/test' not found.*hf download cais/mmlu") as err:
        task_for("llm-wmdp").check_setup(cfg, 2)
    assert "\n" not in str(err.value) and f"--local-dir {tmp_path}/mmlu" in str(err.value)


def test_synthetic_benchmark_text_has_no_unknown_words():
    tokenizer = synthetic_tokenizer()
    values = [v for rows in (*wmdp_tables(["bio", "cyber", "chem"], 20, 3).values(),
                             *muse_tables(6, 6, 20, 3).values()) for row in rows for v in row.values()]
    texts = [text for v in values for text in (v if isinstance(v, list) else [v]) if isinstance(text, str)]
    unknown = tokenizer.unk_token_id
    assert all(unknown not in tokenizer(text)["input_ids"] for text in texts)


def test_wmdp_deals_domains_round_robin_in_disjoint_shards_and_one_retain_client():
    cfg = config("llm-wmdp", **{"llm.synthetic-size": 9, "llm.retain-size": 4})
    task = task_for("llm-wmdp")
    tables = task.tables(cfg)
    views = task.views(cfg, tables, 5)
    assert [v.domain for v in views] == ["bio", "cyber", "bio", "cyber", ""]
    for domain, owners in (("bio", (0, 2)), ("cyber", (1, 3))):
        held = [q["question"] for j in owners for q in views[j].forget]
        assert sorted(held) == sorted(q["question"] for q in tables[f"wmdp-{domain}"])  # disjoint, complete
        assert all(not views[j].retain for j in owners)
    assert len(views[4].retain) == 4 and not views[4].forget
    ids = [i for v in views for i in v.removed_ids]
    assert sorted(ids) == list(range(18)) and not views[4].removed_ids  # each forget question once, by position
    assert all(r["answer"] == r["choices"][r["answer_index"]] for r in views[0].forget)


def test_wmdp_needs_a_client_per_domain_and_the_retain_client():
    cfg = config("llm-wmdp")
    with pytest.raises(ConfigError, match="at least 3 clients"):
        task_for("llm-wmdp").check_setup(cfg, 2)


@pytest.mark.parametrize("key, value", [("forget-client", 1), ("llm.forget-fraction", 0.5)])
def test_benchmark_tasks_refuse_the_request_settings_they_fix(key, value):
    with pytest.raises(ConfigError, match=key):
        config("llm-wmdp", **{key: value})


@pytest.mark.parametrize("task, key, value", [("llm-tofu", "llm.forget-domains", "bio"),
                                               ("llm-muse", "llm.retain-size", 5),
                                               ("llm-tofu-forget01", "llm.forget-domains", "bio")])
def test_a_task_refuses_the_benchmark_settings_it_does_not_read(task, key, value):
    with pytest.raises(ConfigError, match=f"'{key}'.*not read by task '{task}'"):
        config(task, **{key: value})


def test_wmdp_pools_accuracy_per_domain_and_utility():
    cfg = config("llm-wmdp")
    per_client = [{"forget-mc-n.bio": 4, "forget-mc-hits.bio": 1, "utility-mc-n": 2, "utility-mc-hits": 2},
                  {"forget-mc-n.cyber": 2, "forget-mc-hits.cyber": 2, "utility-mc-n": 2, "utility-mc-hits": 0},
                  {"retain-mc-n": 5, "retain-mc-hits": 5, "utility-mc-n": 1, "utility-mc-hits": 1}]
    entry = task_for("llm-wmdp").pool_metrics(cfg, per_client)
    assert entry["forget_mc_acc_bio"] == 0.25 and entry["forget_mc_acc_cyber"] == 1.0
    assert entry["forget_acc"] == pytest.approx(3 / 6) and entry["utility"] == pytest.approx(3 / 5)
    assert entry["retain_acc"] == 1.0 and math.isnan(entry["test_acc"])


def test_a_declared_domain_reaches_firms_upload_and_an_undeclared_one_is_the_client():
    fed = SimpleNamespace(client_id=lambda node: {7: 0, 8: 1}[node], domain=lambda node: {7: "bio", 8: ""}[node])

    def reply(node):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=node),
                               content=SimpleNamespace(array_records={}, metric_records={}))

    assert _upload(fed, reply(7), "forget")["domain"] == "bio"
    assert _upload(fed, reply(8), "forget")["domain"] == "1"


@pytest.mark.parametrize("task, domains", [("llm-wmdp", ["bio", "cyber", "bio", ""]), ("llm-tofu", ["", "", "", ""])])
def test_hello_tells_the_server_each_clients_declared_domain(task, domains):
    from flwr.app import ConfigRecord

    from server_app.inprocess import InProcessGrid
    from strategies.common.federation import Federation

    run = {"task": task, "method": "firm", "llm.num-authors": 8, "llm.qa-per-author": 2}
    fed = Federation(InProcessGrid(4, run), round_timeout=60, min_reply_fraction=1.0)
    fed.hello(ConfigRecord({}))
    assert [fed.domain(node) for node in fed.all_nodes()] == domains


def _run(task: str, method: str, tmp_path) -> dict:
    from server_app.inprocess import run_inprocess

    folder = run_inprocess({"task": task, "method": method, "smoke": True, "cache-dir": str(tmp_path / "cache"),
                            "outputs-dir": str(tmp_path / "out")}, 4)
    with open(os.path.join(folder, "results.json")) as handle:
        return json.load(handle)


@pytest.mark.slow
@pytest.mark.parametrize("method", ["firm", "ga"])
def test_wmdp_runs_and_reports_each_domain_and_utility(method, tmp_path):
    results = _run("llm-wmdp", method, tmp_path)
    for name in ("original", "unlearned", "continued"):
        entry = results["models"][name]
        assert 0 <= entry["forget_mc_acc_bio"] <= 1 and 0 <= entry["forget_mc_acc_cyber"] <= 1
        assert 0 <= entry["utility"] <= 1
    if method == "firm":
        assert results["method"]["domains"] == {"0": "bio", "1": "cyber", "2": "bio"}


@pytest.mark.slow
def test_muse_runs_and_reports_knowmem_verbmem_privleak_and_utility(tmp_path):
    entry = _run("llm-muse", "firm", tmp_path)["models"]["unlearned"]
    assert {"knowmem_forget_rouge", "knowmem_retain_rouge", "verbmem_rouge", "privleak", "utility"} <= set(entry)
    assert 0 <= entry["knowmem_forget_rouge"] <= 1 and 0 <= entry["mia_min_k"] <= 1


def test_tofu_forget01_synthetic_files_read_back_through_the_tofu_loader(tmp_path):
    cfg = config("llm-tofu-forget01", **{"llm.num-authors": 10, "llm.qa-per-author": 4, "llm.synthetic-size": 5})
    task = task_for("llm-tofu-forget01")
    synthetic_tables = task.tables(cfg)
    write_tables(tmp_path, {"forget01.json": synthetic_tables["forget01"], "retain90.json": synthetic_tables["retain90"],
                            "holdout01.json": synthetic_tables["holdout"],  # TOFU's files: JSON lines at the top
                            "mmlu/all/test-00000-of-00001.parquet": synthetic_tables["mmlu"]})
    from_files = task.tables(config("llm-tofu-forget01", **{"llm.data-dir": str(tmp_path)}))
    assert from_files == synthetic_tables


def test_tofu_forget01_shards_forget01_and_draws_the_retain_client_from_retain90():
    cfg = config("llm-tofu-forget01", **{"llm.num-authors": 20, "llm.qa-per-author": 10, "llm.retain-size": 30})
    assert cfg["llm.retain-size"] == 30 and config("llm-tofu-forget01")["llm.retain-size"] == 200  # the paper's 200
    task = task_for("llm-tofu-forget01")
    tables = task.tables(cfg)
    views = task.views(cfg, tables, 6)
    assert len({r["author"] for r in tables["forget01"]}) == 1 and len({r["author"] for r in tables["retain90"]}) == 18
    held = sorted(r["question"] for v in views[:5] for r in v.forget)
    assert held == sorted(r["question"] for r in tables["forget01"]) and {len(v.forget) for v in views[:5]} == {2}
    assert all(v.domain == "forget01" and not v.retain for v in views[:5])
    assert len([r for r in views[5].retain if "author" in r]) == 30 and not views[5].forget


@pytest.mark.slow
def test_tofu_forget01_runs_and_reports_tofu_rouge_and_utility(tmp_path):
    entry = _run("llm-tofu-forget01", "firm", tmp_path)["models"]["unlearned"]
    assert 0 <= entry["forget_rouge"] <= 1 and 0 <= entry["retain_rouge"] <= 1 and 0 <= entry["utility"] <= 1
