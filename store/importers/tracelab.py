"""TraceLab normalized rounds (one LLM call per JSON line) -> flat records.

TraceLab (uw-syfi/TraceLab, code Apache-2.0, dataset CC BY 4.0) normalizes Claude Code and Codex
session files into one row per LLM invocation (``scripts/extract_claude_rounds.py``,
``extract_codex_rounds.py``; README "Normalized Rows", ``example_sessions/derived/``)::

    {"provider": "claude" | "codex", "session_id": "claude:<id>", "round_index": 0, "round_id",
     "model", "input_tokens_total", "prefix_tokens", "output_tokens", "reasoning_output_tokens",
     "timing_events": [{"event_type": "user_message" | "tool_result" | "reasoning" | "text" |
                        "tool_call" | "usage_report", "timestamp": "…Z", …}],
     "tools": [{"tool_name", "emitted_at", "result_at", "tool_wall_latency_ms",
                "tool_internal_latency_ms", "is_error"}], "trace_key", …}

One flat record per row: ``input_tokens`` = ``input_tokens_total``, ``cached_tokens`` =
``prefix_tokens``, ``output_tokens``; ``t_arrival`` = the latest input event (``user_message`` /
``tool_result``; else the first event), ``t_finish`` = the last event; ``tool_calls`` from
``tools[]`` (``t_start`` = ``emitted_at``, ``t_end`` = ``result_at`` or ``emitted_at +
tool_wall_latency_ms``; the tool's own ``tool_internal_latency_ms`` kept as
``internal_latency_s``). A row whose session's next row starts with a ``user_message`` is marked
``wait_after: "human"``. ``workflow_type_id`` = ``claude_code`` or ``codex`` by ``provider`` (the
gateway's names), ``workflow_id`` = ``session_id`` without its ``provider:`` prefix, ``agent_id``
= ``main``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    iso_to_epoch,
    iter_json_lines,
    report,
    resolve_timezone,
)

NAME = "tracelab"
ALIASES = ("tracelab-rounds",)
SUMMARY = "TraceLab normalized round JSONL (one Claude Code / Codex LLM call per line)"
FILE_PATTERNS = ("*.jsonl", "*.jsonl.gz")
WORKFLOW_TYPES = {"claude": "claude_code", "codex": "codex"}
INPUT_EVENTS = frozenset({"user_message", "tool_result"})


def _time(value: Any, tz: Any) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        return iso_to_epoch(value, tz)
    except ValueError:
        return None


def _row(row: dict, path: Path, lineno: int, workflow_type: str | None, tz: Any) -> dict:
    """The flat record of one row (raises :class:`ImportFormatError` naming the field)."""
    def bad(reason: str, fld: str) -> ImportFormatError:
        return ImportFormatError(str(path), lineno, reason, fld)

    n_in, n_out = count_field(row.get("input_tokens_total")), count_field(row.get("output_tokens"))
    if n_in is None or n_out is None:
        raise bad("no input_tokens_total/output_tokens count", "input_tokens_total")
    events = [e for e in row.get("timing_events") or [] if isinstance(e, dict)]
    stamps = [(t, e.get("event_type")) for e in events if (t := _time(e.get("timestamp"), tz)) is not None]
    if not stamps:
        raise bad("no timing_events with a timestamp", "timing_events")
    inputs = [t for t, kind in stamps if kind in INPUT_EVENTS]
    t_finish = max(t for t, _ in stamps)
    provider = str(row.get("provider") or "")
    session = str(row.get("session_id") or "")
    if not session:
        raise bad("no session_id", "session_id")
    workflow_id = session.split(":", 1)[1] if session.startswith(f"{provider}:") and provider else session
    rec: dict[str, Any] = {
        "request_id": "tracelab:" + str(row.get("trace_key") or f"{session}:{row.get('round_index')}"),
        "workflow_type_id": workflow_type or WORKFLOW_TYPES.get(provider, provider or NAME),
        "workflow_id": workflow_id, "agent_id": str(row.get("agent_id") or "main"),
        "t_arrival": max(inputs) if inputs else min(t for t, _ in stamps), "t_finish": t_finish,
        "input_tokens": n_in, "output_tokens": n_out,
    }
    rec["t_arrival"] = min(rec["t_arrival"], t_finish)
    if (cached := count_field(row.get("prefix_tokens"))) is not None:
        rec["cached_tokens"] = min(cached, n_in)
    if row.get("model"):
        rec["model"] = str(row["model"])
    if (reasoning := count_field(row.get("reasoning_output_tokens"))) is not None:
        rec["reasoning_tokens"] = reasoning
    tools = []
    for tool in row.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        entry: dict[str, Any] = {"name": str(tool.get("tool_name") or "tool")}
        start, end = _time(tool.get("emitted_at"), tz), _time(tool.get("result_at"), tz)
        wall = tool.get("tool_wall_latency_ms")
        if start is not None and end is None and isinstance(wall, (int, float)) and wall >= 0:
            end = start + wall / 1000
        if start is not None:
            entry["t_start"] = start
            if end is not None:
                entry["t_end"] = max(end, start)
                entry["status"] = "error" if tool.get("is_error") else "ok"
        internal = tool.get("tool_internal_latency_ms")
        if isinstance(internal, (int, float)) and internal >= 0:
            entry["internal_latency_s"] = internal / 1000
        tools.append(entry)
    if tools:
        rec["tool_calls"] = tools
    rec.update({"round_index": row.get("round_index"),
                "first_input": row.get("first_input_event_type") or min(stamps)[1], "source_format": NAME,
                "import_source": f"{path}:{lineno}"})
    return rec


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for one TraceLab round file (module docstring)."""
    tz = resolve_timezone(timezone)
    records: list[dict] = []
    for lineno, row in iter_json_lines(path, on_error):
        if not isinstance(row, dict):
            report(on_error, ImportFormatError(str(path), lineno, "not a JSON object"))
            continue
        try:
            records.append(_row(row, path, lineno, workflow_type, tz))
        except ImportFormatError as err:
            report(on_error, err)
    by_session: dict[tuple[str, str], list[dict]] = {}
    for rec in records:
        by_session.setdefault((rec["workflow_id"], rec["agent_id"]), []).append(rec)
    for rows in by_session.values():
        rows.sort(key=lambda r: (r["t_arrival"], r["request_id"]))
        for prev, nxt in zip(rows, rows[1:]):
            if nxt.get("first_input") == "user_message":
                prev["wait_after"] = "human"
    for rec in records:
        rec.pop("first_input", None)
        yield rec
