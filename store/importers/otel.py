"""OpenTelemetry GenAI and OpenInference spans -> flat records.

Spans are read by :mod:`store.importers.otel_spans` from OTLP JSON (file exporter, OTLP/HTTP
bodies), the OTel SDK's own JSON (``ReadableSpan.to_json()`` / ``ConsoleSpanExporter``, also
``{"spans": [...]}`` and nanosecond/decimal variants) and Arize Phoenix span rows. Two attribute
conventions say which spans are LLM calls, agents and tools:

* OpenTelemetry **GenAI** semantic conventions (open-telemetry/semantic-conventions
  ``docs/gen-ai/gen-ai-spans.md``, ``gen-ai-agent-spans.md``): ``gen_ai.operation.name`` =
  ``chat`` / ``text_completion`` / ``generate_content`` (calls), ``invoke_agent`` /
  ``create_agent`` (agents), ``execute_tool`` (tools). Frameworks that name spans by operation
  (Google ADK: ``call_llm``, ``invoke_agent <name>``, ``execute_tool <name>``) are read by span
  name when the attribute is missing.
* **OpenInference** (Arize-ai/openinference ``spec/semantic_conventions.md``, what Phoenix
  shows): ``openinference.span.kind`` = ``LLM`` (call), ``AGENT``, ``TOOL``.

A call span becomes one flat record (start / end → ``t_arrival`` / ``t_finish``; usage
attributes → token counts, absent = left out, never guessed; the agent from the span or its
nearest agent ancestor; the conversation / session id → ``workflow_id``, else the trace id); a
tool span becomes a ``tool_calls`` entry of the latest call of its workflow that finished before
it. The attribute → field table: docs/importers.md, "OpenTelemetry GenAI spans".

Spans of other operations (HTTP, database, ``embeddings``, CHAIN...) only serve as ancestors.
Spans are grouped per file, so keep the spans of one conversation in one file.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import ErrorHandler, ImportFormatError, report
from store.importers.otel_spans import Span, any_value, attributes, link_parents, read_spans

NAME = "otel"
ALIASES = ("openinference", "phoenix", "otlp")
SUMMARY = ("OpenTelemetry GenAI / OpenInference spans: OTLP JSON, OTel SDK JSON (to_json, "
           "ConsoleSpanExporter), Phoenix span rows")
FILE_PATTERNS = ("*.jsonl", "*.json", "*.jsonl.gz", "*.json.gz")

CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content", "call_llm"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "create_agent"})
TOOL_OPERATION = "execute_tool"
STATUS_CODE_ERROR = 2

__all__ = ["NAME", "SUMMARY", "FILE_PATTERNS", "read_file", "kind_of", "any_value", "attributes",
           "to_chat_messages", "Span"]


def kind_of(span: Span) -> str | None:
    """``call``, ``agent``, ``tool`` or None: from ``gen_ai.operation.name``, OpenInference
    ``openinference.span.kind``, or (neither set) the first word of the span name."""
    op = span.attrs.get("gen_ai.operation.name")
    oi = str(span.attrs.get("openinference.span.kind") or "").upper()
    if op is None and not oi:
        op = (span.name.split() or [""])[0]
    if op in CALL_OPERATIONS or oi == "LLM":
        return "call"
    if op in AGENT_OPERATIONS or oi == "AGENT":
        return "agent"
    if op == TOOL_OPERATION or oi == "TOOL":
        return "tool"
    return None


def _status(span: Span) -> str:
    return "error" if span.status_code == STATUS_CODE_ERROR or span.attrs.get("error.type") else "ok"


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


def _openinference_messages(attrs: dict[str, Any], prefix: str) -> list[dict]:
    """OpenInference flattened messages (``llm.input_messages.0.message.role`` ...) -> chat list."""
    out: dict[int, dict] = {}
    for key, value in attrs.items():
        if not key.startswith(prefix):
            continue
        head, _, tail = key[len(prefix):].partition(".message.")
        if head.isdigit() and tail in ("role", "content"):
            out.setdefault(int(head), {})[tail] = value
    return [{"role": m.get("role", "user"), "content": m.get("content", "")} for _, m in sorted(out.items())]


#: Attributes that name the agent a span runs in, by framework: GenAI semconv, OpenInference,
#: pydantic-ai / Logfire (``agent_name``), OpenInference graph spans (``graph.node.id``).
AGENT_ATTRIBUTES = ("gen_ai.agent.name", "agent.name", "gen_ai.agent.id", "agent_name", "graph.node.name",
                    "graph.node.id")
#: Keys of an OpenInference ``metadata`` attribute (a JSON string) that name the graph node an LLM
#: call ran in: LangGraph writes ``langgraph_node`` on every span of a node's run.
METADATA_AGENT_KEYS = ("langgraph_node", "agent_name", "agent")
#: OpenLLMetry (Traceloop) span kinds whose ``traceloop.entity.name`` is an agent.
TRACELOOP_AGENT_KINDS = frozenset({"agent"})


def _metadata(span: Span) -> dict:
    value = span.attrs.get("metadata")
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def _agent_name(span: Span) -> str | None:
    """The agent named on this span itself (see :data:`AGENT_ATTRIBUTES`), or None."""
    for key in AGENT_ATTRIBUTES:
        if span.attrs.get(key) not in (None, ""):
            return str(span.attrs[key])
    meta = _metadata(span)
    for key in METADATA_AGENT_KEYS:
        if isinstance(meta.get(key), str) and meta[key] and not meta[key].startswith("__"):
            return meta[key]
    if str(span.attrs.get("traceloop.span.kind") or "") in TRACELOOP_AGENT_KINDS and span.attrs.get("traceloop.entity.name"):
        return str(span.attrs["traceloop.entity.name"])
    if kind_of(span) == "agent":  # "invoke_agent planner" -> planner; an OpenInference AGENT span's name
        words = span.name.split()
        return words[-1] if words and words[0] in AGENT_OPERATIONS and len(words) > 1 else (span.name or None)
    return None


def _agent_of(span: Span) -> str | None:
    for s in (span, *span.ancestors()):
        if (name := _agent_name(s)) is not None:
            return name
    return None


#: OpenLLMetry span kinds whose ``traceloop.entity.name`` is a step of the workflow (a stage).
TRACELOOP_STAGE_KINDS = frozenset({"task"})


def _stage_name(span: Span) -> str | None:
    """The stage named on this span itself: a LangGraph node, an OpenLLMetry task; else None."""
    node = _metadata(span).get("langgraph_node")
    if isinstance(node, str) and node and not node.startswith("__"):
        return node
    if str(span.attrs.get("traceloop.span.kind") or "") in TRACELOOP_STAGE_KINDS and span.attrs.get("traceloop.entity.name"):
        return str(span.attrs["traceloop.entity.name"])
    return None


def _stage_of(span: Span) -> str | None:
    for s in (span, *span.ancestors()):
        if (name := _stage_name(s)) is not None:
            return name
    return None


def _workflow_of(span: Span) -> str:
    return str(span.lookup("gen_ai.conversation.id", "session.id", "gcp.vertex.agent.session_id") or span.trace_id)


def _require_times(span: Span, path: Path, what: str) -> None:
    """Raise when the span lacks its start or end time (naming the missing one)."""
    if span.start_ns is None or span.end_ns is None:
        raise ImportFormatError(str(path), span.line, f"{what} {span.span_id}: missing start or end time",
                                "start_time" if span.start_ns is None else "end_time")


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
    if (stage := _stage_of(span)) is not None:
        rec["stage"] = stage
    tokens = {
        "input_tokens": _int_attr(span, path, "gen_ai.usage.input_tokens", "gen_ai.usage.prompt_tokens",
                                  "llm.token_count.prompt"),
        "output_tokens": _int_attr(span, path, "gen_ai.usage.output_tokens", "gen_ai.usage.completion_tokens",
                                   "llm.token_count.completion"),
        "cached_tokens": _int_attr(span, path, "gen_ai.usage.cache_read.input_tokens",
                                   "llm.token_count.prompt_details.cache_read"),
    }
    rec.update({k: v for k, v in tokens.items() if v is not None})
    model = (span.attrs.get("gen_ai.response.model") or span.attrs.get("gen_ai.request.model")
             or span.attrs.get("llm.model_name"))
    if model:
        rec["model"] = str(model)
    rec["status"] = _status(span)
    if with_text:
        messages = (to_chat_messages(span.attrs.get("gen_ai.input.messages"))
                    or _openinference_messages(span.attrs, "llm.input_messages."))
        if messages:
            rec["messages"] = messages
        output = _decode_messages(span.attrs.get("gen_ai.output.messages"))
        if isinstance(output, list) and output and isinstance(output[0], dict):
            rec["response_text"] = _text_of(output[0].get("parts"))
        elif (out := _openinference_messages(span.attrs, "llm.output_messages.")):
            rec["response_text"] = str(out[0]["content"])
    rec.update({"source_format": NAME, "otel_trace_id": span.trace_id, "otel_span_id": span.span_id,
                "import_source": f"{path}:{span.line}" if span.line else str(path)})
    return rec


def _tool_name(span: Span) -> str:
    name = span.attrs.get("gen_ai.tool.name") or span.attrs.get("tool.name")
    if name:
        return str(name)
    words = span.name.split()
    return words[-1] if len(words) > 1 and words[0] == TOOL_OPERATION else span.name


def _tool_entry(span: Span) -> dict:
    return {"name": _tool_name(span), "t_start": span.start_ns / 1e9, "t_end": span.end_ns / 1e9,
            "status": _status(span)}


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
    """Flat records for the LLM-call spans of one file, ordered by start time."""
    spans = read_spans(path, on_error)
    link_parents(spans)
    calls: list[tuple[Span, dict]] = []
    tools: list[Span] = []
    for span in spans:
        kind = kind_of(span)
        try:
            if kind == "call":
                calls.append((span, _call_record(span, path, workflow_type, with_text)))
            elif kind == "tool":
                _require_times(span, path, "tool span")
                tools.append(span)
        except ImportFormatError as err:
            report(on_error, err)
    if spans and not any(kind_of(s) == "call" for s in spans):
        ops = sorted({str(s.attrs.get("gen_ai.operation.name") or s.attrs.get("openinference.span.kind")
                          or s.name) for s in spans})[:6]
        report(on_error, ImportFormatError(str(path), None, f"{len(spans)} spans but none is an LLM call "
                                           "(gen_ai.operation.name chat/text_completion/generate_content/call_llm "
                                           f"or openinference.span.kind LLM); found: {', '.join(ops)}"))
    _attach_tools(calls, tools)
    for _, rec in sorted(calls, key=lambda sr: (sr[0].start_ns, sr[1]["request_id"])):
        yield rec
