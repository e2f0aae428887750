"""OpenTelemetry GenAI spans (OTLP JSON) -> flat records.

Input: what the OpenTelemetry *file exporter* writes — JSON Lines, each line one ``TracesData``
object ``{"resourceSpans": [{"resource": {"attributes": [...]}, "scopeSpans": [{"scope": {...},
"spans": [...]}]}]}`` — or one such object pretty-printed as a whole file (an OTLP/HTTP JSON
request body). Shapes follow the OTLP JSON encoding (opentelemetry-proto
``docs/specification.md#json-protobuf-encoding``: hex ``traceId``/``spanId``, int64 as decimal
strings, ``AnyValue`` as ``{"stringValue"|"intValue"|"doubleValue"|"boolValue"|"arrayValue"|
"kvlistValue"|"bytesValue": ...}``) and the example in opentelemetry-specification
``specification/protocol/file-exporter.md``.

Mapping (OpenTelemetry semantic conventions for GenAI, ``docs/gen-ai/gen-ai-spans.md`` and
``gen-ai-agent-spans.md`` of open-telemetry/semantic-conventions):

==============================================  ===============================================
span / attribute                                flat record field
==============================================  ===============================================
``gen_ai.operation.name`` = chat /              one LLM call
text_completion / generate_content
span start / end                                ``t_arrival`` / ``t_finish``
``gen_ai.usage.input_tokens`` / ``output_tokens``  ``input_tokens`` / ``output_tokens`` (the
(older ``prompt_tokens`` / ``completion_tokens``)   deprecated names are read too; absent = left out)
``gen_ai.usage.cache_read.input_tokens``        ``cached_tokens``
``gen_ai.response.model`` or ``request.model``  ``model``
``gen_ai.agent.name`` (on the span or the       ``agent_id`` (else ``gen_ai.agent.id``, else
nearest ``invoke_agent`` ancestor)              ``"default"``)
``gen_ai.conversation.id`` (span or ancestor)   ``workflow_id`` (else the trace id)
``gen_ai.workflow.name`` (span or ancestor)     ``workflow_type_id`` (else resource
                                                ``service.name``, else ``"otel"``)
span status code 2 (ERROR) or ``error.type``    ``status = "error"``
``gen_ai.operation.name`` = execute_tool        an entry of ``tool_calls`` of the latest call of
(``gen_ai.tool.name``, start, end)              the same workflow (same agent when known) that
                                                finished before the tool started
``gen_ai.input.messages`` / ``output.messages`` ``messages`` (OpenAI chat shape) / ``response_text``
==============================================  ===============================================

Spans of other operations (HTTP, database, ``embeddings``...) only serve as ancestors. Spans are
grouped per file, so keep the spans of one conversation in one file (the file exporter does).
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from profiler.importers._common import (
    ErrorHandler,
    ImportFormatError,
    iter_json_lines,
    load_json_document,
    open_text,
    report,
)

NAME = "otel"
SUMMARY = "OpenTelemetry GenAI spans exported as OTLP JSON (file exporter JSON Lines or one document)"
FILE_PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz")

CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
TOOL_OPERATION = "execute_tool"
STATUS_CODE_ERROR = 2  # opentelemetry-proto trace.proto Status.StatusCode.STATUS_CODE_ERROR


@dataclass
class Span:
    """One OTLP span with its attributes decoded to Python values."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int | None
    end_ns: int | None
    attrs: dict[str, Any]
    status_code: int
    resource: dict[str, Any]
    line: int | None
    parent: "Span | None" = field(default=None, repr=False)

    @property
    def operation(self) -> str | None:
        return self.attrs.get("gen_ai.operation.name")

    @property
    def status(self) -> str:
        """``error`` for status code ERROR or an ``error.type`` attribute, else ``ok``."""
        return "error" if self.status_code == STATUS_CODE_ERROR or self.attrs.get("error.type") else "ok"

    def lookup(self, *keys: str) -> Any:
        """First of ``keys`` set on this span or, failing that, on its nearest ancestor."""
        span, seen = self, set()
        while span is not None and id(span) not in seen:
            seen.add(id(span))
            for key in keys:
                value = span.attrs.get(key)
                if value not in (None, ""):
                    return value
            span = span.parent
        return None


def any_value(v: Any) -> Any:
    """Decode an OTLP JSON ``AnyValue`` (``{"stringValue": "x"}`` -> ``"x"``, int64 strings -> int)."""
    if not isinstance(v, dict):
        return v
    if "stringValue" in v:
        return v["stringValue"]
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "arrayValue" in v:
        return [any_value(x) for x in (v["arrayValue"] or {}).get("values", [])]
    if "kvlistValue" in v:
        return {kv["key"]: any_value(kv.get("value")) for kv in (v["kvlistValue"] or {}).get("values", [])}
    if "bytesValue" in v:
        return base64.b64decode(v["bytesValue"])
    return None


def attributes(kvs: Any) -> dict[str, Any]:
    """OTLP ``[{"key": k, "value": AnyValue}, ...]`` -> ``{k: value}``."""
    return {kv["key"]: any_value(kv.get("value")) for kv in kvs or []}


def _nanos(value: Any) -> int | None:
    if value in (None, "", 0, "0"):
        return None
    return int(value)


def _spans_of(obj: Any, path: Path, line: int | None) -> Iterator[Span]:
    if not isinstance(obj, dict) or not isinstance(obj.get("resourceSpans"), list):
        raise ImportFormatError(str(path), line, "not an OTLP JSON traces object: expected "
                                "{\"resourceSpans\": [...]}", "resourceSpans")
    for rs in obj["resourceSpans"]:
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        # "instrumentationLibrarySpans" is the pre-1.0 name of "scopeSpans".
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            for s in ss.get("spans") or []:
                sid = s.get("spanId") or ""
                try:
                    yield Span(
                        trace_id=s.get("traceId") or "", span_id=sid, parent_id=s.get("parentSpanId") or None,
                        name=s.get("name", ""), start_ns=_nanos(s.get("startTimeUnixNano")),
                        end_ns=_nanos(s.get("endTimeUnixNano")), attrs=attributes(s.get("attributes")),
                        status_code=int((s.get("status") or {}).get("code") or 0), resource=resource, line=line)
                except (KeyError, TypeError, ValueError) as exc:
                    raise ImportFormatError(str(path), line, f"span {sid or '?'}: malformed value ({exc})")


def read_spans(path: Path, on_error: ErrorHandler | None = None) -> list[Span]:
    """Every span of an OTLP JSON file (JSON Lines of ``TracesData`` or one document)."""
    spans: list[Span] = []
    with open_text(path) as fh:
        first = ""
        for first in fh:
            if first.strip():
                break
    try:
        json.loads(first)
    except json.JSONDecodeError:
        # not one object per line: a pretty-printed document, or JSON Lines whose first line is bad
        try:
            document = load_json_document(path)
        except ImportFormatError:
            document = None
        if document is not None:
            try:
                spans.extend(_spans_of(document, path, None))
            except ImportFormatError as err:
                report(on_error, err)
            return spans
    for lineno, obj in iter_json_lines(path, on_error):
        try:
            spans.extend(_spans_of(obj, path, lineno))
        except ImportFormatError as err:
            report(on_error, err)
    return spans


def _link_parents(spans: list[Span]) -> None:
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    for s in spans:
        s.parent = by_id.get((s.trace_id, s.parent_id)) if s.parent_id else None


def _int_attr(span: Span, path: Path, *keys: str) -> int | None:
    for key in keys:
        value = span.attrs.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or value != int(value):
            raise ImportFormatError(str(path), span.line, f"span {span.span_id}: {value!r} is not a "
                                    "non-negative integer", key)
        return int(value)
    return None


def _decode_messages(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return None
    return value


def _text_of(parts: Any) -> str:
    return "\n".join(str(p.get("content", "")) for p in parts or []
                     if isinstance(p, dict) and p.get("type") == "text")


def to_chat_messages(value: Any) -> list[dict] | None:
    """GenAI semconv messages (``[{"role", "parts": [{"type": "text"|"tool_call"|
    "tool_call_response", ...}]}]``) -> OpenAI chat messages."""
    msgs = _decode_messages(value)
    if not isinstance(msgs, list):
        return None
    out: list[dict] = []
    for m in msgs:
        if not isinstance(m, dict):
            continue
        parts = m.get("parts") or []
        if "parts" not in m and "content" in m:  # already OpenAI-shaped
            out.append({"role": m.get("role", "user"), "content": m["content"]})
            continue
        responses = [p for p in parts if isinstance(p, dict) and p.get("type") == "tool_call_response"]
        if responses:
            out.extend({"role": "tool", "tool_call_id": str(p.get("id", "")).strip(),
                        "content": p.get("result") if isinstance(p.get("result"), str)
                        else json.dumps(p.get("result"))} for p in responses)
            continue
        msg: dict[str, Any] = {"role": m.get("role", "user"), "content": _text_of(parts)}
        calls = [p for p in parts if isinstance(p, dict) and p.get("type") == "tool_call"]
        if calls:
            msg["tool_calls"] = [{"id": p.get("id"), "type": "function",
                                  "function": {"name": p.get("name"),
                                               "arguments": json.dumps(p.get("arguments") or {})}}
                                 for p in calls]
        out.append(msg)
    return out


def _workflow_of(span: Span) -> str:
    return str(span.lookup("gen_ai.conversation.id") or span.trace_id)


def _agent_of(span: Span) -> str | None:
    value = span.lookup("gen_ai.agent.name", "gen_ai.agent.id")
    return str(value) if value is not None else None


def _require_times(span: Span, path: Path, what: str) -> None:
    """Raise when the span lacks its start or end time (naming the missing one)."""
    if span.start_ns is None or span.end_ns is None:
        raise ImportFormatError(str(path), span.line, f"{what} {span.span_id}: missing start or end time",
                                "startTimeUnixNano" if span.start_ns is None else "endTimeUnixNano")


def _call_record(span: Span, path: Path, workflow_type: str | None, with_text: bool) -> dict:
    _require_times(span, path, "span")
    rec: dict[str, Any] = {
        "request_id": f"{span.trace_id}-{span.span_id}",
        "workflow_type_id": str(workflow_type or span.lookup("gen_ai.workflow.name")
                                or span.resource.get("service.name") or NAME),
        "workflow_id": _workflow_of(span),
        "agent_id": _agent_of(span) or "default",
        "t_arrival": span.start_ns / 1e9,
        "t_finish": span.end_ns / 1e9,
    }
    tokens = {
        "input_tokens": _int_attr(span, path, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens"),
        "output_tokens": _int_attr(span, path, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens"),
        "cached_tokens": _int_attr(span, path, "gen_ai.usage.cache_read.input_tokens"),
    }
    rec.update({k: v for k, v in tokens.items() if v is not None})
    model = span.attrs.get("gen_ai.response.model") or span.attrs.get("gen_ai.request.model")
    if model:
        rec["model"] = str(model)
    rec["status"] = span.status
    if with_text:
        messages = to_chat_messages(span.attrs.get("gen_ai.input.messages"))
        if messages:
            rec["messages"] = messages
        output = _decode_messages(span.attrs.get("gen_ai.output.messages"))
        if isinstance(output, list) and output and isinstance(output[0], dict):
            rec["response_text"] = _text_of(output[0].get("parts"))
    rec.update({"source_format": NAME, "otel_trace_id": span.trace_id, "otel_span_id": span.span_id,
                "import_source": f"{path}:{span.line}" if span.line else str(path)})
    return rec


def _tool_entry(span: Span) -> dict:
    return {"name": str(span.attrs.get("gen_ai.tool.name") or span.name),
            "t_start": span.start_ns / 1e9, "t_end": span.end_ns / 1e9,
            "status": span.status}


def _attach_tools(calls: list[tuple[Span, dict]], tools: list[Span]) -> int:
    """Give each tool span to the latest call of its workflow (same agent when the tool's agent is
    known and made a call) that finished before the tool started. Returns the orphan count."""
    by_workflow: dict[str, list[tuple[Span, dict]]] = {}
    for span, rec in calls:
        by_workflow.setdefault(rec["workflow_id"], []).append((span, rec))
    orphans = 0
    for tool in sorted(tools, key=lambda s: s.start_ns):
        candidates = [(s, r) for s, r in by_workflow.get(_workflow_of(tool), []) if s.end_ns <= tool.start_ns]
        agent = _agent_of(tool)
        same_agent = [(s, r) for s, r in candidates if r["agent_id"] == agent]
        pool = same_agent or candidates
        if not pool:
            orphans += 1
            continue
        _, rec = max(pool, key=lambda sr: (sr[0].end_ns, sr[0].start_ns))
        rec.setdefault("tool_calls", []).append(_tool_entry(tool))
    return orphans


def read_file(path: Path, *, workflow_type: str | None = None, with_text: bool = True,
              on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for the LLM-call spans of one OTLP JSON file, ordered by start time."""
    spans = read_spans(path, on_error)
    _link_parents(spans)
    calls: list[tuple[Span, dict]] = []
    tools: list[Span] = []
    for span in spans:
        op = span.operation
        try:
            if op in CALL_OPERATIONS:
                calls.append((span, _call_record(span, path, workflow_type, with_text)))
            elif op == TOOL_OPERATION:
                _require_times(span, path, "tool span")
                tools.append(span)
        except ImportFormatError as err:
            report(on_error, err)
    _attach_tools(calls, tools)
    for _, rec in sorted(calls, key=lambda sr: (sr[0].start_ns, sr[1]["request_id"])):
        yield rec
