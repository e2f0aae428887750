"""OpenTelemetry out: one span per proxied call, predictions beside the trace.

Each annotated call the gateway forwards becomes a ``CLIENT`` span named ``"<operation> <model>"``
(the GenAI semantic conventions' span name) with

* GenAI semantic-convention attributes: ``gen_ai.operation.name`` (``chat``,
  ``text_completion``, ``responses``, ``generate``), ``gen_ai.request.model``,
  ``gen_ai.conversation.id`` (the workflow id), ``gen_ai.agent.name`` (the agent id),
  ``gen_ai.usage.input_tokens`` / ``gen_ai.usage.output_tokens``;
* the prediction and its outcome under ``agentprof.*``: ``agentprof.workflow_type``,
  ``agentprof.known``, ``agentprof.identity_source``, ``agentprof.dialect``,
  ``agentprof.predicted_output_lo`` / ``_hi`` and ``agentprof.output_in_band`` (actual output in
  the predicted band), ``agentprof.predicted_next_agent`` and — on the session's next call —
  ``agentprof.actual_next_agent`` plus ``agentprof.next_agent_hit``, ``agentprof.ttl_s`` and
  ``agentprof.actual_idle_gap_s`` plus ``agentprof.idle_within_ttl`` (the gap from the previous
  call's finish to this call's arrival, compared with the TTL the previous call was given; these
  outcomes of the previous prediction are recorded on the call that reveals them).

Spans go to the OTel SDK's OTLP/HTTP exporter when an endpoint is configured (``--otlp-endpoint``
or the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``), so Langfuse, Phoenix or any OTLP collector shows
predictions beside traces; tests pass their own ``TracerProvider`` (an ``InMemorySpanExporter``).
"""
from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from predictors.contract import Annotation

#: ``gen_ai.operation.name`` per gateway endpoint.
OPERATIONS = {"chat": "chat", "completions": "text_completion", "responses": "responses",
              "generate": "generate"}


def otlp_tracer_provider(endpoint: str | None = None, service_name: str = "agentprof-gateway"
                         ) -> TracerProvider | None:
    """A provider exporting over OTLP/HTTP to ``endpoint`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT``);
    None when neither is set (no tracing)."""
    endpoint = endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if not endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=url)))
    return provider


class CallTracer:
    """Writes the span of each call (module doc) and remembers, per session, what the previous
    call predicted (next agent, TTL, finish time) to score it when the next call arrives."""

    def __init__(self, provider: TracerProvider, max_sessions: int = 100_000) -> None:
        self.provider = provider
        self.tracer: Tracer = provider.get_tracer("agentprof.gateway")
        self.max_sessions = max_sessions
        self._last: OrderedDict[tuple, dict] = OrderedDict()
        self._lock = threading.Lock()

    def record(self, *, endpoint: str, model: Any, meta: dict | None,
               ann: Annotation | Mapping[str, Any] | None,
               identity_source: str | None, dialect: str | None, t_arrival: float,
               t_finish: float, status: int | None, input_tokens: Any = None,
               output_tokens: Any = None, error: str | None = None) -> None:
        """One finished call (success or failure) as a span."""
        op = OPERATIONS.get(endpoint, endpoint)
        attrs: dict[str, Any] = {"gen_ai.operation.name": op}
        if isinstance(model, str):
            attrs["gen_ai.request.model"] = model
        for key, val in (("gen_ai.usage.input_tokens", input_tokens),
                         ("gen_ai.usage.output_tokens", output_tokens)):
            if isinstance(val, int) and not isinstance(val, bool):
                attrs[key] = val
        if status is not None:
            attrs["http.response.status_code"] = status
        if identity_source:
            attrs["agentprof.identity_source"] = identity_source
        if dialect:
            attrs["agentprof.dialect"] = dialect
        session = None
        if meta:
            wt, wf, agent = (meta.get(k) for k in ("workflow_type_id", "workflow_id", "agent_id"))
            if wf is not None:
                attrs["gen_ai.conversation.id"] = str(wf)
            if agent is not None:
                attrs["gen_ai.agent.name"] = str(agent)
            if wt is not None:
                attrs["agentprof.workflow_type"] = str(wt)
            session = (str(wt), str(wf))
        ann = Annotation.from_dict(ann)     # the contract object itself: no parse
        attrs["agentprof.known"] = ann.known
        if ann.predicted_output_len is not None:
            attrs["agentprof.predicted_output_lo"], attrs["agentprof.predicted_output_hi"] = \
                ann.predicted_output_len
            if isinstance(output_tokens, int):
                attrs["agentprof.output_in_band"] = ann.output_lo <= output_tokens <= ann.output_hi
        predicted_next = ann.next_agent.agent_id if ann.next_agent is not None else None
        if predicted_next:
            attrs["agentprof.predicted_next_agent"] = predicted_next
        ttl = ann.keep_alive_ttl_s if ann.keep_alive_ttl_s is not None else ann.retain_s
        if ttl is not None:
            attrs["agentprof.ttl_s"] = float(ttl)
        if session is not None:
            with self._lock:
                prev = self._last.pop(session, None)
                if error is None:
                    self._last[session] = {"next": predicted_next, "ttl": ttl, "t_finish": t_finish}
                    while len(self._last) > self.max_sessions:
                        self._last.popitem(last=False)
                elif prev is not None:
                    self._last[session] = prev
            if prev is not None:
                agent = meta.get("agent_id")
                if prev["next"] is not None:
                    attrs["agentprof.previous_predicted_next_agent"] = prev["next"]
                    attrs["agentprof.actual_next_agent"] = str(agent)
                    attrs["agentprof.next_agent_hit"] = prev["next"] == str(agent)
                gap = t_arrival - prev["t_finish"]
                attrs["agentprof.actual_idle_gap_s"] = gap
                if isinstance(prev["ttl"], (int, float)):
                    attrs["agentprof.previous_ttl_s"] = float(prev["ttl"])
                    attrs["agentprof.idle_within_ttl"] = gap <= prev["ttl"]
        name = f"{op} {model}" if isinstance(model, str) else op
        span = self.tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attrs,
                                      start_time=int(t_arrival * 1e9))
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
            span.set_attribute("error.type", error)
        span.end(end_time=int(t_finish * 1e9))

    def shutdown(self) -> None:
        self.provider.shutdown()
