"""The LLM task on SuperNodes that read their own TOFU-format files (node config ``data-path``).

Small real-format files in tmp folders (``tasks.llm.node_data`` documents the layout): the loader,
the request on the node, every malformed case as one line naming ``data-path``, the content id the
model cache key holds, the error route to the server, and one in-process run of ``llm-tofu``.
"""

import json
import os

import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict

from client_app.app import app
from server_app.experiment import Experiment
from server_app.inprocess import InProcessGrid
from strategies.common.federation import Federation, RoundFailed
from strategies.run_config import parse_config
from tasks.llm import synthetic
from tasks.llm.node_data import build_node_client_data, load_node_records

KEEP = ("question", "answer", "paraphrased_answer", "perturbed_answer")
PUBLIC = ("question", "answer", "perturbed_answer")


def write_tofu_node(folder, *, authors=3, qa=20, seed=3, author_column=False, perturbed="split", public=False):
    """A node folder in TOFU's layout from synthetic words: ``full.json`` (question, answer[, author]),
    perturbed answers in ``retain_perturbed.json`` (every other record) or inline in ``full``."""
    records = synthetic.fictitious_authors(authors, qa, seed=seed)
    columns = (("question", "answer") + (("author",) if author_column else ())
               + (KEEP[2:] if perturbed == "inline" else ()))
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "full.json").write_text(json.dumps([{k: r[k] for k in columns} for r in records]))
    if perturbed == "split":
        (folder / "retain_perturbed.json").write_text(json.dumps([{k: r[k] for k in KEEP} for r in records[::2]]))
    if public:
        sets = {"real_authors_perturbed": synthetic.real_authors(seed=1)[:4],
                "world_facts_perturbed": synthetic.world_facts(seed=1)[:4],
                "holdout10": synthetic.holdout_authors(1, 4, exclude=[], seed=seed)}
        for split, rows in sets.items():
            (folder / f"{split}.jsonl").write_text("".join(json.dumps({k: r[k] for k in PUBLIC}) + "\n" for r in rows))
    return records


def cfg_of(**overrides):
    return parse_config({"task": "llm-tofu", "method": "none", "scenario": "sample", "forget-client": 0,
                         "llm.forget-fraction": 0.34, **overrides})


def test_tofu_layout_without_author_column_groups_20_rows_per_author(tmp_path):
    records = write_tofu_node(tmp_path / "node")
    loaded = load_node_records(str(tmp_path / "node"))
    assert [r["question"] for r in loaded] == [r["question"] for r in records]
    assert loaded[19]["author"] == "tofu-author-0" and loaded[20]["author"] == "tofu-author-1"
    assert sum(bool(r["perturbed_answer"]) for r in loaded) == 30  # joined by question from retain_perturbed
    assert loaded[0]["paraphrased_answer"] == records[0]["paraphrased_answer"] and not loaded[1]["perturbed_answer"]


def test_the_request_is_applied_on_the_node_by_the_runs_scenario(tmp_path):
    records = write_tofu_node(tmp_path / "node", authors=4, qa=3, author_column=True, perturbed="inline", public=True)
    path = str(tmp_path / "node")
    leaving = build_node_client_data(cfg_of(**{"llm.forget-fraction": 0.25}), path, 0)
    last = records[-1]["author"]
    assert leaving.forget_authors == [last] and len(leaving.forget) == 3 and len(leaving.retain) == 9
    assert leaving.protocol == "tofu" and len(leaving.evaluable("retain")) == 9
    assert sorted(leaving.public) == ["holdout", "real-authors", "world-facts"]
    assert len(leaving.public["holdout"]) == 4 and len(leaving.public["world-facts"]) == 4  # the node scores all
    staying = build_node_client_data(cfg_of(), path, 1)
    assert staying.forget == [] and len(staying.retain) == 12 and staying.client_id == 1
    whole = build_node_client_data(cfg_of(scenario="client"), path, 0)
    assert whole.retain == [] and len(whole.forget) == 12 and len(whole.forget_authors) == 4


def test_json_lines_and_no_public_sets_fall_back_to_none(tmp_path):
    records = synthetic.fictitious_authors(2, 20, seed=5)
    folder = tmp_path / "node"
    folder.mkdir()
    (folder / "full.jsonl").write_text("".join(json.dumps({k: r[k] for k in KEEP}) + "\n" for r in records))
    data = build_node_client_data(cfg_of(), str(folder), 0)
    assert data.public == {} and len(data.evaluable("forget")) == 20 and data.forget_authors == ["tofu-author-1"]


def _hello(folder, tmp_path, run=None, pid=0):
    context = Context(run_id=1, node_id=7, state=RecordDict(), run_config=run or {
        "task": "llm-tofu", "method": "none", "scenario": "sample", "forget-client": 0},
        node_config={"data-path": str(folder), "partition-id": pid, "view-cache-dir": str(tmp_path / "views")})
    InProcessGrid(1, {})  # sets Flower's task identity, as a SuperNode has one
    message = Message(RecordDict({"config": ConfigRecord({})}), dst_node_id=7, message_type="query.hello")
    return app(message, context)


def _damage(folder, damage):
    full = json.loads((folder / "full.json").read_text())
    if damage == "missing-full":
        (folder / "full.json").unlink()
    elif damage == "not-json":
        (folder / "full.json").write_text('[{"question": "q", "answer": "a"},\n{"question": oops}]')
    elif damage == "no-answer":
        (folder / "full.json").write_text(json.dumps([{"question": r["question"]} for r in full]))
    elif damage == "empty":
        (folder / "full.json").write_text("[]")
    elif damage == "number-answer":
        (folder / "full.json").write_text(json.dumps([{**r, "answer": 7} for r in full]))
    elif damage == "perturbed-string":
        (folder / "full.json").write_text(json.dumps([{**r, "paraphrased_answer": "p", "perturbed_answer": "x"}
                                                      for r in full]))
    elif damage == "no-paraphrase":
        (folder / "full.json").write_text(json.dumps([{**r, "perturbed_answer": ["x"]} for r in full]))
    elif damage == "bad-perturbed-split":
        (folder / "retain_perturbed.json").write_text(json.dumps([{"question": "q", "answer": "a"}]))
    elif damage == "bad-public":
        (folder / "world_facts_perturbed.jsonl").write_text('{"question": "q"\n')


@pytest.mark.parametrize("damage, match", [
    ("no-folder", r"is not a folder: expected a folder holding full\.json, full\.jsonl"),
    ("missing-full", r"no full split found: expected full\.json, full\.jsonl, full\.parquet or full/\*\.parquet"),
    ("not-json", r"full\.json: not valid JSON at line 2"),
    ("no-answer", r"full\.json: missing column 'answer'"),
    ("empty", r"full\.json: holds no records"),
    ("number-answer", r"full row 0: 'answer' must be a non-empty string, got 7"),
    ("perturbed-string", r"full row 0: 'perturbed_answer' must be a list of strings"),
    ("no-paraphrase", r"full row 0: has 'perturbed_answer' but no 'paraphrased_answer'"),
    ("bad-perturbed-split", r"retain_perturbed\.json: missing column 'paraphrased_answer'"),
    ("bad-public", r"world_facts_perturbed\.jsonl: not valid JSON at line 1"),
])
def test_malformed_node_files_are_one_line_errors_naming_data_path(tmp_path, damage, match):
    folder = tmp_path / "node"
    if damage != "no-folder":
        write_tofu_node(folder, authors=2, qa=2, author_column=True)
        _damage(folder, damage)
    with pytest.raises(ValueError, match=r"^node config 'data-path'='.*node': " + match) as error:
        _hello(folder, tmp_path)
    assert "\n" not in str(error.value)


def test_data_path_needs_a_named_forget_client(tmp_path):
    write_tofu_node(tmp_path / "node", authors=2, qa=2, author_column=True)
    with pytest.raises(ValueError, match=r"'forget-client'=-1 .* set forget-client to the partition-id"):
        _hello(tmp_path / "node", tmp_path, run={"task": "llm-tofu", "method": "none", "scenario": "client"})


def test_hello_content_id_follows_the_files_so_the_model_cache_key_does(tmp_path):
    """The server's original/retrain key holds every node's ``data-id`` (``Experiment.cached_fedavg``)."""
    from server_app import cache

    for name in ("a", "b", "c"):
        write_tofu_node(tmp_path / name, authors=2, qa=2, author_column=True)
    rows = json.loads((tmp_path / "c" / "full.json").read_text())
    rows[0]["answer"] += " indeed"
    (tmp_path / "c" / "full.json").write_text(json.dumps(rows))
    first, same, other = (_hello(tmp_path / n, tmp_path).content["hello"] for n in ("a", "b", "c"))
    assert first["data-id"] == same["data-id"] > 0 and other["data-id"] != first["data-id"]
    assert first["n-forget"] == 2 and first["n-retain"] == 2
    cfg = cfg_of()
    keys = [cache.entry_id(cache.model_key("original", cfg, [{"client-id": 0, "data-id": h["data-id"]}], "pool"))
            for h in (first, same, other)]
    assert keys[0] == keys[1] != keys[2]


TINY = {"task": "llm-tofu", "method": "none", "scenario": "sample", "forget-client": 0, "llm.forget-fraction": 0.34,
        "pretrain-rounds": 1, "continue-rounds": 1, "llm.local-epochs": 1, "llm.lr": 5e-3, "llm.batch-size": 8,
        "llm.lora-rank": 4, "llm.max-new-tokens": 4}


def _node_grid(tmp_path, config, folders, **options):
    configs = {i: {"data-path": str(folder), "partition-id": i} for i, folder in enumerate(folders)}
    return InProcessGrid(len(folders), config, node_configs=configs, **options)


def test_a_node_with_bad_files_is_reported_by_node_and_phase_before_any_training(tmp_path):
    write_tofu_node(tmp_path / "n0", authors=3, qa=3, author_column=True, perturbed="inline")
    (tmp_path / "n1").mkdir()  # no full.json
    config = {**TINY, "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out")}
    grid = _node_grid(tmp_path, config, [tmp_path / "n0", tmp_path / "n1"], errors_as_replies=True)
    with pytest.raises(RoundFailed) as error:
        Experiment(Federation(grid, round_timeout=60, min_reply_fraction=0.5), config).run()
    text = str(error.value)
    assert text.startswith("phase 'setup' round 0: only 1 of 2 nodes replied, 2 needed (node 1001 failed: ")
    assert "node config 'data-path'=" in text and "n1': no full split found" in text and "\n" not in text
    assert grid.sent_types == ["query.hello", "query.hello"]  # nothing trained


def test_llm_tofu_runs_on_nodes_reading_their_own_files(tmp_path):
    records = synthetic.fictitious_authors(6, 3, seed=3)
    folders = [tmp_path / "n0", tmp_path / "n1"]
    for folder, part in zip(folders, (records[:9], records[9:])):
        folder.mkdir()
        (folder / "full.json").write_text(json.dumps([{k: r[k] for k in ("author", *KEEP)} for r in part]))
    write_public = {"real_authors_perturbed": synthetic.real_authors(seed=1)[:2],
                    "world_facts_perturbed": synthetic.world_facts(seed=1)[:2]}
    for split, rows in write_public.items():
        (folders[0] / f"{split}.json").write_text(json.dumps([{k: r[k] for k in PUBLIC} for r in rows]))
    (folders[1] / "holdout10.json").write_text(json.dumps(
        [{k: r[k] for k in PUBLIC} for r in synthetic.holdout_authors(1, 3, exclude=[], seed=3)]))
    config = {**TINY, "cache-dir": str(tmp_path / "cache"), "outputs-dir": str(tmp_path / "out")}
    experiment = Experiment(Federation(_node_grid(tmp_path, config, folders), round_timeout=60,
                                       min_reply_fraction=0.5), config)
    with open(os.path.join(experiment.run(), "results.json")) as handle:
        results = json.load(handle)
    assert results["run"]["forget_clients"] == [0]
    entry = results["models"]["original"]
    assert entry["llm_protocol"] == "tofu" and entry["llm_max_new_tokens"] == 4
    for key in ("forget_rouge", "retain_rouge", "forget_truth", "kr", "model_utility", "mia_min_k"):
        assert entry[key] is not None and 0.0 <= entry[key] <= 1.0, key
    assert os.path.exists(tmp_path / "cache" / f"original-{experiment.model_ids['original']}.pt")
