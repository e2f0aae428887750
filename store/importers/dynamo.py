"""NVIDIA Dynamo request traces (``dynamo.request.trace.v1``) -> flat records.

Dynamo's frontend writes one JSON row per finished request when ``DYN_REQUEST_TRACE=1``
(``/tmp/dynamo-request-trace.NNNNNN.jsonl.gz`` by default; ai-dynamo/dynamo, reference page
"Request Replay Tracing"). Rows of ``event_type = "request_end"`` carry ``agent_context``
(session ids) and ``request`` (timings, token counts, tool calls); tool rows (``tool_start`` /
``tool_end`` / ``tool_error``) may follow, and rows may be wrapped as ``{"event": {...}}``.
Prompts and responses are never in these traces.

Times become ``t_arrival`` / ``t_first_token`` / ``t_finish``; the workflow is the root of the
parent-session chain (the text before the last ``:`` of ``run:role`` ids), the agent its role;
a ``tool_end`` row becomes a ``tool_calls`` entry of the request that named its id. A
context-free row is its own one-call workflow, and the report warns: without session identity
the calls of one agent run cannot be told apart. The row layout and the field-by-field mapping:
docs/importers.md ("Dynamo request traces: fields").
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    iter_json_lines,
    report,
    warn,
)

NAME = "dynamo"
SUMMARY = "NVIDIA Dynamo request traces (dynamo.request.trace.v1 rows, JSONL or JSONL.gz)"
FILE_PATTERNS = ("*.jsonl", "*.jsonl.gz")
SCHEMA = "dynamo.request.trace.v1"
DEFAULT_WORKFLOW_TYPE = "dynamo"
TOOL_EVENTS = ("tool_end", "tool_error")


def _ms(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) / 1000.0


def _session_of(row: dict) -> str | None:
    ctx = row.get("agent_context") if isinstance(row.get("agent_context"), dict) else {}
    sid = ctx.get("trajectory_id") or ctx.get("session_id") or row.get("session_id")
    return str(sid) if sid else None


def _parent_of(ctx: dict) -> str | None:
    parent = ctx.get("parent_trajectory_id") or ctx.get("parent_session_id")
    return str(parent) if parent else None


def read_file(path: Path, *, workflow_type: str | None = None, on_error: ErrorHandler | None = None,
              **_: Any) -> Iterator[dict]:
    """Flat records for the ``request_end`` rows of one trace file, tools attached."""
    requests: list[tuple[int, dict]] = []
    tools: list[tuple[int, dict]] = []
    other_schema = 0
    for line, row in iter_json_lines(path, on_error):
        if isinstance(row, dict) and isinstance(row.get("event"), dict):
            row = row["event"]
        if not isinstance(row, dict) or row.get("schema") != SCHEMA:
            other_schema += 1
            continue
        if row.get("event_type") == "request_end":
            requests.append((line, row))
        elif row.get("event_type") in TOOL_EVENTS:
            tools.append((line, row))
    if other_schema and not requests:
        report(on_error, ImportFormatError(str(path), None, f"{other_schema} rows but none has schema "
                                           f"{SCHEMA!r} with event_type request_end", "schema"))
        return
    # Session tree: child -> parent, to find each session's root (the workflow).
    parents: dict[str, str] = {}
    for _, row in requests:
        ctx = row.get("agent_context") if isinstance(row.get("agent_context"), dict) else {}
        if (sid := _session_of(row)) and (parent := _parent_of(ctx)):
            parents[sid] = parent

    def root(sid: str) -> str:
        seen = {sid}
        while sid in parents and parents[sid] not in seen:
            sid = parents[sid]
            seen.add(sid)
        return sid

    records: list[dict] = []
    by_call_id: dict[str, dict] = {}
    by_session: dict[str, list[dict]] = {}
    context_free = 0
    for line, row in requests:
        req = row.get("request") if isinstance(row.get("request"), dict) else None
        if req is None or not req.get("request_id"):
            report(on_error, ImportFormatError(str(path), line, "request_end row without request.request_id",
                                               "request.request_id"))
            continue
        replay = req.get("replay") if isinstance(req.get("replay"), dict) else {}
        n_in = count_field(req.get("input_tokens"))
        n_in = n_in if n_in is not None else count_field(replay.get("input_length"))
        n_out = count_field(req.get("output_tokens"))
        received, total = _ms(req.get("request_received_ms")), _ms(req.get("total_time_ms"))
        event_t = _ms(row.get("event_time_unix_ms"))
        t_finish = received + total if received is not None and total is not None else event_t
        t_arrival = received if received is not None else (event_t - total if event_t is not None
                                                             and total is not None else None)
        if n_in is None or n_out is None:
            report(on_error, ImportFormatError(str(path), line, "no input/output token count",
                                               "request.input_tokens" if n_in is None else "request.output_tokens"))
            continue
        if t_arrival is None or t_finish is None:
            report(on_error, ImportFormatError(str(path), line, "no request_received_ms (nor event time and "
                                               "total_time_ms): the call cannot be placed in time",
                                               "request.request_received_ms"))
            continue
        ctx = row.get("agent_context") if isinstance(row.get("agent_context"), dict) else None
        sid = _session_of(row)
        if ctx is None or sid is None:
            context_free += 1
            workflow_id, agent = str(req["request_id"]), "main"
        else:
            top = root(sid)  # "research-run-42:planner" -> workflow "research-run-42"
            workflow_id = str(ctx.get("workflow_id") or (top.rsplit(":", 1)[0] if ":" in top else top))
            agent = ctx.get("agent_id") or ctx.get("agent_name")
            if not agent:
                agent = sid.rsplit(":", 1)[1] if ":" in sid else ("subagent" if _parent_of(ctx) else "main")
        rec: dict[str, Any] = {
            "request_id": str(req["request_id"]),
            "workflow_type_id": workflow_type or str((ctx or {}).get("workflow_type_id") or DEFAULT_WORKFLOW_TYPE),
            "workflow_id": workflow_id, "agent_id": str(agent),
            "t_arrival": t_arrival, "t_finish": max(t_finish, t_arrival),
            "input_tokens": n_in, "output_tokens": n_out,
        }
        if (ttft := _ms(req.get("ttft_ms"))) is not None:
            rec["t_first_token"] = t_arrival + ttft
        if (cached := count_field(req.get("cached_tokens"))) is not None:
            rec["cached_tokens"] = cached
        if req.get("model"):
            rec["model"] = str(req["model"])
        if sid:
            rec["dynamo_session_id"] = sid
        finish = req.get("finish_reason_metadata") if isinstance(req.get("finish_reason_metadata"), dict) else {}
        for call in finish.get("tool_calls") or []:
            if isinstance(call, dict) and call.get("id"):
                by_call_id[str(call["id"])] = rec
        if finish.get("tool_calls"):
            rec["requested_tools"] = [str(c.get("name")) for c in finish["tool_calls"] if isinstance(c, dict)]
        rec.update({"source_format": NAME, "import_source": f"{path}:{line}"})
        records.append(rec)
        if sid:
            by_session.setdefault(sid, []).append(rec)
    if context_free:
        warn(on_error, path, f"{context_free} rows have no agent_context (no X-Dynamo-Session-ID header): each "
             "is imported as its own one-call workflow", field="agent_context")
    for line, row in tools:
        tool = row.get("tool") if isinstance(row.get("tool"), dict) else {}
        start, end = _ms(tool.get("started_at_unix_ms")), _ms(tool.get("ended_at_unix_ms"))
        end = end if end is not None else _ms(row.get("event_time_unix_ms"))
        if start is None and end is not None and isinstance(tool.get("duration_ms"), (int, float)):
            start = end - tool["duration_ms"] / 1000.0
        if start is None or end is None:
            report(on_error, ImportFormatError(str(path), line, "tool row without start/end time",
                                               "tool.started_at_unix_ms"))
            continue
        owner = by_call_id.get(str(tool.get("tool_call_id")))
        if owner is None:
            sid = _session_of(row)
            before = [r for r in by_session.get(sid or "", []) if r["t_finish"] <= start]
            owner = max(before, key=lambda r: r["t_finish"]) if before else None
        if owner is None:
            report(on_error, ImportFormatError(str(path), line, "tool row matches no request (tool_call_id "
                                               "or session)", "tool.tool_call_id"))
            continue
        failed = row.get("event_type") == "tool_error" or str(tool.get("status", "")).lower() in ("failed", "error")
        owner.setdefault("tool_calls", []).append({
            "name": str(tool.get("tool_class") or tool.get("name") or "tool"), "t_start": start,
            "t_end": max(end, start), "status": "error" if failed else "ok"})
    yield from sorted(records, key=lambda r: (r["t_arrival"], r["request_id"]))
