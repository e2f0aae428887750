"""Prometheus metrics of the sidecar and the gateway.

Each server builds its own :class:`prometheus_client.CollectorRegistry` (not the process-global
default), so several servers can live in one process — tests start many — without their
counters colliding. ``GET /metrics`` renders that registry in the text exposition format.

Naming follows Prometheus conventions: ``*_total`` counters, ``*_seconds`` histograms, and an
``*_info`` gauge whose labels carry the active profile version.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client import disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.types import ASGIApp

# The ``*_created`` companion series double the exposition size and nobody graphs them.
disable_created_metrics()

#: Latency buckets (seconds) sized for sub-millisecond annotate calls up to slow upstream calls.
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                   0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class Labeled:
    """A labelled metric's children cached by label values.

    ``metric.labels(...)`` takes a lock and validates the values on every call; on a path served
    thousands of times a second the child is looked up once and reused.
    """

    def __init__(self, metric: Counter | Gauge | Histogram) -> None:
        self.metric = metric
        self._children: dict[tuple, object] = {}

    def __call__(self, *values: str):
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child


def render(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The registry as Prometheus text, with its content type."""
    return generate_latest(registry), CONTENT_TYPE_LATEST


@dataclass
class PredictionMetrics:
    """What every server that runs a :class:`predictors.Predictor` exports."""

    registry: CollectorRegistry
    annotations: Counter          # labels: known, reason
    profile_info: Gauge           # labels: version
    profile_loaded_at: Gauge
    profile_reloads: Counter      # labels: outcome (ok, error)
    sessions: Gauge
    shadowed: Gauge
    live_coverage: Gauge          # labels: workflow_type

    def count_annotation(self, annotation: Any) -> None:
        """Count one annotation (the contract object, ``predictors.contract.Annotation``)."""
        if annotation.known:
            self._by_outcome("true", "").inc()
        else:
            self._by_outcome("false", str(annotation.reason or "")).inc()

    def __post_init__(self) -> None:
        self._by_outcome = Labeled(self.annotations)

    def set_profile(self, version: str | None, loaded_at: float) -> None:
        self.profile_info.clear()
        self.profile_info.labels(version or "none").set(1)
        self.profile_loaded_at.set(loaded_at)


def prediction_metrics(registry: CollectorRegistry, prefix: str,
                       unknown_ratio: Callable[[], float],
                       session_count: Callable[[], float],
                       shadow_count: Callable[[], float]) -> PredictionMetrics:
    """Create the predictor metrics under ``prefix`` (``profiler_sidecar`` or ``profiler_gateway``).

    ``unknown_ratio`` is read at scrape time: share of annotations that came back ``known: false``
    since start (``rate()`` over the ``annotations_total`` counter gives the windowed version).
    """
    m = PredictionMetrics(
        registry=registry,
        annotations=Counter(f"{prefix}_annotations", "Annotations returned, by outcome.",
                            ["known", "reason"], registry=registry),
        profile_info=Gauge(f"{prefix}_profile_info", "Active profile version (value is always 1).",
                           ["version"], registry=registry),
        profile_loaded_at=Gauge(f"{prefix}_profile_loaded_timestamp_seconds",
                                "When the active profile was loaded (epoch s).", registry=registry),
        profile_reloads=Counter(f"{prefix}_profile_reloads", "Profile reload attempts.", ["outcome"],
                                registry=registry),
        sessions=Gauge(f"{prefix}_sessions", "Live sessions held in memory.", registry=registry),
        shadowed=Gauge(f"{prefix}_shadowed_workflow_types",
                       "Workflow types served in shadow mode (known: false).", registry=registry),
        live_coverage=Gauge(f"{prefix}_live_output_len_coverage",
                            "Share of observed calls whose output length fell in the predicted band, "
                            "over the latest window.", ["workflow_type"], registry=registry),
    )
    Gauge(f"{prefix}_unknown_ratio", "Share of annotations with known=false since start.",
          registry=registry).set_function(unknown_ratio)
    m.sessions.set_function(session_count)
    m.shadowed.set_function(shadow_count)
    return m


def request_metrics(registry: CollectorRegistry, prefix: str) -> tuple[Counter, Histogram]:
    """HTTP request counter (labels: route, status) and latency histogram (label: route)."""
    requests = Counter(f"{prefix}_requests", "HTTP requests served.", ["route", "status"],
                       registry=registry)
    latency = Histogram(f"{prefix}_request_seconds", "Time to serve a request (to the last byte "
                        "for proxied calls).", ["route"], buckets=LATENCY_BUCKETS, registry=registry)
    return requests, latency


class RequestMetricsMiddleware:
    """Pure ASGI middleware: count and time every HTTP request by matched route and status.

    The route label is the matched route's path template (``/v1/annotate``), read from the
    scope after routing, so unbounded URL paths do not explode the label set (unmatched: "other").
    """

    def __init__(self, app: ASGIApp, requests: Counter, latency: Histogram) -> None:
        self.app = app
        self.requests = Labeled(requests)
        self.latency = Labeled(latency)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = [500]

        async def send_wrapper(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "other")
            self.latency(route).observe(time.perf_counter() - t0)
            self.requests(route, str(status[0])).inc()


class MemoryCollector(Collector):
    """Scrape-time view of the bounded in-memory state (docs/serving-security.md):

    ``<prefix>_session_bytes`` (estimated) and ``<prefix>_session_bytes_limit``,
    ``<prefix>_sessions_limit``, ``<prefix>_sessions_evicted_total{reason=count|bytes|idle}``,
    ``<prefix>_session_texts_dropped_total``, ``<prefix>_unknown_workflow_types`` and its
    ``_limit`` and ``_evicted_total``. ``stats()`` returns the predictor's ``memory_stats()``;
    ``gate`` is the shadow gate (or None).
    """

    def __init__(self, prefix: str, stats: Callable[[], dict], gate=None) -> None:
        self.prefix, self.stats, self.gate = prefix, stats, gate

    def collect(self):
        p, st = self.prefix, self.stats()
        yield GaugeMetricFamily(f"{p}_session_bytes", "Estimated bytes held by the session table.",
                                value=st["session_bytes"])
        yield GaugeMetricFamily(f"{p}_session_bytes_limit", "Byte budget of the session table "
                                "(the max_session_mb setting).", value=st["max_session_bytes"])
        yield GaugeMetricFamily(f"{p}_sessions_limit", "Most sessions kept (--max-sessions).",
                                value=st["max_sessions"])
        evicted = CounterMetricFamily(f"{p}_sessions_evicted", "Sessions forgotten, by reason "
                                      "(count or bytes limit, idle).", labels=["reason"])
        for reason, n in sorted(st["evicted"].items()):
            evicted.add_metric([reason], n)
        yield evicted
        yield CounterMetricFamily(f"{p}_session_texts_dropped", "Kept responses dropped to stay "
                                  "under the byte budget.", value=st["texts_dropped"])
        if self.gate is not None:
            yield GaugeMetricFamily(f"{p}_unknown_workflow_types", "Workflow types absent from the "
                                    "profile that are remembered (LRU).", value=self.gate.unknown_count())
            yield GaugeMetricFamily(f"{p}_unknown_workflow_types_limit", "Size of that LRU "
                                    "(the max_unknown_types setting).", value=self.gate.max_unknown_types)
            yield CounterMetricFamily(f"{p}_unknown_workflow_types_evicted", "Unknown workflow "
                                      "types forgotten by the LRU.", value=self.gate.unknown_evicted)


class RoutingCollector(Collector):
    """Scrape-time view of the capacity router's counters (``CapacityRouter.metrics()``), the
    figures the simulator reports as ``capacity_*`` for the same rule:

    ``<prefix>_route_decisions_total{mode=capacity|fallback|no_report}`` (``fallback``: no
    worker was safe by the capacity bound; the session stayed on its worker),
    ``<prefix>_route_stale_decisions_total`` (decided with a stale load report, on the router's
    own record), ``<prefix>_route_affinity_total`` (the session stayed on its last worker),
    ``<prefix>_route_moved_sessions_total`` and ``<prefix>_route_move_recompute_tokens_total``
    (sessions sent off the worker that holds their prefix, and the cached prefix tokens those
    moves make the new worker prefill again), ``<prefix>_route_move_left_behind_tokens_total``
    (the prefixes of those sessions' other agents left on the old worker)."""

    MODES = ("capacity", "fallback", "no_report")

    def __init__(self, prefix: str, stats: Callable[[], dict]) -> None:
        self.prefix, self.stats = prefix, stats

    def collect(self):
        p, st = self.prefix, self.stats()
        modes = CounterMetricFamily(f"{p}_route_decisions", "Routing decisions by mode (fallback: "
                                    "no worker safe by the capacity bound).", labels=["mode"])
        for mode in self.MODES:
            modes.add_metric([mode], st.get(mode, 0))
        yield modes
        yield CounterMetricFamily(f"{p}_route_stale_decisions", "Decisions taken with a stale "
                                  "load report (on the router's own record).", value=st.get("stale", 0))
        yield CounterMetricFamily(f"{p}_route_affinity", "Decisions that kept a session on its "
                                  "last worker.", value=st.get("affinity", 0))
        yield CounterMetricFamily(f"{p}_route_moved_sessions", "Sessions sent off the worker "
                                  "that holds their prefix.", value=st.get("moved_sessions", 0))
        yield CounterMetricFamily(f"{p}_route_move_recompute_tokens", "Cached prefix tokens the "
                                  "moves make another worker prefill again.",
                                  value=st.get("move_recompute_tokens", 0))
        yield CounterMetricFamily(f"{p}_route_move_left_behind_tokens", "Prefix tokens of the "
                                  "moved sessions' other agents left on their old worker.",
                                  value=st.get("move_left_behind_tokens", 0))


class DriftCollector(Collector):
    """Scrape-time view of output-length drift (``predictors.coverage_monitor`` and
    ``predictors.online_calibration``):

    ``<prefix>_output_len_drift_alarm{workflow_type}`` 1 while the type's drift alarm is on (the
    fitted band's coverage over the recent outcomes is significantly below nominal), else 0;
    ``<prefix>_output_len_fitted_coverage{workflow_type}`` that rolling coverage;
    ``<prefix>_output_len_online_level{workflow_type,agent}`` the level α_t online calibration
    serves the agent's band at (nominal: ``1 − coverage``; lower = wider bands);
    ``<prefix>_keep_alive_online_level{workflow_type,agent}`` the level the keep-alive TTL is
    served at (the second, one-sided calibrator: nominal ``1 −`` the idle-gap quantile; lower =
    longer TTLs; an agent appears once one of its idle gaps has been scored).
    ``monitor()`` returns ``CoverageMonitor.status()``, ``levels()`` and ``keep_alive_levels()``
    each an ``OnlineCalibrator.status()`` (or {} without calibration)."""

    def __init__(self, prefix: str, monitor: Callable[[], dict], levels: Callable[[], dict],
                 keep_alive_levels: Callable[[], dict] = dict) -> None:
        self.prefix, self.monitor, self.levels = prefix, monitor, levels
        self.keep_alive_levels = keep_alive_levels

    def collect(self):
        p, st = self.prefix, self.monitor()
        alarm = GaugeMetricFamily(f"{p}_output_len_drift_alarm", "1 while the workflow type's "
                                  "output-length drift alarm is on (fitted-band coverage over the "
                                  "recent calls significantly below nominal).", labels=["workflow_type"])
        cov = GaugeMetricFamily(f"{p}_output_len_fitted_coverage", "Coverage of the fitted "
                                "output-length bands over the recent observed calls.", labels=["workflow_type"])
        for wt, s in sorted(st.items()):
            alarm.add_metric([wt], 1.0 if s.get("alarm") else 0.0)
            if s.get("coverage") is not None:
                cov.add_metric([wt], s["coverage"])
        yield alarm
        yield cov
        yield online_levels(f"{p}_output_len_online_level", "Miss level alpha_t online calibration "
                            "serves the agent's band at (nominal 1 - coverage).", self.levels())
        yield online_levels(f"{p}_keep_alive_online_level", "Miss level alpha_t online calibration "
                            "serves the agent's keep-alive TTL at (nominal 1 - the idle-gap "
                            "quantile; lower = longer TTLs).", self.keep_alive_levels())


def online_levels(name: str, documentation: str, status: dict) -> GaugeMetricFamily:
    """One gauge sample per (workflow type, agent) of an ``OnlineCalibrator.status()``: its
    level α_t (agent names lose any NUL byte: the exposition format has no room for one)."""
    family = GaugeMetricFamily(name, documentation, labels=["workflow_type", "agent"])
    for wt, agents in sorted(status.items()):
        for agent, s in sorted(agents.items()):
            family.add_metric([wt, agent.replace("\x00", "")], s["level"])
    return family
