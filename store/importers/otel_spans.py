"""Reading spans from the JSON shapes OpenTelemetry tools write, into one :class:`Span` type.

Three shapes are recognised, per JSON value, so one file may mix them:

**OTLP JSON** (opentelemetry-proto ``docs/specification.md#json-protobuf-encoding``; the file
exporter of ``specification/protocol/file-exporter.md``): ``{"resourceSpans": [{"resource":
{"attributes": [{"key", "value": AnyValue}]}, "scopeSpans": [{"spans": [{"traceId", "spanId",
"parentSpanId", "name", "startTimeUnixNano": "1760...", "endTimeUnixNano", "attributes",
"status": {"code": 2}}]}]}]}`` — hex ids, int64 as decimal strings, ``AnyValue`` wrappers.

**OTel SDK JSON** (opentelemetry-python ``opentelemetry/sdk/trace/__init__.py``:
``ReadableSpan.to_json()``, what ``ConsoleSpanExporter`` prints, one pretty-printed object after
another): ``{"name", "context": {"trace_id": "0x5b8e...", "span_id": "0x...", "trace_state"},
"kind": "SpanKind.CLIENT", "parent_id": "0x..." | null, "start_time": "2025-...Z", "end_time",
"status": {"status_code": "ERROR"}, "attributes": {plain}, "events", "links", "resource":
{"attributes": {plain}}}``. Agent frameworks that write their own JSON from the SDK span keep
this shape but put nanosecond integers in ``start_time``/``end_time`` and decimal integer ids;
both are read. Files may hold ``{"spans": [...]}``, a JSON array, JSON Lines or concatenated
objects.

**Arize Phoenix span rows** (``px.Client().get_spans_dataframe()`` written as JSON Lines):
``{"name", "span_kind", "parent_id", "start_time", "end_time", "status_code", "context.trace_id",
"context.span_id", "attributes.llm.token_count.prompt": 812, ...}`` — dotted column names.

Ids are normalised to lower-case hex without ``0x`` (a decimal id is converted), so the same span
has the same id in every shape; times become nanoseconds since the epoch.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import ErrorHandler, ImportFormatError, iter_json_values, open_text, report

STATUS_CODE_ERROR = 2  # opentelemetry-proto trace.proto Status.StatusCode.STATUS_CODE_ERROR


@dataclass
class Span:
    """One span with its attributes decoded to plain Python values."""

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

    def ancestors(self) -> Iterator["Span"]:
        span, seen = self.parent, {id(self)}
        while span is not None and id(span) not in seen:
            seen.add(id(span))
            yield span
            span = span.parent


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
    """OTLP ``[{"key": k, "value": AnyValue}, ...]`` (or an already plain dict) -> ``{k: value}``."""
    if isinstance(kvs, dict):
        return dict(kvs)
    return {kv["key"]: any_value(kv.get("value")) for kv in kvs or []}


def normalise_id(value: Any, width: int) -> str | None:
    """A trace/span id as lower-case hex of ``width`` digits: ``"0x5b8e..."``, ``"5b8e..."``,
    a decimal int or a decimal digit string longer than the hex width all map to the same text."""
    if value in (None, "", 0, "0", "0x0"):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not an id")
    if isinstance(value, int):
        return format(value, f"0{width}x")
    text = str(value).strip().lower()
    if text.startswith("0x"):
        return text[2:].rjust(width, "0")
    if text.isdigit() and len(text) > width:  # decimal: longer than any hex id of this width
        return format(int(text), f"0{width}x")
    int(text, 16)  # raises ValueError when not hex
    return text


def _epoch_number_to_nanos(x: float) -> int:
    """An epoch number in s, ms, µs or ns (told apart by magnitude: today is ~1.7e9 s) -> ns."""
    for limit, scale in ((1e11, 1_000_000_000), (1e14, 1_000_000), (1e17, 1_000)):
        if abs(x) < limit:
            return int(round(x * scale))
    return int(x)


def to_nanos(value: Any) -> int | None:
    """Nanoseconds since the epoch from a number / digit string (ns as OTel writes them; s, ms
    and µs told apart by magnitude) or an ISO 8601 text."""
    if value in (None, "", 0, "0"):
        return None
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a time")
    if isinstance(value, int):
        return _epoch_number_to_nanos(value) if abs(value) < 1e17 else value
    if isinstance(value, float):
        return _epoch_number_to_nanos(value)
    text = str(value).strip()
    if text.isdigit():
        return _epoch_number_to_nanos(int(text)) if len(text) < 18 else int(text)
    t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:  # the SDK writes UTC; a naive time is read as UTC too
        t = t.replace(tzinfo=timezone.utc)
    seconds = int(t.replace(microsecond=0).timestamp())
    return seconds * 1_000_000_000 + t.microsecond * 1000


_STATUS_NAMES = {"UNSET": 0, "OK": 1, "ERROR": 2, "STATUS_CODE_UNSET": 0, "STATUS_CODE_OK": 1,
                 "STATUS_CODE_ERROR": 2}


def _status(value: Any) -> int:
    if isinstance(value, dict):
        value = value.get("code", value.get("status_code"))
    if value in (None, ""):
        return 0
    if isinstance(value, str) and not value.isdigit():
        return _STATUS_NAMES.get(value.upper().removeprefix("STATUSCODE."), 0)
    return int(value)


def _otlp_spans(obj: dict, line: int | None) -> Iterator[Span]:
    for rs in obj["resourceSpans"] or []:
        resource = attributes((rs.get("resource") or {}).get("attributes"))
        # "instrumentationLibrarySpans" is the pre-1.0 name of "scopeSpans".
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or []:
            for s in ss.get("spans") or []:
                yield Span(trace_id=normalise_id(s.get("traceId"), 32) or "",
                           span_id=normalise_id(s.get("spanId"), 16) or "",
                           parent_id=normalise_id(s.get("parentSpanId"), 16), name=s.get("name", ""),
                           start_ns=to_nanos(s.get("startTimeUnixNano")), end_ns=to_nanos(s.get("endTimeUnixNano")),
                           attrs=attributes(s.get("attributes")), status_code=_status(s.get("status")),
                           resource=resource, line=line)


def _sdk_span(s: dict, line: int | None) -> Span:
    ctx = s.get("context") or {}
    return Span(trace_id=normalise_id(ctx.get("trace_id"), 32) or "", span_id=normalise_id(ctx.get("span_id"), 16) or "",
                parent_id=normalise_id(s.get("parent_id"), 16), name=s.get("name", ""),
                start_ns=to_nanos(s.get("start_time")), end_ns=to_nanos(s.get("end_time")),
                attrs=attributes(s.get("attributes")), status_code=_status(s.get("status")),
                resource=attributes((s.get("resource") or {}).get("attributes")), line=line)


def _phoenix_span(s: dict, line: int | None) -> Span:
    attrs = {k[len("attributes."):]: v for k, v in s.items() if k.startswith("attributes.") and v is not None}
    if isinstance(s.get("attributes"), dict):
        attrs.update(s["attributes"])
    if s.get("span_kind") and "openinference.span.kind" not in attrs:
        attrs["openinference.span.kind"] = s["span_kind"]
    return Span(trace_id=normalise_id(s.get("context.trace_id"), 32) or "",
                span_id=normalise_id(s.get("context.span_id"), 16) or "",
                parent_id=normalise_id(s.get("parent_id"), 16), name=s.get("name", ""),
                start_ns=to_nanos(s.get("start_time")), end_ns=to_nanos(s.get("end_time")),
                attrs=attrs, status_code=_status(s.get("status_code")), resource={}, line=line)


def spans_of(obj: Any, path: Path, line: int | None) -> Iterator[Span]:
    """The spans in one JSON value of any recognised shape (see the module docstring)."""
    try:
        if isinstance(obj, list):
            for item in obj:
                yield from spans_of(item, path, line)
        elif isinstance(obj, dict) and isinstance(obj.get("resourceSpans"), list):
            yield from _otlp_spans(obj, line)
        elif isinstance(obj, dict) and isinstance(obj.get("spans"), list):
            yield from spans_of(obj["spans"], path, line)
        elif isinstance(obj, dict) and isinstance(obj.get("context"), dict) and "span_id" in obj["context"]:
            yield _sdk_span(obj, line)
        elif isinstance(obj, dict) and "context.span_id" in obj:
            yield _phoenix_span(obj, line)
        else:
            keys = ", ".join(list(obj)[:5]) if isinstance(obj, dict) else type(obj).__name__
            raise ImportFormatError(str(path), line, "not OpenTelemetry spans: expected OTLP JSON "
                                    "{\"resourceSpans\": [...]}, SDK spans {\"context\": {\"span_id\"...}} or "
                                    f"{{\"spans\": [...]}} (found {keys})", "resourceSpans")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ImportFormatError):
            raise
        raise ImportFormatError(str(path), line, f"malformed span value ({exc})") from None


def read_spans(path: Path, on_error: ErrorHandler | None = None) -> list[Span]:
    """Every span of a file: JSON Lines, one document, or concatenated pretty-printed objects.

    A file whose first line is a whole JSON value is read as JSON Lines (a broken line is
    reported and the next lines still read); otherwise as a stream of JSON values (one document
    or pretty-printed objects), and if even the first value cannot be parsed, as JSON Lines
    again, so one bad first line hides nothing. A value that is not spans is reported with its
    line."""
    with open_text(path) as fh:
        text = fh.read()
    first = next((ln for ln in text.split("\n") if ln.strip()), "")
    values: Iterator[tuple[int, Any]]
    try:
        json.loads(first)
        values = _json_lines(text, path, on_error)
    except json.JSONDecodeError:
        values = _json_stream(text, path, on_error)
    spans: list[Span] = []
    for line, obj in values:
        try:
            spans.extend(spans_of(obj, path, line))
        except ImportFormatError as err:
            report(on_error, err)
    return spans


def _json_stream(text: str, path: Path, on_error: ErrorHandler | None) -> Iterator[tuple[int, Any]]:
    got_one = False
    try:
        for item in iter_json_values(text):
            got_one = True
            yield item
    except json.JSONDecodeError as exc:
        if not got_one and "\n" in text.strip():
            yield from _json_lines(text, path, on_error)
            return
        report(on_error, ImportFormatError(str(path), exc.lineno, f"not valid JSON: {exc.msg} at column {exc.colno}"))


def _json_lines(text: str, path: Path, on_error: ErrorHandler | None) -> Iterator[tuple[int, Any]]:
    for k, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            yield k, json.loads(line)
        except json.JSONDecodeError as exc:
            report(on_error, ImportFormatError(str(path), k, f"not valid JSON: {exc.msg} at column {exc.colno}"))


def link_parents(spans: list[Span]) -> None:
    """Point every span at its parent span object (same trace, ``parent_id``)."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    for s in spans:
        s.parent = by_id.get((s.trace_id, s.parent_id)) if s.parent_id else None
