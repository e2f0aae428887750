"""Ingestion of every accepted format and record shape, and the derived columns."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from store import ingest, duckdb_store as store
from tests.conftest import write_jsonl


def flat(rid, wf="w1", agent="planner", t0=100.0, dur=2.0, inp=10, out=5, **kw):
    return {"request_id": rid, "workflow_type_id": "app", "workflow_id": wf, "agent_id": agent,
            "t_arrival": t0, "t_finish": t0 + dur, "input_tokens": inp, "output_tokens": out, **kw}


def test_store_is_a_real_duckdb_file_with_documented_tables(tmp_path):
    c = store.connect(tmp_path / "s.duckdb")
    c.close()
    c = store.connect(tmp_path / "s.duckdb", read_only=True)
    tables = {r[0] for r in c.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert {"calls", "tool_calls", "quarantine", "ingested_files"} <= tables
    comment = c.execute("SELECT comment FROM duckdb_columns() WHERE table_name='calls' "
                        "AND column_name='gap_after_s'").fetchone()[0]
    assert "tool" in comment


def test_flat_jsonl_derived_columns(con, tmp_path):
    recs = [
        flat("a", t0=100, dur=2, out=50, tool_calls=[{"name": "grep", "t_start": 102.1, "t_end": 102.6}]),
        flat("b", agent="engineer", t0=103, dur=4, out=300),
        flat("c", agent="engineer", t0=110, dur=1, out=200, extra_field={"x": 1}),
    ]
    write_jsonl(tmp_path / "logs" / "day1" / "a.jsonl", recs)
    rep = ingest.ingest(con, [tmp_path / "logs"])
    assert rep.loaded == 3 and rep.quarantined == 0
    df = con.execute("SELECT * FROM calls ORDER BY call_index").df()
    assert list(df.request_id) == ["a", "b", "c"]
    assert list(df.call_index) == [0, 1, 2]
    assert list(df.workflow_calls) == [3, 3, 3]
    assert list(df.agent_call_index) == [0, 0, 1]
    assert pd.isna(df.prev_agent_output_tokens[1]) and df.prev_agent_output_tokens[2] == 300
    assert df.prev_request_id.tolist()[1:] == ["a", "b"] and df.next_agent_id.tolist()[:2] == ["engineer", "engineer"]
    assert df.gap_after_s.tolist()[:2] == pytest.approx([1.0, 3.0]) and pd.isna(df.gap_after_s[2])
    assert df.latency_s.tolist() == pytest.approx([2.0, 4.0, 1.0])
    assert json.loads(df.extra[2]) == {"extra_field": {"x": 1}}
    tools = con.execute("SELECT tool_name, latency_s, timing_source FROM tool_calls").fetchall()
    assert tools == [("grep", pytest.approx(0.5), "explicit")]



def test_untimed_tools_share_the_gap_to_the_same_agents_next_call(con, tmp_path):
    """A call logging some tools with times and some without: the timed ones keep their times,
    the untimed ones split the gap to the same agent's next call (another agent's call in
    between does not count), and a workflow whose tools are all timed needs no gap."""
    recs = [
        flat("a", t0=100, dur=2, tool_calls=[{"name": "grep", "t_start": 102.0, "t_end": 102.5},
                                             {"name": "bash"}, {"name": "edit", "t_start": 103.0}]),
        flat("b", agent="engineer", t0=104, dur=1),
        flat("c", t0=110, dur=1),
        flat("d", wf="w2", t0=100, dur=1, tool_calls=[{"name": "grep", "t_start": 101.0, "t_end": 101.25}]),
        flat("e", wf="w2", t0=102, dur=1),
    ]
    write_jsonl(tmp_path / "t.jsonl", recs)
    assert ingest.ingest(con, [tmp_path / "t.jsonl"]).loaded == 5
    tools = con.execute("SELECT request_id, tool_index, tool_name, t_start, t_end, latency_s, timing_source "
                        "FROM tool_calls ORDER BY request_id, tool_index").fetchall()
    # untimed: the gap 102 -> 110 (the planner's next call; b is the engineer's) over 2 tools
    assert tools == [("a", 0, "grep", 102.0, 102.5, 0.5, "explicit"),
                     ("a", 1, "bash", 102.0, 106.0, 4.0, "gap"),
                     ("a", 2, "edit", 102.0, 106.0, 4.0, "gap"),
                     ("d", 0, "grep", 101.0, 101.25, 0.25, "explicit")]

def test_gateway_records_both_metadata_placements(con, tmp_path):
    def gw(rid, t0, nested=True, tools=()):
        meta = {"workflow_type_id": "app", "workflow_id": "s-1", "agent_id": "engineer"}
        req = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        req.update({"extra_body": {"app_metadata": meta}} if nested else {"app_metadata": meta})
        msg = {"content": "ok", "tool_calls": [{"type": "function", "function": {"name": t, "arguments": "{}"}}
                                               for t in tools]}
        return {"request_id": rid, "t_arrival": t0, "t_first_token": t0 + 0.1, "t_finish": t0 + 1.0,
                "request": req, "response": {"choices": [{"message": msg}],
                "usage": {"prompt_tokens": 463, "completion_tokens": 308, "prompt_tokens_details": {"cached_tokens": 64}}}}
    write_jsonl(tmp_path / "gw.jsonl", [gw("r1", 10.0, True, ("bash", "grep")), gw("r2", 15.0, False)])
    rep = ingest.ingest(con, [tmp_path / "gw.jsonl"])
    assert rep.loaded == 2, rep.first_reasons
    row = con.execute("SELECT workflow_id, agent_id, input_tokens, output_tokens, cached_tokens, model, "
                      "record_shape, response_text, tool_names FROM calls WHERE request_id='r1'").fetchone()
    assert row == ("s-1", "engineer", 463, 308, 64, "m", "gateway", "ok", ["bash", "grep"])
    # tool latency from the gap to the next call of the same workflow and agent, split over 2 tools
    tools = con.execute("SELECT tool_name, latency_s, timing_source FROM tool_calls ORDER BY tool_index").fetchall()
    assert tools == [("bash", pytest.approx(2.0), "gap"), ("grep", pytest.approx(2.0), "gap")]


def test_stage_is_kept_in_extra_from_flat_and_gateway_records(con, tmp_path):
    """The step label: a flat record's ``stage`` and a gateway record's ``app_metadata.stage``
    (what the gateway logs when a client sends it) both land in ``extra`` as ``stage``."""
    def gw(rid, t0, meta_extra, **top):
        meta = {"workflow_type_id": "app", "workflow_id": "s-1", "agent_id": "cto", **meta_extra}
        return {"request_id": rid, "t_arrival": t0, "t_finish": t0 + 1.0,
                "request": {"model": "m", "messages": [], "extra_body": {"app_metadata": meta}},
                "response": {"choices": [{"message": {"content": "ok"}}],
                             "usage": {"prompt_tokens": 4, "completion_tokens": 2}}, **top}
    write_jsonl(tmp_path / "s.jsonl", [gw("g1", 10.0, {"stage": "coding"}),
                                       gw("g2", 12.0, {"stage": ""}, my_key=3),
                                       gw("g3", 14.0, {"stage": 7}),
                                       gw("g4", 16.0, {"stage": "review"}, my_key=4),
                                       flat("f1", stage="design")])
    rep = ingest.ingest(con, [tmp_path / "s.jsonl"])
    assert rep.loaded == 5, rep.first_reasons
    rows = dict(con.execute("SELECT request_id, extra FROM calls").fetchall())
    assert {k: json.loads(v) if v else None for k, v in rows.items()} == {
        "g1": {"stage": "coding"}, "g2": {"my_key": 3}, "g3": None,
        "g4": {"my_key": 4, "stage": "review"}, "f1": {"stage": "design"}}


def test_parquet_csv_and_gzip_load_the_same(con, tmp_path):
    recs = [flat(f"r{i}", wf=f"w{i % 2}", t0=100 + i, dur=0.5, out=i + 1) for i in range(6)]
    df = pd.DataFrame(recs)
    df.iloc[:2].to_parquet(tmp_path / "a.parquet")
    df.iloc[2:4].to_csv(tmp_path / "b.csv", index=False)
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as fh:
        fh.write("".join(json.dumps(r) + "\n" for r in recs[4:]))
    rep = ingest.ingest(con, [tmp_path])
    assert rep.loaded == 6 and rep.quarantined == 0, rep.first_reasons
    got = con.execute("SELECT request_id, output_tokens, source_line FROM calls ORDER BY request_id").fetchall()
    assert [g[:2] for g in got] == [(f"r{i}", i + 1) for i in range(6)]
    assert dict((g[0], g[2]) for g in got)["r3"] == 3  # CSV: header is line 1


def test_reingest_never_duplicates(con, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [flat("a"), flat("b", t0=105)])
    ingest.ingest(con, [tmp_path])
    again = ingest.ingest(con, [tmp_path])
    assert again.skipped_files == 1 and again.loaded == 0
    # same request ids, same content, in a different file: duplicates, not errors
    write_jsonl(tmp_path / "copy.jsonl", [flat("a"), flat("c", t0=120)])
    rep = ingest.ingest(con, [tmp_path / "copy.jsonl"])
    assert (rep.loaded, rep.duplicates, rep.quarantined) == (1, 1, 0)
    assert con.execute("SELECT count(*) FROM calls").fetchone()[0] == 3
    # the old workflow's derived columns were refreshed with the new call
    assert con.execute("SELECT workflow_calls FROM calls WHERE request_id='a'").fetchone()[0] == 3


def test_line_numbers_survive_large_files(con, tmp_path):
    recs = [flat(f"r{i}", wf=f"w{i % 50}", t0=float(i)) for i in range(20000)]
    recs[15000] = "{broken"
    write_jsonl(tmp_path / "big.jsonl", recs)
    rep = ingest.ingest(con, [tmp_path / "big.jsonl"])
    assert rep.loaded == 19999
    assert con.execute("SELECT line FROM quarantine").fetchone()[0] == 15001
    assert con.execute("SELECT source_line FROM calls WHERE request_id='r19999'").fetchone()[0] == 20000
