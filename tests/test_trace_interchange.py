"""Trace interchange: `profiler export` to Dynamo's agentic Mooncake and AIPerf's agentic (Weka)
traces, `profiler import` back. Export then import gives the same calls, tokens, gaps and parents
on every bundled set; each importer reads the public shapes (fixtures: tests/fixtures/importers)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from store.exporters import export_records, group_workflows, load_records
from store.exporters.aiperf_agentic import Unexpressible, layout
from store.exporters._graph import BlockIds
from store.importers import FORMATS, iter_records
from store.importers.detect import detect_format

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "importers"
SETS = ["datasets/generated/coding_assistant_sample.jsonl.gz", "datasets/generated/deep_research_sample.jsonl.gz",
        "datasets/real/agentless_pr28.jsonl", "datasets/real/mini_swe_agent_gemini3.jsonl",
        "datasets/real/seq_whowhen_magentic_captain.jsonl", "datasets/swe_agent/swe_agent_glm45_bs4.jsonl"]
runner = CliRunner()


def shape(records: list[dict]) -> dict[str, list[tuple]]:
    """Per workflow, in store order: (input, output, gap after the parents, parent positions)."""
    out = {}
    for wf in group_workflows(records):
        pos = {c["request_id"]: k for k, c in enumerate(wf.calls)}
        out[wf.workflow_id] = [(c["input_tokens"], c["output_tokens"], wf.gap_s(c),
                                sorted(pos[p] for p in wf.parents[c["request_id"]])) for c in wf.calls]
    return out


def assert_same(a: dict, b: dict, tol: float) -> None:
    assert a.keys() == b.keys()
    for wid in a:
        assert len(a[wid]) == len(b[wid]), wid
        for x, y in zip(a[wid], b[wid]):
            assert (x[0], x[1], x[3]) == (y[0], y[1], y[3]), (wid, x, y)
            assert (x[2] is None) == (y[2] is None), (wid, x, y)
            if x[2] is not None:
                assert y[2] == pytest.approx(x[2], abs=tol), (wid, x, y)


@pytest.fixture(scope="module", params=SETS, ids=lambda s: Path(s).name.split(".")[0])
def bundled(request):
    records, quarantined = load_records([ROOT / request.param])
    assert records and quarantined == 0
    return records


@pytest.mark.parametrize("fmt,name,tol", [("dynamo-agentic", "t.jsonl", 1e-6), ("aiperf-agentic", "t.jsonl", 2e-6),
                                          ("aiperf-agentic", "traces", 2e-6)])
def test_export_then_import_gives_the_same_calls_tokens_gaps_and_parents(bundled, tmp_path, fmt, name, tol):
    out = tmp_path / name
    report = export_records(fmt, bundled, out)
    assert report.skipped == [] and report.calls == len(bundled)
    files = sorted(out.glob("*.json")) if out.is_dir() else [out]
    assert {detect_format(f) for f in files} == {fmt}
    back = [r for f in files for r in iter_records("auto", f)]
    assert len(back) == len(bundled)
    assert_same(shape(bundled), shape(back), tol)
    if fmt == "dynamo-agentic":     # ids, agents, types and absolute times come back too
        orig = {r["request_id"]: r for r in bundled}
        for r in back:
            o = orig[r["request_id"]]
            assert (r["agent_id"], r["workflow_type_id"], r["workflow_id"]) == (
                o["agent_id"], o["workflow_type_id"], o["workflow_id"])
            assert r["t_arrival"] == pytest.approx(o["t_arrival"], abs=1e-6)
            assert r["t_finish"] == pytest.approx(o["t_finish"], abs=1e-6)
            assert r.get("wait_after") == o.get("wait_after")
            assert [t["name"] for t in r.get("tool_calls") or []] == [t["name"] for t in o.get("tool_calls") or []]


def test_aiperf_keeps_sub_agent_roles_and_human_turns(tmp_path):
    recs = [
        {"request_id": "w#1", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "planner",
         "t_arrival": 0.0, "t_finish": 1.0, "input_tokens": 100, "output_tokens": 10},
        {"request_id": "w#2", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "researcher",
         "t_arrival": 1.5, "t_finish": 3.0, "input_tokens": 80, "output_tokens": 20, "parent_request_ids": ["w#1"]},
        {"request_id": "w#3", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "researcher",
         "t_arrival": 1.5, "t_finish": 4.0, "input_tokens": 90, "output_tokens": 20, "parent_request_ids": ["w#1"]},
        {"request_id": "w#4", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "planner", "wait_after": "human",
         "t_arrival": 4.5, "t_finish": 5.0, "input_tokens": 300, "output_tokens": 30,
         "parent_request_ids": ["w#2", "w#3"]},
        {"request_id": "w#5", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "planner",
         "t_arrival": 65.0, "t_finish": 66.0, "input_tokens": 400, "output_tokens": 5},
    ]
    out = tmp_path / "w.jsonl"
    export_records("aiperf-agentic", recs, out)
    trace = json.loads(out.read_text())
    assert set(trace) == {"id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests"}
    kinds = [i["type"] for i in trace["requests"]]
    assert kinds == ["n", "subagent", "subagent", "n", "n"]
    assert {i["subagent_type"] for i in trace["requests"] if i["type"] == "subagent"} == {"researcher"}
    back = {r["request_id"]: r for r in iter_records("aiperf-agentic", out)}
    assert back["w#4"]["parent_request_ids"] == ["w#2", "w#3"]       # the join of the two sub-agents
    assert back["w#4"]["wait_after"] == "human" and "wait_after" not in back["w#5"]
    assert [back[f"w#{k}"]["agent_id"] for k in range(1, 6)] == ["main", "researcher", "researcher", "main", "main"]
    # hash ids: one per 64 tokens; the planner's later prompts extend its conversation
    h = {i + 1: r["hash_ids"] for i, r in enumerate(back[f"w#{k}"] for k in range(1, 6))}
    assert len(h[1]) == 2 and len(h[4]) == 5 and h[4][:1] == h[1][:1] and h[5][:4] == h[4][:4]


def test_a_workflow_the_nesting_cannot_express_is_left_out_with_its_reason(tmp_path):
    recs = [  # w#3 joins w#1 and w#2, though w#2 already follows w#1: a join that skips a stage
        {"request_id": "w#1", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "a", "t_arrival": 0.0,
         "t_finish": 1.0, "input_tokens": 10, "output_tokens": 1},
        {"request_id": "w#2", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "a", "t_arrival": 2.0,
         "t_finish": 3.0, "input_tokens": 10, "output_tokens": 1},
        {"request_id": "w#3", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "b", "t_arrival": 4.0,
         "t_finish": 5.0, "input_tokens": 10, "output_tokens": 1, "parent_request_ids": ["w#1", "w#2"]},
    ]
    with pytest.raises(Unexpressible, match="w#3"):
        layout(group_workflows(recs)[0])
    report = export_records("aiperf-agentic", recs, tmp_path / "x.jsonl")
    assert report.workflows == 0 and report.skipped and "w#3" in report.skipped[0]
    # Dynamo's dependencies carry any graph
    report = export_records("dynamo-agentic", recs, tmp_path / "d.jsonl")
    back = {r["request_id"]: r for r in iter_records("auto", tmp_path / "d.jsonl")}
    assert back["w#3"]["parent_request_ids"] == ["w#1", "w#2"] and report.calls == 3


def test_block_ids_share_the_conversation_prefix_only():
    wf = group_workflows([
        {"request_id": "1", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "a", "t_arrival": 0.0,
         "t_finish": 1.0, "input_tokens": 130, "output_tokens": 70},
        {"request_id": "2", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "a", "t_arrival": 2.0,
         "t_finish": 3.0, "input_tokens": 260, "output_tokens": 5},
        {"request_id": "3", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "b", "t_arrival": 4.0,
         "t_finish": 5.0, "input_tokens": 260, "output_tokens": 5},
        {"request_id": "4", "workflow_type_id": "t", "workflow_id": "w", "agent_id": "a", "t_arrival": 6.0,
         "t_finish": 7.0, "input_tokens": 100, "output_tokens": 5},     # shorter: compacted, nothing shared
    ])[0]
    ids = BlockIds(64).workflow(wf)
    assert len(ids["1"]) == 3 and len(ids["2"]) == 5
    assert ids["2"][:2] == ids["1"][:2] and ids["2"][2] != ids["1"][2]   # 2 full blocks of call 1's prompt
    assert not set(ids["3"]) & set(ids["1"] + ids["2"])                   # another agent: its own prompt
    assert not set(ids["4"]) & set(ids["2"])


def test_dynamo_v2_fixture_fork_join_and_finish_times():
    recs = {r["request_id"]: r for r in iter_records("auto", FIX / "dynamo_agentic" / "v2_fork_join.jsonl")}
    assert recs["root-join"]["parent_request_ids"] == ["left-next", "right-next"]
    assert recs["left"]["parent_request_ids"] == ["root"] and recs["root"]["parent_request_ids"] == []
    assert {r["workflow_id"] for r in recs.values()} == {"play-a"}
    assert recs["left"]["agent_id"] == "left" and recs["root"]["agent_id"] == "main"
    assert recs["root"]["t_arrival"] == pytest.approx(1.0) and recs["root"]["t_finish"] == pytest.approx(1.4)
    # no recorded duration: the finish its child's dependency delay counts from
    assert recs["right"]["t_finish"] == pytest.approx(1.8 - 0.06)
    assert recs["right-next"]["hash_ids"] == [1, 2, 5] and recs["right-next"]["block_size"] == 64


def test_dynamo_v1_and_plain_mooncake_fixtures():
    v1 = {r["request_id"]: r for r in iter_records("auto", FIX / "dynamo_agentic" / "v1_wait_for.jsonl")}
    assert {r["workflow_id"] for r in v1.values()} == {"run-7"}
    assert v1["r3"]["agent_id"] == "researcher" and v1["r3"]["parent_request_ids"] == ["r1"]
    assert v1["r1"]["t_finish"] == pytest.approx(1.0)          # 2.5 s − 0.3 s delay − 1.2 s tool
    assert v1["r1"]["tool_calls"] == [{"name": "tool", "t_start": 1.0, "t_end": pytest.approx(2.2), "status": "ok"}]
    assert v1["r2"]["timing"] == "created_only"                # nothing says when it finished
    plain = list(iter_records("auto", FIX / "dynamo_agentic" / "mooncake_plain.jsonl"))
    assert [r["input_tokens"] for r in plain] == [6955, 6472, 1200]
    assert plain[0]["t_arrival"] == pytest.approx(27.482) and len({r["workflow_id"] for r in plain}) == 3


def test_aiperf_fixture_nested_sub_agents_parallel_group_and_human_turn():
    recs = list(iter_records("auto", FIX / "aiperf_agentic" / "cc-session-0001.json"))
    assert [r["agent_id"] for r in recs] == ["main", "main", "Explore", "Explore", "Explore", "main", "main"]
    by = {r["request_id"].split("#")[1]: r for r in recs}
    assert by["3"]["parent_request_ids"] == by["5"]["parent_request_ids"] == ["cc-session-0001#2"]
    assert by["6"]["parent_request_ids"] == ["cc-session-0001#4", "cc-session-0001#5"]
    assert by["6"]["wait_after"] == "human" and "wait_after" not in by["4"]    # sub-agent end_turn: a return
    assert by["1"]["t_first_token"] == pytest.approx(0.9) and by["1"]["t_finish"] == pytest.approx(3.1)


def test_formats_are_registered_with_aliases():
    assert FORMATS["dynamo-agentic"].NAME == "dynamo-agentic" and FORMATS["aiperf-agentic"].NAME == "aiperf-agentic"
    from store.importers import get_format
    assert get_format("agentic_mooncake").NAME == "dynamo-agentic" and get_format("weka").NAME == "aiperf-agentic"


def test_cli_export_import_and_clear_errors(tmp_path):
    out = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["export", str(ROOT / "datasets/real/agentless_pr28.jsonl"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "wrote 227 calls of 85 workflows as dynamo-agentic" in res.output
    res = runner.invoke(app, ["export", "--workload", "deep-research", "--workflows", "3", "-f", "aiperf-agentic",
                              "--out", str(tmp_path / "traces"), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["workflows"] == 3 and len(list((tmp_path / "traces").glob("*.json"))) == 3
    res = runner.invoke(app, ["import", str(out), str(tmp_path / "traces"), "--out", str(tmp_path / "logs")])
    assert res.exit_code == 0, res.output
    assert "[dynamo-agentic]: 227 calls" in res.output and "[aiperf-agentic]" in res.output
    res = runner.invoke(app, ["export", "--format", "trtllm", str(out)])
    assert res.exit_code != 0 and "use one of dynamo-agentic, aiperf-agentic" in res.output
    res = runner.invoke(app, ["export"])
    assert res.exit_code != 0 and "give LOGS or --workload" in res.output


def test_aiperf_nested_times_from_the_marker_and_top_level_agents_from_hash_chains(tmp_path):
    def req(t, ids, stop=""):
        return {"t": t, "type": "n", "model": "m", "in": 64 * len(ids), "out": 5, "hash_ids": ids,
                "stop": stop, "api_time": 1.0, "think_time": 0.0}
    trace = {"id": "raw", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "requests": [
        req(0.0, [1, 2]),
        {"t": 10.0, "type": "subagent", "agent_id": "agent_001", "subagent_type": "Explore", "status": "completed",
         "requests": [req(0.5, [7, 8])]},                       # kv-cache-tester: t from the marker
        req(20.0, [1, 2, 3]),                                   # the main chain again
        req(30.0, [40, 41]),                                    # another top-level agent's chain
    ]}
    path = tmp_path / "raw.json"
    path.write_text(json.dumps(trace))
    recs = list(iter_records("auto", path))
    assert [r["t_arrival"] for r in recs] == [0.0, 10.5, 20.0, 30.0]
    assert [r["agent_id"] for r in recs] == ["main", "Explore", "main", "agent_1"]
    assert recs[2]["parent_request_ids"] == ["raw#2"] and recs[1]["parent_request_ids"] == ["raw#1"]


def test_two_fan_outs_in_a_row_cannot_be_written_for_aiperf():
    def rec(n, parents, agent="a"):
        return {"request_id": f"w#{n}", "workflow_type_id": "t", "workflow_id": "w", "agent_id": agent,
                "t_arrival": float(n), "t_finish": n + 0.5, "input_tokens": 10, "output_tokens": 1,
                "parent_request_ids": parents}
    recs = [rec(1, []), rec(2, ["w#1"], "b"), rec(3, ["w#1"], "b"),
            rec(4, ["w#2", "w#3"], "c"), rec(5, ["w#2", "w#3"], "c")]   # the join is itself a fan-out
    with pytest.raises(Unexpressible, match="no call of its own before it"):
        layout(group_workflows(recs)[0])


def test_dynamo_play_has_one_root_and_a_second_root_reads_back_without_parents(tmp_path):
    recs = [{"request_id": f"w#{n}", "workflow_type_id": "t", "workflow_id": "w", "agent_id": a,
             "t_arrival": t, "t_finish": t + 1.0, "input_tokens": 10, "output_tokens": 1, "parent_request_ids": []}
            for n, a, t in ((1, "a", 0.0), (2, "b", 2.5))]
    export_records("dynamo-agentic", recs, tmp_path / "d.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()[1:]]
    assert "dependencies" not in rows[0]
    assert rows[1]["dependencies"] == [{"request_id": "w#1", "trigger": "dispatch", "delay_ms": 2500.0,
                                        "relation": "spawn"}]
    back = {r["request_id"]: r for r in iter_records("auto", tmp_path / "d.jsonl")}
    assert back["w#2"]["parent_request_ids"] == [] and back["w#2"]["dispatch_after"] == ["w#1"]
    assert back["w#2"]["t_arrival"] == pytest.approx(2.5)


def test_reads_kv_cache_testers_public_traces():
    """Two unchanged traces of callanjfox/kv-cache-tester (Apache-2.0; README beside them):
    trace_0291 has two Explore sub-agents whose request times count from their markers."""
    recs = list(iter_records("auto", FIX / "aiperf_agentic" / "kv_cache_tester" / "trace_0291.json.gz"))
    assert len(recs) == 22 - 2 + 5 + 7
    sub = [r for r in recs if r["agent_id"] == "Explore"]
    assert len(sub) == 12 and {r["subagent_id"] for r in sub} == {"agent_001", "agent_002"}
    first_001 = next(r for r in sub if r["subagent_id"] == "agent_001")
    assert first_001["t_arrival"] == pytest.approx(1148.013)      # marker t + the nested 0.0
    spawner = next(r for r in recs if r["t_arrival"] == 1085.0)
    joiner = next(r for r in recs if r["t_arrival"] == 1209.0)
    assert first_001["parent_request_ids"] == [spawner["request_id"]]
    ends = [max((r for r in sub if r["subagent_id"] == a), key=lambda r: r["t_arrival"])["request_id"]
            for a in ("agent_001", "agent_002")]
    assert joiner["parent_request_ids"] == ends                      # the parent waits for both
    human = [r for r in recs if r.get("wait_after") == "human"]      # end_turn, then the user's text
    assert [r["t_arrival"] for r in human] == [19.0, 197.0, 896.0]
    assert all(r["agent_id"] == "main" for r in recs if r not in sub)
    small = list(iter_records("auto", FIX / "aiperf_agentic" / "kv_cache_tester" / "trace_0504.json"))
    assert small and small[0]["model"] == "claude-sonnet-4-20250514" and small[0]["input_tokens"] == 11133


def test_bad_rows_are_named_and_skipped_and_valid_ones_kept(tmp_path):
    from store.importers import convert

    bad = tmp_path / "bad.jsonl"
    header = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64, "hash_id_scope": "local",
              "source": {"format": "x", "digest": "y"}}
    rows = [header,
            {"request_id": "a", "play_id": "p", "session_id": "s", "model": "m", "input_length": 10,
             "output_length": 2, "hash_ids": [1], "not_before_ms": 0.0, "recorded_api_time_ms": 5.0},
            {"request_id": "b", "play_id": "p", "session_id": "s", "model": "m", "output_length": 2,
             "hash_ids": [1], "not_before_ms": 10.0}]
    bad.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n")
    weka = tmp_path / "w.json"
    weka.write_text(json.dumps({"id": "w", "models": ["m"], "block_size": 64, "hash_id_scope": "local",
                                "requests": [{"t": 0.0, "type": "n", "in": 5, "out": 1, "hash_ids": [1]},
                                             {"t": 1.0, "type": "n", "out": 1, "hash_ids": [1]}]}))
    report = convert("auto", [bad, weka], tmp_path / "out")
    by_src = {Path(f.source).name: f for f in report.per_file}
    assert by_src["bad.jsonl"].calls == 1 and by_src["w.json"].calls == 1
    reasons = {str(e) for e in report.errors}
    assert any("bad.jsonl:3" in r and "input_length" in r for r in reasons)
    assert any("bad.jsonl:4" in r and "not valid JSON" in r for r in reasons)
    assert any("w.json" in r and "requests[1].in" in r for r in reasons)
    v3 = tmp_path / "v3.jsonl"
    v3.write_text(json.dumps({**header, "version": 3}) + "\n")
    assert "version 3" in convert("auto", [v3], tmp_path / "o3").per_file[0].reason


def test_one_workflow_id_in_two_types_gets_two_plays_and_comes_back(tmp_path):
    recs = [{"request_id": f"{t}#1", "workflow_type_id": t, "workflow_id": "same", "agent_id": "a",
             "t_arrival": 0.0, "t_finish": 1.0, "input_tokens": 10, "output_tokens": 1} for t in ("x", "y")]
    export_records("dynamo-agentic", recs, tmp_path / "d.jsonl")
    rows = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()[1:]]
    assert sorted(r["play_id"] for r in rows) == ["x:same", "y:same"]
    back = list(iter_records("auto", tmp_path / "d.jsonl"))
    assert {(r["workflow_type_id"], r["workflow_id"]) for r in back} == {("x", "same"), ("y", "same")}
