"""`profiler replay` against the project's fake OpenAI server on a real port: the closed-loop call
graph (parents + scaled gaps), prefix-sharing prompts, what goes on the wire, and the summary."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from profiler.cli import app
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.replay import ReplayOptions, arrival_offsets, replay
from serving_hooks.replay_plan import load_plan
from serving_hooks.replay_prompts import Context, build_messages
from serving_hooks.replay_report import call_records, summarize
from serving_hooks.server_thread import serve_in_thread

runner = CliRunner()


def _rec(rid, wid, agent, t0, t1, n_in, n_out, parents=None, wtype="coder"):
    r = {"request_id": rid, "workflow_type_id": wtype, "workflow_id": wid, "agent_id": agent,
         "t_arrival": 1000.0 + t0, "t_finish": 1000.0 + t1, "input_tokens": n_in, "output_tokens": n_out}
    if parents is not None:
        r["parent_request_ids"] = parents
    return r


@pytest.fixture
def logs(tmp_path: Path) -> Path:
    recs = [
        # W1: a1 -> (gap 2 s) a2 -> fan-out a3, a4 -> fan-in a5
        _rec("a1", "W1", "planner", 0, 1, 40, 5),
        _rec("a2", "W1", "coder", 3, 4, 80, 6),
        _rec("a3", "W1", "coder", 5, 6, 120, 4, ["a2"]),
        _rec("a4", "W1", "tester", 5, 7, 60, 4, ["a2"]),
        _rec("a5", "W1", "planner", 8, 9, 200, 3, ["a3", "a4"]),
        # W2: b2 overlaps b1 (arrives before b1 finished, no parents logged): stays concurrent
        _rec("b1", "W2", "main", 10, 14, 30, 5),
        _rec("b2", "W2", "main", 11, 12, 35, 5),
        _rec("b3", "W2", "main", 15, 16, 90, 5),
    ]
    path = tmp_path / "logs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_plan_parents_and_gaps(logs):
    plan, summary = load_plan([logs])
    assert "8 calls loaded" in summary
    w1, w2 = plan
    calls = {c.request_id: c for c in w1.calls}
    assert calls["a1"].parents == [] and calls["a1"].delay_s == 0
    assert calls["a2"].parents == ["a1"] and calls["a2"].delay_s == pytest.approx(2.0)
    assert calls["a5"].parents == ["a3", "a4"] and calls["a5"].delay_s == pytest.approx(1.0)
    assert calls["a3"].output_tokens == 4 and calls["a3"].input_tokens == 120
    assert w1.recorded_jct_s == pytest.approx(9.0)
    b = {c.request_id: c for c in w2.calls}
    assert b["b2"].parents == [] and b["b2"].delay_s == pytest.approx(1.0)   # concurrent with b1
    assert b["b3"].parents == ["b1"] and b["b3"].delay_s == pytest.approx(1.0)  # b1 finished last
    assert [w.workflow_id for w in load_plan([logs], max_workflows=1)[0]] == ["W1"]
    with pytest.raises(ValueError, match="no valid calls"):
        load_plan([logs], workflow_types=["nope"])


def test_prompts_extend_the_largest_fitting_context():
    a = Context([{"role": "user", "content": "x " * 10}], "reply one", 14, 6)
    b = Context([{"role": "system", "content": "s " * 21}, {"role": "user", "content": "y " * 26}],
                "reply two", 55, 6)
    msgs = build_messages(100, [a, b], "k", 0)          # b + its reply fits: continue it
    assert msgs[:3] == b.continued() and msgs[3]["role"] == "user"
    assert len(msgs[3]["content"].split()) == 100 - 4 - (61 + 4)
    assert build_messages(60, [a, b], "k", 0)[:2] == b.messages          # prompt alone fits
    assert build_messages(30, [a, b], "k", 0)[:1] == b.messages[:1]      # its system start (25) fits
    short = build_messages(22, [a], "k", 0)          # 14 + 6 + 4 = 24 > 18: the prompt without the reply
    assert short[:1] == a.messages and len(short) == 2 and len(short[1]["content"].split()) == 18 - 14
    fresh = build_messages(10, [a, b], "k", 0)                    # nothing fits: new conversation
    assert len(fresh) == 1 and len(fresh[0]["content"].split()) == 6
    assert build_messages(30, [a], "k", 1) != build_messages(30, [a], "k", 2)   # seeded text


def test_gamma_arrivals_have_the_asked_rate_and_burstiness():
    t = arrival_offsets(20_000, rate=4.0, cv=2.0, seed=3)
    gaps = np.diff(t)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(2.0, rel=0.1)
    with pytest.raises(ValueError, match="concurrency"):
        ReplayOptions(concurrency=None, rate=None)
    with pytest.raises(ValueError, match="identity"):
        ReplayOptions(identity="cookie")


def test_closed_loop_replay_against_a_real_port(logs):
    fake = FakeOpenAI(reply_tokens=3, chunk_delay_s=0.01)
    plan, _ = load_plan([logs])
    scale = 0.05
    with serve_in_thread(fake.app) as srv:
        result = replay(plan, srv.url, ReplayOptions(concurrency=2, time_scale=scale, run_tag="t1",
                                                     identity="both"))
    by = {c.request_id.removesuffix("-t1"): c for c in result.calls}
    assert len(by) == 8 and all(c.status == "ok" for c in by.values())
    # closed loop: a child is sent no earlier than its parents' finish plus the scaled gap
    assert by["a2"].t_send >= by["a1"].t_finish + 2.0 * scale
    assert by["a5"].t_send >= max(by["a3"].t_finish, by["a4"].t_finish) + 1.0 * scale
    assert min(by["a3"].t_send, by["a4"].t_send) >= by["a2"].t_finish
    # the wire: model from /v1/models, max_tokens, ignore_eos, identity in body and headers
    chats = [r for r in fake.received if r.path == "/v1/chat/completions"]
    body = {r.body["app_metadata"]["agent_id"] + str(r.body["max_tokens"]): r for r in chats}
    a2 = body["coder6"]
    assert a2.body["model"] == "fake-model" and a2.body["ignore_eos"] is True and a2.body["stream"]
    assert a2.body["app_metadata"] == {"workflow_type_id": "coder", "workflow_id": "W1-t1", "agent_id": "coder"}
    assert a2.headers["x-workflow-id"] == "W1-t1" and a2.headers["x-agent-id"] == "coder"
    # prefix sharing: a3 (coder, parent a2) continues a2's conversation with a2's real reply
    a3 = body["coder4"].body["messages"]
    assert a3[: len(a2.body["messages"])] == a2.body["messages"]
    assert a3[len(a2.body["messages"])] == {"role": "assistant", "content": "tok0 tok1 tok2"}
    s = summarize(result)
    assert s["workflows"]["count"] == 2 and s["calls"]["errors"] == 0
    assert s["workflows"]["jct_s"]["avg"] > 0 and s["calls"]["ttft_s"]["p95"] is not None
    assert s["tokens"]["completion"] == 8 * 3 and s["tokens"]["cached"] == 0
    recs = call_records(result)
    assert {r["workflow_id"] for r in recs} == {"W1-t1", "W2-t1"} and all("t_first_token" in r for r in recs)


def test_cli_json_errors_and_records(logs, tmp_path):
    fake = FakeOpenAI(reply_tokens=2)
    out = tmp_path / "replayed.jsonl"
    with serve_in_thread(fake.app) as srv:
        cfg = tmp_path / "replay.toml"           # the wire knobs are config keys (or PROFILER_REPLAY_*)
        cfg.write_text('progress = false\nextra_body = \'{"priority": 7}\'\nidentity = "none"\n')
        ok = runner.invoke(app, ["replay", str(logs), "--target", srv.url, "--rate", "50", "--arrival-cv", "3",
                                 "--time-scale", "0", "--json", "--out", str(out), "--config", str(cfg)])
        bad = runner.invoke(app, ["replay", str(logs), "--target", srv.url, "--time-scale", "0"],
                            env={"PROFILER_REPLAY_HEADERS": "x-fake-status: 500",
                                 "PROFILER_REPLAY_PROGRESS": "false"})
    assert ok.exit_code == 0, ok.output
    s = json.loads(ok.stdout)
    assert s["calls"]["count"] == 8 and s["options"]["rate"] == 50
    assert all(r.body.get("priority") == 7 and "app_metadata" not in r.body
               for r in fake.received if r.path == "/v1/chat/completions" and r.body.get("priority"))
    assert len(out.read_text().splitlines()) == 8
    assert bad.exit_code == 1 and "HTTP 500" in bad.output
