"""Importers for the formats users have: every fixture file gives calls or a one-line reason,
each format's mapping (tokens, times, agents, tools) is grounded in the source, and what the
source lacks is flagged, never invented. The converted files load into the real DuckDB store."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from store.importers import ImportFormatError, convert, get_format, iter_records
from store.importers.detect import detect_format
from store.ingest import ingest
from store.duckdb_store import connect

FIX = Path(__file__).parent / "fixtures" / "importers"
runner = CliRunner()


def records(fmt: str, src: Path, **kw) -> tuple[list[dict], list[ImportFormatError]]:
    errors: list[ImportFormatError] = []
    return list(iter_records(fmt, src, on_error=errors.append, **kw)), errors


def test_every_fixture_file_gives_calls_or_a_one_line_reason(tmp_path):
    result = convert("auto", [FIX], tmp_path / "out")
    assert result.sources >= 16
    for one in result.per_file:
        assert one.fmt is not None, one.line()
        assert one.calls > 0 or (one.reason and "\n" not in one.reason), one.line()
    assert all(one.calls for one in result.per_file), [one.line() for one in result.per_file if not one.calls]
    # a published .traj whose steps hold no token counts gives its steps in order, with a warning
    # naming the run totals
    (traj,) = [one for one in result.per_file if "published_run" in one.source]
    assert traj.calls == 3 and any("tokens_sent=21876" in str(w) for w in traj.warnings)
    con = connect(tmp_path / "store.duckdb")
    report = ingest(con, [tmp_path / "out"])
    assert (report.loaded, report.quarantined) == (result.records, 0)


def test_cli_prints_one_line_per_file_and_warnings(tmp_path):
    out = runner.invoke(app, ["import", "--format", "auto", str(FIX), "--out", str(tmp_path / "o")])
    assert out.exit_code == 0, out.output
    assert "trajectory.json [atif]: 5 calls" in out.output
    assert "published_run/django__django-14016/django__django-14016.traj [swe-agent]: 3 calls" in out.output
    assert "UTC+08:00" in out.output  # the OpenHands V0 run's shifted clock


@pytest.mark.parametrize("name, fmt", [
    ("otel_sdk/console_exporter.json", "otel"), ("openinference/phoenix_spans.jsonl", "otel"),
    ("dynamo/dynamo-request-trace.000000.jsonl.gz", "dynamo"), ("atif/terminus-2__hello-world/trajectory.json", "atif"),
    ("openhands/llama-4-maverick_maxiter_50_N_v0.35.0-no-hint-run_1/output.jsonl", "openhands"),
])
def test_format_detection(name, fmt):
    assert detect_format(FIX / name) == fmt


# --- OpenTelemetry SDK JSON and OpenInference -------------------------------------------------

def test_console_exporter_spans_with_adk_operation_names():
    recs, errors = records("otel", FIX / "otel_sdk" / "console_exporter.json")
    assert errors == []
    assert [(r["agent_id"], r["workflow_id"], r["input_tokens"], r["output_tokens"]) for r in recs] == [
        ("weather_agent", "s-7f3a", 412, 23), ("weather_agent", "s-7f3a", 471, 58)]
    assert recs[0]["t_arrival"] == pytest.approx(1748855701.104)  # 2025-06-02T09:15:01.104Z
    assert recs[0]["t_finish"] - recs[0]["t_arrival"] == pytest.approx(1.767)
    assert recs[0]["otel_trace_id"] == "4bf92f3577b34da6a3ce929d0e0e4736"
    (tool,) = recs[0]["tool_calls"]
    assert tool["name"] == "get_weather" and tool["t_end"] - tool["t_start"] == pytest.approx(0.532)


def test_sdk_spans_with_nanoseconds_and_decimal_ids():
    recs, errors = records("otel", FIX / "otel_sdk" / "spans_nanos_decimal_ids.json")
    assert errors == []
    assert [r["agent_id"] for r in recs] == ["researcher", "researcher", "writer"]
    assert recs[0]["otel_trace_id"] == format(0x0af7651916cd43dd8448eb211c80319c, "032x")
    assert recs[0]["t_arrival"] == pytest.approx(1760100000.1)
    assert recs[0]["model"] == "gpt-4o-mini-2024-07-18"
    assert [t["name"] for t in recs[0]["tool_calls"]] == ["web_search"]
    assert recs[2]["status"] == "error"


def test_sdk_ids_in_hex_and_decimal_are_the_same_span(tmp_path):
    doc = json.loads((FIX / "otel_sdk" / "spans_nanos_decimal_ids.json").read_text())
    for span in doc["spans"]:  # the same spans, ids written as 0x-hex strings instead of ints
        span["context"]["trace_id"] = hex(span["context"]["trace_id"])
        span["context"]["span_id"] = hex(span["context"]["span_id"])
        span["parent_id"] = hex(span["parent_id"]) if span["parent_id"] else None
    (tmp_path / "hex.json").write_text(json.dumps(doc))
    a, _ = records("otel", FIX / "otel_sdk" / "spans_nanos_decimal_ids.json")
    b, _ = records("otel", tmp_path / "hex.json")
    assert [r["request_id"] for r in a] == [r["request_id"] for r in b]


def test_openinference_kinds_tokens_and_messages():
    recs, errors = records("openinference", FIX / "openinference" / "otlp_openinference.json")
    assert errors == []
    assert [(r["agent_id"], r["input_tokens"], r["output_tokens"]) for r in recs] == [
        ("supervisor", 812, 41), ("coder", 1020, 188), ("coder", 1390, 95)]
    assert {r["workflow_id"] for r in recs} == {"thread-42"}
    assert recs[1]["cached_tokens"] == 768 and recs[0]["model"] == "gpt-4o"
    assert recs[0]["messages"][1] == {"role": "user", "content": "Plot GDP of France."}
    assert recs[0]["response_text"] == "coder"
    assert [t["name"] for t in recs[1]["tool_calls"]] == ["python_repl"]


def test_phoenix_rows():
    recs, errors = records("otel", FIX / "openinference" / "phoenix_spans.jsonl")
    assert errors == [] and [r["input_tokens"] for r in recs] == [301, 388]
    assert recs[0]["workflow_id"] == "chat-9" and recs[0]["tool_calls"][0]["name"] == "lookup_order"


def test_spans_that_are_not_llm_calls_give_a_reason(tmp_path):
    doc = json.loads((FIX / "otel_sdk" / "console_exporter.json").read_text().split("\n}\n")[0] + "\n}")
    doc["name"] = "GET /health"
    doc["attributes"] = {"http.method": "GET"}
    (tmp_path / "http.json").write_text(json.dumps(doc))
    recs, errors = records("otel", tmp_path / "http.json")
    assert recs == [] and "none is an LLM call" in errors[0].reason and "GET /health" in errors[0].reason


# --- SWE-agent .traj alone, mini-SWE-agent ------------------------------------------------------

def test_traj_alone_is_read_in_order_and_flagged():
    recs, errors = records("swe-agent", FIX / "swe_agent_traj_only" / "one_call_run")
    assert errors == []
    (rec,) = recs
    assert (rec["input_tokens"], rec["output_tokens"]) == (5893, 61)
    assert rec["timing"] == "synthetic_order" and rec["t_arrival"] == rec["t_finish"] == 0.0
    assert rec["tool_calls"][0]["name"] == "submit"


def test_traj_with_cumulative_step_stats_gives_per_step_tokens(tmp_path):
    doc = json.loads(next((FIX / "swe_agent_traj_only" / "published_run").rglob("*.traj")).read_text())
    cumulative = [(5400, 120), (11300, 260), (21876, 399)]  # InstanceStats after each step
    for step, (sent, received) in zip(doc["trajectory"], cumulative):
        step["extra_info"] = {"model_stats": {"tokens_sent": sent, "tokens_received": received}}
    (tmp_path / "x.traj").write_text(json.dumps(doc))
    recs, errors = records("swe-agent", tmp_path / "x.traj")
    assert errors == []
    assert [(r["input_tokens"], r["output_tokens"]) for r in recs] == [(5400, 120), (5900, 140), (10576, 139)]
    assert [r["t_arrival"] for r in recs] == [0.0, 1.0, 2.0]


def test_mini_swe_agent_usage_and_created():
    recs, errors = records("mini-swe-agent", FIX / "mini_swe_agent")
    assert errors == []
    real = [json.loads(line) for line in
            (Path(__file__).parents[2] / "shared" / "datasets" / "mini_swe_agent_gemini3.jsonl").open()
            ][:6] if (Path(__file__).parents[2] / "shared" / "datasets").exists() else None
    assert [r["input_tokens"] for r in recs] == [1662, 5614, 6131, 6388, 6517, 9388]
    assert [r["action"] for r in recs] == ["ls", "cat", "python", "ls", "cat", "sed"]
    assert recs[2]["cached_tokens"] == 4058 and recs[0]["reasoning_tokens"] == 68
    assert all(r["timing"] == "created_only" and r["t_finish"] == r["t_arrival"] for r in recs)
    assert recs[0]["t_arrival"] == 1763510516.0 and recs[0]["workflow_id"] == "astropy__astropy-12907"
    assert [m["role"] for m in recs[1]["messages"]] == ["system", "user", "assistant", "user"]
    if real:  # the fixture carries the public run's numbers
        assert [(r["input_tokens"], r["t_arrival"]) for r in recs] == [(x["input_tokens"], x["t_arrival"]) for x in real]


def test_mini_swe_agent_without_usage_says_why(tmp_path):
    doc = json.loads(next((FIX / "mini_swe_agent").rglob("*.traj.json")).read_text())
    for m in doc["messages"]:
        m.get("extra", {}).pop("response", None)
    (tmp_path / "x.traj.json").write_text(json.dumps(doc))
    recs, errors = records("mini-swe-agent", tmp_path / "x.traj.json")
    assert recs == [] and "none carries extra.response.usage" in errors[0].reason


# --- OpenHands V1, Dynamo, ATIF ------------------------------------------------------------------

def test_openhands_v1_conversation_folder_and_output_line():
    folder, errors = records("openhands", FIX / "openhands_v1" / "conversations")
    assert [e.warning for e in errors] == [True]  # naive times, nothing to check them against
    line, _ = records("openhands", FIX / "openhands_v1" / "eval_outputs")
    for recs in (folder, line):
        assert [(r["input_tokens"], r["output_tokens"], r.get("cached_tokens")) for r in recs] == [
            (8110, 96, 0), (8259, 241, 8110), (8512, 65, 7250)]
        assert recs[0]["t_finish"] - recs[0]["t_arrival"] == pytest.approx(3.312)
        assert [(t["name"], t["status"]) for t in recs[1]["tool_calls"]] == [("file_editor", "ok"),
                                                                            ("file_editor", "error")]
        assert "tool_calls" not in recs[2]  # a plain agent message ran nothing
    assert folder[0]["workflow_id"] == "7c9e6679-7425-40de-944b-e07fc1f90ae7"


def test_openhands_v1_folder_without_events_says_why(tmp_path):
    src = tmp_path / "c1"
    shutil.copytree(FIX / "openhands_v1" / "conversations" / "7c9e6679-7425-40de-944b-e07fc1f90ae7", src)
    shutil.rmtree(src / "events")
    recs, errors = records("openhands", src / "base_state.json")
    assert recs == [] and "no events/*.json" in errors[0].reason


def test_dynamo_sessions_agents_and_tool_events():
    recs, errors = records("dynamo", FIX / "dynamo" / "dynamo-request-trace.000000.jsonl.gz")
    assert errors == []
    assert {r["workflow_id"] for r in recs} == {"research-run-42"}
    assert [r["agent_id"] for r in recs] == ["planner", "researcher", "researcher", "writer", "planner"]
    first = recs[1]
    assert first["t_arrival"] == pytest.approx(1777312801.1) and first["t_finish"] - first["t_arrival"] == pytest.approx(2.3)
    assert first["t_first_token"] - first["t_arrival"] == pytest.approx(0.21)
    assert first["cached_tokens"] == 64
    assert [(t["name"], t["status"], round(t["t_end"] - t["t_start"], 3)) for t in first["tool_calls"]] == [
        ("web_search", "ok", 0.42), ("web_search", "error", 0.83)]


def test_dynamo_context_free_rows_warn(tmp_path):
    recs, errors = records("dynamo", FIX / "dynamo" / "context_free.jsonl")
    assert [r["input_tokens"] for r in recs] == [128, 256, 384]  # replay.input_length
    assert len(errors) == 1 and errors[0].warning and "agent_context" in errors[0].reason
    other = tmp_path / "x.jsonl"
    other.write_text(json.dumps({"schema": "dynamo.request.trace.v2", "event_type": "request_end"}) + "\n")
    recs, errors = records("dynamo", other)
    assert recs == [] and "dynamo.request.trace.v1" in errors[0].reason


def test_atif_steps_subagents_and_one_stamp_timing():
    recs, errors = records("atif", FIX / "atif")
    assert errors == []
    assert [(r["agent_id"], r["input_tokens"], r["output_tokens"]) for r in recs] == [
        ("terminus-2", 1843, 97), ("terminus-2", 2051, 64), ("terminus-2", 2290, 31),
        ("writer", 612, 55), ("writer", 700, 12)]
    assert {r["workflow_id"] for r in recs} == {"hello-world__3kQz9Xa"}
    assert all(r["timing"] == "created_only" for r in recs)
    assert recs[1]["tool_names"] == ["spawn_subagent"] and recs[1]["cached_tokens"] == 1792
    assert recs[3]["model"] == "anthropic/claude-haiku-4-5"


def test_unknown_format_names_the_known_ones():
    with pytest.raises(ValueError, match="known formats: otel, swe-agent, mini-swe-agent, openhands, dynamo, atif"):
        get_format("langfuse")
    assert get_format("openinference") is get_format("otel")


@pytest.mark.slow
def test_docs_importers_examples_run_as_written(tmp_path):
    """Every ```bash block of docs/importers.md runs from a folder where `tests/` and `datasets/`
    are the repository's, and every import in it writes calls."""
    import os
    import re
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "tests").symlink_to(root / "tests")
    (tmp_path / "datasets").symlink_to(root / "datasets")
    env = {**os.environ, "PATH": str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""),
           "PYTHONPATH": str(root)}
    blocks = re.findall(r"```bash\n(.*?)```", (root / "docs" / "importers.md").read_text(), flags=re.S)
    assert len(blocks) >= 8
    for block in blocks:
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, (block, out.stdout[-2000:], out.stderr[-2000:])
        if "profiler import" in block:
            assert re.search(r"imported [1-9]\d* calls", out.stdout), (block, out.stdout)
    assert (tmp_path / "profile-order" / "CURRENT").is_file()


def test_span_times_in_any_epoch_unit_and_iso():
    from store.importers.otel_spans import to_nanos

    ns = 1_760_100_000_100_000_000
    assert to_nanos(ns) == to_nanos(str(ns)) == ns
    assert to_nanos(1760100000.1) == pytest.approx(ns, abs=1000)  # seconds
    assert to_nanos(1_760_100_000_100) == ns  # milliseconds
    assert to_nanos("2025-10-10T12:40:00.100000Z") == to_nanos("2025-10-10T12:40:00.1+00:00") == ns
