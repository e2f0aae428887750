"""Claude Code sessions, Codex rollouts and TraceLab rounds -> flat records, and what the fit does
with the human turns they mark.

The fixtures under ``tests/fixtures/importers/{claude_code,codex,tracelab}`` are TraceLab's public
example sessions (uw-syfi/TraceLab ``example_sessions/``, texts shortened) and the normalized rows
TraceLab derived from them, so every count below is checked against a third party's reading of
the same files (TraceLab's rows pseudonymized, as its public dataset is);
``claude_code/-workspace-demo`` is a hand-written session with a subagent file.
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from fitting.profile_fit import human_wait_section, idle_gap_calls, ok_calls, timed_tool_calls
from store.importers import ImportFormatError, convert, iter_records
from store.importers.detect import detect_format
from store.ingest import ingest
from store.profile_artifact import load_profile
from store.duckdb_store import connect

FIX = Path(__file__).parent / "fixtures" / "importers"
CLAUDE = FIX / "claude_code" / "-workspace-project" / "2f8b1c4d-6a73-4e9b-91c0-5d7f3a8e2b46.jsonl"
DEMO = FIX / "claude_code" / "-workspace-demo"
DEMO_SID = "5d0c7a8e-1f2b-4c3d-9e8f-a1b2c3d4e5f6"
CODEX = next((FIX / "codex").rglob("rollout-*.jsonl"))
TRACELAB = FIX / "tracelab" / "round_trace.jsonl"
runner = CliRunner()


def records(fmt: str, src: Path, **kw) -> tuple[list[dict], list[ImportFormatError]]:
    errors: list[ImportFormatError] = []
    return list(iter_records(fmt, src, on_error=errors.append, **kw)), errors


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def tracelab_rows(provider: str) -> list[dict]:
    return [r for r in lines(TRACELAB) if r["provider"] == provider]


def shape(rec: dict) -> tuple:
    """What two readings of the same call must agree on."""
    tools = [(t["name"], round(t["t_end"] - t["t_start"], 3)) for t in rec.get("tool_calls", [])]
    return (rec["input_tokens"], rec.get("cached_tokens"), rec["output_tokens"], round(rec["t_arrival"], 3),
            round(rec["t_finish"], 3), tools, rec.get("wait_after"))


# --- Claude Code -------------------------------------------------------------------------------

def test_claude_code_one_call_per_message_with_exact_tokens_tools_and_human_turn():
    raw = lines(CLAUDE)
    assistant = [r for r in raw if r["type"] == "assistant"]
    messages = {r["message"]["id"]: r["message"]["usage"] for r in assistant}
    assert len(assistant) > len(messages) == 10  # split messages repeat their usage
    recs, errors = records("claude-code", CLAUDE)
    assert errors == []  # mode, permission-mode, file-history-snapshot, attachment, ai-title... skipped silently
    assert len(recs) == 10 and len({r["request_id"] for r in recs}) == 10
    for rec, (msg_id, usage) in zip(recs, messages.items()):
        assert rec["request_id"].endswith(msg_id)
        assert rec["input_tokens"] == (usage["input_tokens"] + usage["cache_creation_input_tokens"]
                                       + usage["cache_read_input_tokens"])
        assert rec["cached_tokens"] == usage["cache_read_input_tokens"]
        assert rec["output_tokens"] == usage["output_tokens"]
        assert rec["model"] == "claude-opus-4-8" and rec["agent_id"] == "main"
        assert rec["workflow_id"] == "2f8b1c4d-6a73-4e9b-91c0-5d7f3a8e2b46"
        assert rec["workflow_type_id"] == "claude_code"
    # every tool_use pairs with its tool_result: start/end are those records' timestamps
    use_at = {b["id"]: (b["name"], epoch(r["timestamp"])) for r in assistant for b in r["message"]["content"]
              if b["type"] == "tool_use"}
    result_at = {b["tool_use_id"]: epoch(r["timestamp"]) for r in raw if r["type"] == "user"
                 and isinstance(r["message"]["content"], list) for b in r["message"]["content"]
                 if b.get("type") == "tool_result"}
    tools = [t for rec in recs for t in rec.get("tool_calls", [])]
    assert len(tools) == len(use_at) == len(result_at) == 9
    assert sorted((t["name"], t["t_start"], t["t_end"]) for t in tools) == \
        sorted((name, start, result_at[i]) for i, (name, start) in use_at.items())
    # the second prompt is a person's: the call before it waits on a human, no other call does
    assert [r.get("wait_after") for r in recs].count("human") == 1
    assert recs[4]["wait_after"] == "human" and recs[5]["t_arrival"] == epoch("2026-06-01T05:42:43.333Z")


def test_claude_code_subagent_file_is_its_own_agent_of_the_same_workflow():
    recs, errors = records("claude-code", DEMO)
    assert errors == []
    by_agent = Counter(r["agent_id"] for r in recs)
    assert by_agent == {"main": 4, "Explore": 3}  # named by the Task tool's subagent_type
    assert {r["workflow_id"] for r in recs} == {DEMO_SID}
    side = [r for r in recs if r["agent_id"] == "Explore"]
    assert all(r["claude_agent_id"] == "a7f3e21" for r in side)
    assert [t["name"] for r in side for t in r.get("tool_calls", [])] == ["Grep", "Read"]
    main = [r for r in recs if r["agent_id"] == "main"]
    (task,) = main[0]["tool_calls"]
    assert task["name"] == "Task" and task["t_end"] - task["t_start"] == pytest.approx(26.5)
    assert [r.get("wait_after") for r in main] == [None, "human", None, None]


def test_claude_code_inline_sidechain_named_by_its_prompt(tmp_path):
    """Older Claude Code wrote a subagent's records into the session file itself."""
    main = DEMO / f"{DEMO_SID}.jsonl"
    side = DEMO / DEMO_SID / "subagents" / "agent-a7f3e21.jsonl"
    merged = lines(main)
    side_recs = [{k: v for k, v in r.items() if k != "agentId"} for r in lines(side)]  # no agentId then
    out = merged[:7] + side_recs + merged[7:]  # the sidechain runs between the Task call and its result
    (tmp_path / "s.jsonl").write_text("".join(json.dumps(r) + "\n" for r in out))
    recs, errors = records("claude-code", tmp_path / "s.jsonl")
    assert errors == []
    assert Counter(r["agent_id"] for r in recs) == {"main": 4, "Explore": 3}


def test_bad_line_is_one_line_error_and_the_rest_is_kept(tmp_path):
    for src, fmt, n in ((CLAUDE, "claude-code", 10), (CODEX, "codex", 9), (TRACELAB, "tracelab", 19)):
        text = src.read_text().splitlines(keepends=True)
        bad = tmp_path / fmt / src.name
        bad.parent.mkdir()
        bad.write_text("".join(text[:4]) + '{"type": "assistant", "message": {"id": \n' + "".join(text[4:]))
        recs, errors = records(fmt, bad)
        assert len(recs) == n, fmt
        (err,) = errors
        assert str(err).startswith(f"{bad}:5: not valid JSON") and "\n" not in str(err)


# --- Codex -------------------------------------------------------------------------------------

def test_codex_one_call_per_token_count_with_usage_tools_and_human_turns():
    raw = lines(CODEX)
    counts = [r["payload"]["info"]["last_token_usage"] for r in raw
              if r["type"] == "event_msg" and r["payload"]["type"] == "token_count" and r["payload"]["info"]]
    recs, errors = records("codex", CODEX)
    assert errors == [] and len(recs) == len(counts) == 9
    for rec, usage in zip(recs, counts):
        assert (rec["input_tokens"], rec["cached_tokens"], rec["output_tokens"], rec["reasoning_tokens"]) == \
            (usage["input_tokens"], usage["cached_input_tokens"], usage["output_tokens"],
             usage["reasoning_output_tokens"])
    assert {r["workflow_id"] for r in recs} == {"01a7c9e4-6d12-7b3a-9f42-8c6d5e1a0b73"}
    assert {(r["workflow_type_id"], r["agent_id"], r["model"]) for r in recs} == {("codex", "main", "gpt-5.4")}
    calls = {r["payload"]["call_id"]: epoch(r["timestamp"]) for r in raw if r["payload"].get("type") == "function_call"}
    outputs = {r["payload"]["call_id"]: epoch(r["timestamp"]) for r in raw
               if r["payload"].get("type") == "function_call_output"}
    tools = [t for r in recs for t in r.get("tool_calls", [])]
    assert len(tools) == len(calls) == 10
    assert sorted((t["t_start"], t["t_end"]) for t in tools) == sorted((calls[i], outputs[i]) for i in calls)
    # two more prompts after the first: the call before each waits on a person
    assert [i for i, r in enumerate(recs) if r.get("wait_after") == "human"] == [4, 6]


def test_codex_repeated_usage_is_one_call_and_subagent_rollout_joins_its_parent(tmp_path):
    raw = lines(CODEX)
    i = next(k for k, r in enumerate(raw) if r["payload"].get("type") == "token_count" and r["payload"]["info"])
    rate_limit = {**raw[i], "payload": {"type": "token_count", "info": None, "rate_limits": {}}}
    dup = tmp_path / "rollout-dup.jsonl"
    dup.write_text("".join(json.dumps(r) + "\n" for r in raw[:i + 1] + [raw[i], rate_limit] + raw[i + 1:]))
    assert len(records("codex", dup)[0]) == 9
    # a spawned sub-agent: same workflow as its parent thread, agent "subagent" (as the gateway
    # names a call carrying x-codex-parent-thread-id); parent turns it replays are skipped
    parent = "01a7c9e4-6d12-7b3a-9f42-8c6d5e1a0b73"
    child = "01a7c9e6-0000-7000-8000-000000000001"
    meta = {**raw[0], "payload": {**raw[0]["payload"], "id": child, "source": {"subagent": {"thread_spawn": {
        "parent_thread_id": parent, "depth": 1, "agent_role": "worker", "agent_nickname": "Euler"}}}}}
    # the child's file: its meta, the parent's history replayed (parent meta and turns, UUIDv7 turn
    # ids older than the child's id), then its own turn (the parent's last turn under a newer id)
    last_turn, own_turn = "01a7c9e5-8f20-7a6d-a14c-6e9b27c3f0d1", "01a7c9e6-1111-7000-8000-0000000000aa"
    start = next(k for k, r in enumerate(raw) if r["payload"].get("turn_id") == last_turn)
    own = [json.loads(json.dumps(r).replace(last_turn, own_turn)) for r in raw[start:]]
    sub = tmp_path / "rollout-child.jsonl"
    sub.write_text("".join(json.dumps(r) + "\n" for r in [meta, raw[0]] + raw[1:] + own))
    recs, errors = records("codex", sub)
    assert errors == []
    assert len(recs) == 2  # the child's own turn: two calls; the 9 replayed parent calls skipped
    assert {(r["workflow_id"], r["agent_id"], r["codex_agent_role"], r["codex_thread_id"]) for r in recs} == \
        {(parent, "subagent", "worker", child)}


# --- TraceLab ----------------------------------------------------------------------------------

def test_tracelab_rows_agree_with_the_raw_session_importers():
    recs, errors = records("tracelab", TRACELAB)
    assert errors == [] and len(recs) == len(lines(TRACELAB)) == 19
    claude = [r for r in recs if r["workflow_type_id"] == "claude_code"]
    codex = [r for r in recs if r["workflow_type_id"] == "codex"]
    assert len(claude) == len(tracelab_rows("claude")) == 10 and len(codex) == 9
    # the same sessions read from the raw files give the same calls, tools and human turns
    assert [shape(r) for r in claude] == [shape(r) for r in records("claude-code", CLAUDE)[0]]
    assert [shape(r) for r in codex] == [shape(r) for r in records("codex", CODEX)[0]]
    internal = [t.get("internal_latency_s") for r in claude for t in r.get("tool_calls", [])]
    assert internal[1] == pytest.approx(19.287)  # the tool's own duration, beside the wall one


# --- detection, CLI, fit -----------------------------------------------------------------------

def test_auto_detection_picks_each_format(tmp_path):
    assert detect_format(CLAUDE) == "claude-code"
    assert detect_format(DEMO / DEMO_SID / "subagents" / "agent-a7f3e21.jsonl") == "claude-code"
    assert detect_format(CODEX) == "codex"
    assert detect_format(TRACELAB) == "tracelab"
    renamed = tmp_path / "session.jsonl"  # a rollout without its usual name: told by its records
    shutil.copy(CODEX, renamed)
    assert detect_format(renamed) == "codex"


def test_import_json_then_fit_keeps_human_waits_out_of_keep_alive(tmp_path):
    out = runner.invoke(app, ["import", str(FIX / "claude_code"), str(FIX / "codex"), "--out", str(tmp_path / "logs"),
                              "--json"])  # --format auto is the default
    assert out.exit_code == 0, out.output
    report = json.loads(out.stdout)
    assert report["calls"] == 26 and report["problems"] == 0
    assert sorted((Path(f["source"]).name, f["format"], f["calls"]) for f in report["files"]) == sorted([
        (CLAUDE.name, "claude-code", 10), (f"{DEMO_SID}.jsonl", "claude-code", 4),
        ("agent-a7f3e21.jsonl", "claude-code", 3), (CODEX.name, "codex", 9)])
    fit = runner.invoke(app, ["fit", str(tmp_path / "logs"), "--out", str(tmp_path / "p")])
    assert fit.exit_code == 0, fit.output
    assert "gaps end in a person's turn" in fit.output
    data = load_profile(tmp_path / "p").data
    assert data["limitations"]["timing"] == "timed"
    assert set(data["human_wait"]) == {"claude_code", "codex"}
    assert data["human_wait"]["codex"]["waits"] == 2
    assert data["agents"]["claude_code"].keys() == {"main", "Explore"}
    assert data["tool_latency"]["workflow_types"]["codex"]  # exec_command timed from call to output
    shown = runner.invoke(app, ["show", "--profile", str(tmp_path / "p")])
    assert shown.exit_code == 0 and "human waits codex: 2 (25% of gaps)" in shown.output


def _flat(workflow: int, k: int, t: float, **extra) -> dict:
    return {"request_id": f"w{workflow}-{k}", "workflow_type_id": "chat", "workflow_id": f"w{workflow}",
            "agent_id": "main", "t_arrival": t, "t_finish": t + 1.0, "input_tokens": 100 + k,
            "output_tokens": 20 + k, **extra}


def test_human_waits_are_kept_out_of_idle_gap_and_gap_timed_tool_fits(tmp_path):
    """Each workflow: three calls 2 s apart (machine waits), then a call whose response asks the
    user (an untimed ``ask_user`` tool) and a 300 s think time before the person's next prompt."""
    rows = []
    for w in range(30):
        t = 1.7e9 + w * 10_000
        for k in range(3):
            rows.append(_flat(w, k, t))
            t += 3.0  # 1 s call + 2 s gap
        rows.append(_flat(w, 3, t, tool_calls=[{"name": "ask_user"}], wait_after="human"))
        rows.append(_flat(w, 4, t + 301.0))
    logs = tmp_path / "logs.jsonl"
    logs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    con = connect(tmp_path / "store.duckdb")
    ingest(con, [logs])
    gaps = idle_gap_calls(con)
    assert len(gaps) == 30 * 4 and gaps["gap_after_s"].max() == pytest.approx(2.0)
    assert timed_tool_calls(con).empty  # the ask_user "latency" would be the person's 300 s
    human = human_wait_section(con)["chat"]
    assert human["waits"] == 30 and human["p50_s"] == pytest.approx(300.0)
    assert human["share_of_gaps"] == pytest.approx(30 / 120)
    assert len(ok_calls(con)) == 150
    # the same logs without the mark: the think time is taken for a machine wait and a tool latency
    plain = tmp_path / "plain.jsonl"
    plain.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "wait_after"}) + "\n" for r in rows))
    con2 = connect(tmp_path / "store2.duckdb")
    ingest(con2, [plain])
    assert idle_gap_calls(con2)["gap_after_s"].max() == pytest.approx(300.0)
    assert timed_tool_calls(con2)["latency_s"].tolist() == pytest.approx([300.0] * 30)
    assert human_wait_section(con2) == {}


def test_totals_only_traj_fits_order_only_with_real_tool_durations(tmp_path):
    src = FIX / "swe_agent_traj_only" / "published_run"
    out = runner.invoke(app, ["import", str(src), "--out", str(tmp_path / "a")])
    assert out.exit_code == 0 and "3 calls" in out.output and "tokens_sent=21876" in out.output
    fit = runner.invoke(app, ["fit", str(tmp_path / "a"), "--out", str(tmp_path / "pa")])
    assert fit.exit_code != 0 and "--estimate-tokens" in fit.output and "\n" not in fit.output.strip()
    out = runner.invoke(app, ["import", str(src), "--estimate-tokens", "--out", str(tmp_path / "b")])
    assert out.exit_code == 0, out.output
    fit = runner.invoke(app, ["fit", str(tmp_path / "b"), "--out", str(tmp_path / "pb")])
    assert fit.exit_code == 0, fit.output
    lim = load_profile(tmp_path / "pb").data["limitations"]
    assert lim["timing"] == "order_only" and "tool_latency" not in lim["unavailable"]
    assert any("estimated token counts" in n for n in lim["notes"])
    assert any("3 real tool execution times" in n for n in lim["notes"])


def test_hostile_files_get_one_line_reasons_and_the_good_files_beside_them_are_kept(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(CLAUDE, src / CLAUDE.name)
    shutil.copy(CODEX, src / CODEX.name)
    deep = '{"a":' * 10_000 + "1" + "}" * 10_000
    (src / "deep.json").write_text(deep)                   # past the JSON parser's recursion limit
    (src / "rollout-deep.jsonl").write_text(deep + "\n")
    (src / "x.traj").write_text(deep)
    (src / "binary.jsonl").write_bytes(bytes(range(256)) * 40)
    (src / "truncated.jsonl.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    cut = src / "cut-session.jsonl"                        # a session cut off mid-line
    cut.write_text(CLAUDE.read_text()[:9000])
    for fmt in ("auto", "claude-code", "codex", "tracelab", "otel", "swe-agent"):
        result = convert(fmt, [src], tmp_path / f"out-{fmt}")
        for one in result.per_file:
            assert one.calls or (one.reason and "\n" not in one.reason and one.line().startswith(one.source)), fmt
    result = convert("auto", [src], tmp_path / "out")
    calls = {Path(one.source).name: one.calls for one in result.per_file}
    assert calls[CLAUDE.name] == 10 and calls[CODEX.name] == 9
    assert 0 < calls["cut-session.jsonl"] < 10  # what the cut file holds, and a reason for its last line
    lines_out = {Path(one.source).name: one.line() for one in result.per_file}
    assert "too deep" in lines_out["rollout-deep.jsonl"] and "too deep" in lines_out["x.traj"]
    out = runner.invoke(app, ["import", "--format", "tracelab", str(src), "--out", str(tmp_path / "o2")])
    assert "binary.jsonl [tracelab]: 0 calls - not UTF-8 text" in out.output
    assert "truncated.jsonl.gz [tracelab]: 0 calls - not a readable gzip file" in out.output
    assert "Traceback" not in out.output


def test_workflow_type_from_the_project_folder():
    recs, _ = records("claude-code", DEMO, workflow_type="cc_{project}")
    assert {r["workflow_type_id"] for r in recs} == {"cc_demo"}  # cwd /workspace/demo
    recs, _ = records("codex", CODEX, workflow_type="codex_team")
    assert {r["workflow_type_id"] for r in recs} == {"codex_team"}
