"""Logs with one time per call (``t_finish = t_arrival``, e.g. mini-SWE-agent trajectories).

A call's idle gap is the time from its finish to the workflow's next call; a zero-latency call
must not be its own "next call" (an ASOF join on ``t_arrival >= t_finish`` matches the call itself),
or every gap, and every tool latency timed by the gap, comes out 0.
"""
from __future__ import annotations

import json
from pathlib import Path

from store.ingest import ingest
from store.duckdb_store import connect


def _call(i: int, t: float, agent: str = "main", tools: list | None = None) -> dict:
    rec = {"request_id": f"r{i}", "workflow_type_id": "wt", "workflow_id": "w1", "agent_id": agent,
           "t_arrival": t, "t_finish": t, "input_tokens": 100, "output_tokens": 10}
    if tools is not None:
        rec["tool_calls"] = [{"name": n} for n in tools]
    return rec


def test_zero_latency_calls_take_the_next_call_in_order(tmp_path: Path) -> None:
    log = tmp_path / "one_time.jsonl"
    rows = [_call(0, 100.0, tools=["bash"]), _call(1, 107.0, tools=["bash"]),
            _call(2, 107.0, agent="other"), _call(3, 120.0)]
    log.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    con = connect(tmp_path / "s.duckdb")
    ingest(con, [log])
    gaps = dict(con.execute("SELECT request_id, gap_after_s FROM calls ORDER BY call_index").fetchall())
    # r1 and r2 arrive in the same second: r1 (first in order) is followed by r2 after 0 s
    assert gaps == {"r0": 7.0, "r1": 0.0, "r2": 13.0, "r3": None}
    tools = con.execute("SELECT request_id, latency_s, timing_source FROM tool_calls ORDER BY request_id").fetchall()
    # the gap to the same agent's next call: r0 -> r1 (7 s), r1 -> r3 (13 s)
    assert tools == [("r0", 7.0, "gap"), ("r1", 13.0, "gap")]
