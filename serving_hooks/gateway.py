"""The annotating gateway: ``profiler gateway --upstream URL … (--profile DIR | --sidecar URL)``.

An OpenAI-compatible reverse proxy in front of SGLang (or any OpenAI-compatible server). For
``POST /v1/chat/completions`` and ``POST /v1/completions`` it

1. reads ``app_metadata`` from the JSON body (top level or under ``extra_body``);
2. asks the predictor (in process, or the sidecar) for the call's typed
   :class:`~predictors.contract.Annotation` within a time budget, failing open (unannotated,
   counted in ``profiler_gateway_annotate_total{outcome=…}``) on error or over budget;
3. forwards the client's bytes with ``sys_annotations`` spliced in
   (:func:`serving_hooks.annotations.forward_body`) and, with ``--sglang-fields``, the engine's
   own fields, to the upstream the router seam picks (:mod:`serving_hooks.upstreams`);
4. returns the upstream's answer as sent (SSE chunk by chunk; timeout ``504``, unreachable ``502``);
5. after a successful call, logs a gateway record and reports the completion (``observe``).

Why it is a byte-preserving proxy that fails open: the app and the engine must not change, and a
slow or broken predictor must never fail a request. The same path also serves ``/v1/responses``
and ``/generate`` (:mod:`serving_hooks.endpoints`), engine dialects (:mod:`serving_hooks.dialects`),
harness identity (:mod:`serving_hooks.identity`), retries (:mod:`serving_hooks.retries`),
model pools (:mod:`policies.pools`) and tracing (:mod:`serving_hooks.telemetry`);
engine admin paths (:data:`ENGINE_ADMIN_PATHS`) are never forwarded. Streams, pools, hardening
and the endpoints in full: docs/serving.md ("The gateway in full (serving_hooks/gateway.py)")
and docs/serving-security.md.
"""
from __future__ import annotations

import asyncio
import fnmatch
import gc
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace as dataclass_replace
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from prometheus_client import CollectorRegistry, Counter, Histogram

from serving_hooks.api_docs import NO_CDN_DOCS, mount_local_docs
from serving_hooks.annotations import forward_body
from serving_hooks.dialects import (CLIENT_SCHEDULER_KEYS, hint_values, render as render_dialect,
                                    strip_client_scheduler_fields)
from serving_hooks.endpoints import as_chat_response, endpoint_of, stream_final
from serving_hooks.gateway_log import GatewayLog
from serving_hooks.http_guard import BodySizeLimit, StrictJSONError, admin_auth, strict_json_loads
from serving_hooks.identity import IdentityMap, resolve_identity
from serving_hooks.retries import RetryLedger
from serving_hooks.settings import GatewaySettings as G
from predictors.contract import Annotation
from policies.pools import ModelPools, NoReplicaForModel
from policies.priority import PriorityPolicy
from policies.session_end import SessionEndRule
from serving_hooks.metrics import (LATENCY_BUCKETS, Labeled, RequestMetricsMiddleware, render,
                                   RoutingCollector, request_metrics)
from serving_hooks.sglang_sessions import SglangSessions, client_manages_session, session_name
from serving_hooks.sse import StreamFollower
from serving_hooks.upstreams import UpstreamClient, UpstreamRouter, request_model

if TYPE_CHECKING:  # pragma: no cover
    from serving_hooks.annotator import AnnotationSource
    from serving_hooks.service import PredictionService
    from serving_hooks.telemetry import CallTracer

log = logging.getLogger(__name__)

#: Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus those we recompute.
HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization",
                         "te", "trailer", "trailers", "transfer-encoding", "upgrade", "host",
                         "content-length"})
#: Longest response text sent along with an observe (prompt composition needs the recent ones).
OBSERVE_TEXT_CHARS = 64 * 1024
#: Paths forwarded upstream by default (``fnmatch`` patterns; the ``allow_path`` setting adds more): the
#: OpenAI-compatible API, SGLang's native ``/generate`` and the engines' health checks.
DEFAULT_FORWARD_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses",
                         "/v1/responses/*", "/v1/models", "/v1/models/*", "/v1/embeddings",
                         "/generate", "/health", "/health_generate", "/v1/health", "/ping",
                         "/version")
#: Engine admin paths (SGLang, vLLM) never forwarded, even if an allow pattern matches them:
#: they change weights, memory, caches or logging of the shared engine.
ENGINE_ADMIN_PATHS = ("*flush_cache*", "*update_weight*", "*init_weights*", "*weights_*",
                      "*release_memory*", "*resume_memory*", "*start_profile*", "*stop_profile*",
                      "*lora_adapter*", "*abort_request*", "*internal_state*", "*configure_logging*",
                      "*expert_distribution*", "*pause_generation*", "*continue_generation*",
                      "*reset_prefix_cache*", "/sleep*", "/wake_up*", "*collective_rpc*",
                      "*scale_elastic_ep*", "*slow_down*", "*admin*", "*server_info*",
                      "*open_session*", "*close_session*", "*freeze_gc*")
#: Key names of the request fields that steer the engine's scheduler in any dialect
#: (``serving_hooks.dialects.CLIENT_SCHEDULER_PATHS``): removed from client bodies unless
#: ``allow_client_scheduler_fields``.
SCHEDULER_FIELDS = CLIENT_SCHEDULER_KEYS
#: Request headers of the ``headers`` dialect: a client's own are removed unless
#: ``allow_client_scheduler_fields`` (a router must not trust hints the gateway did not set).
HINT_HEADER_PREFIX = "x-agentprof-"


@dataclass
class GatewayOptions:
    """Behaviour knobs of the gateway in the units it runs on. Each ``profiler gateway`` knob is
    declared once, with its default, in :class:`~serving_hooks.settings.GatewaySettings`; the
    defaults here are read from it (``G``), never written a second time."""

    budget_s: float = G.budget_ms / 1000.0  # time budget for one annotation (fail open beyond it)
    sglang_fields: bool = G.sglang_fields  # also send SGLang's `priority` and flat `custom_params`
    strip_metadata: bool = G.strip_metadata  # drop app_metadata, add no sys_annotations
    stream_usage: bool = G.stream_usage  # ask streams for usage (and hide the extra chunk)
    upstream_timeout_s: float = G.upstream_timeout  # read timeout (between bytes) upstream
    connect_timeout_s: float = 10.0
    max_request_bytes: int = int(G.max_request_mb * (1 << 20))
    body_timeout_s: float | None = G.body_timeout  # whole request body within this (408 beyond)
    admin_token: str | None = None
    max_connections: int = 1024
    forward_paths: tuple[str, ...] = DEFAULT_FORWARD_PATHS  # fnmatch patterns proxied upstream
    allow_client_scheduler_fields: bool = G.allow_client_scheduler_fields  # keep a client's own
    dialect: str | None = G.dialect    # engine dialect for every upstream (serving_hooks.dialects)
    #: per-upstream (normalized URL) ``(dialect, priority order)``, overriding ``dialect``
    upstream_dialects: dict = field(default_factory=dict)
    identity: IdentityMap = field(default_factory=IdentityMap)  # app_metadata from headers
    retry_window_s: float = G.retry_window  # identical body of a session within it = a retry
    #: idle seconds before a pooled upstream connection is dropped (below the engine's 5 s)
    upstream_keepalive_s: float = G.upstream_keepalive
    retry_stale_connections: bool = True  # resend once a call that met a closed pooled connection
    #: end-of-session signal (``--session-end-p``, ``session_end_signal``; docs/dialects.md)
    session_end: SessionEndRule = field(default_factory=SessionEndRule)
    #: spelling of Dynamo's identity the dynamo dialect sends (``--dynamo-api``; dialects.DYNAMO_APIS)
    dynamo_api: str = G.dynamo_api
    #: open/close SGLang's own session per workflow (``--sglang-sessions``; sglang_sessions.py)
    sglang_sessions: bool = G.sglang_sessions
    #: ``gc.freeze()`` once started, so full collections skip the profile (``profiler gateway``
    #: runs in a process of its own and sets it; process-wide, so off for an embedded Gateway)
    freeze_gc: bool = False


def path_forwarded(path: str, patterns: tuple[str, ...]) -> bool:
    """Whether the gateway proxies ``path``: it matches an allow pattern, no engine admin pattern,
    and has no empty, ``.`` or ``..`` segment (so ``/v1/models/../flush_cache`` is refused)."""
    segments = path.split("/")[1:]
    if not path.startswith("/") or any(seg in ("", ".", "..") for seg in segments):
        return False
    low = path.lower()
    if any(fnmatch.fnmatchcase(low, pat) for pat in ENGINE_ADMIN_PATHS):
        return False
    return any(fnmatch.fnmatchcase(path, pat) for pat in patterns)


def _may_set_scheduler_fields(raw: bytes) -> bool:
    """For a body that is not strict JSON: could an upstream parser read a scheduler field in it?
    Parsed leniently when Python can (exact answer); else any ``"priority"``/``"custom_params"``
    key token in the bytes counts (conservative)."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        return any(b'"%s"' % k.encode() in raw for k in SCHEDULER_FIELDS)
    return isinstance(body, dict) and strip_scheduler_fields(body) is not None


#: ``body`` without the client-set scheduler fields of every dialect (top level and in
#: ``extra_body``), or None when it has none (``serving_hooks.dialects``).
strip_scheduler_fields = strip_client_scheduler_fields


#: Headers aiohttp would add on its own: the upstream must see the client's, and only those.
SKIP_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


def _error_response(status: int, kind: str, message: str) -> Response:
    """An OpenAI-style error body for failures that have no upstream response to pass on."""
    body = json.dumps({"error": {"message": message, "type": kind, "code": status}}).encode()
    return Response(body, status_code=status, media_type="application/json")


def _headers_out(resp: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers for the client: all of them, in order, but hop-by-hop."""
    return [(k.lower(), v) for k, v in resp.raw_headers if k.lower().decode("latin-1") not in HOP_HEADERS]


def _raw_response(resp: aiohttp.ClientResponse, content: bytes) -> Response:
    out = Response(content, status_code=resp.status)
    out.raw_headers = _headers_out(resp) + [(b"content-length", str(len(content)).encode())]
    return out


def _decode(raw: bytes, encoding: str | None) -> bytes | None:
    """Response bytes without content-encoding (for parsing only; the client gets ``raw``)."""
    if not encoding or encoding == "identity":
        return raw
    import zlib
    try:
        if encoding == "gzip":
            return zlib.decompress(raw, 16 + zlib.MAX_WBITS)
        if encoding == "deflate":
            return zlib.decompress(raw)
    except zlib.error:
        return None
    return None


class _GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.annotate = Counter("profiler_gateway_annotate", "Annotation outcome per proxied call "
                                "(annotated, no_metadata, not_json, over_budget, timeout, error, "
                                "disabled).", ["outcome"], registry=registry)
        self.overhead = Histogram("profiler_gateway_overhead_seconds", "Gateway time before the "
                                  "request leaves for the upstream (parse, annotate, rewrite).",
                                  buckets=LATENCY_BUCKETS, registry=registry)
        self.annotate_seconds = Histogram("profiler_gateway_annotate_seconds", "Time spent getting "
                                          "annotations.", buckets=LATENCY_BUCKETS, registry=registry)
        self.upstream = Counter("profiler_gateway_upstream_responses", "Upstream answers by status "
                                "class or failure (timeout, unreachable, stream_broken), and calls "
                                "resent after meeting a closed pooled connection "
                                "(stale_connection_retried).",
                                ["upstream", "outcome"], registry=registry)
        self.records = Counter("profiler_gateway_log_records", "Gateway records: written (the "
                               "whole line reached the file), or why not (no_usage, not_json).",
                               ["outcome"], registry=registry)
        self.stripped = Counter("profiler_gateway_client_scheduler_fields_stripped", "Requests "
                                "whose client-set priority/custom_params were removed.",
                                registry=registry)
        self.refused = Counter("profiler_gateway_paths_refused", "Requests for paths the gateway "
                               "does not forward (not allowed, or an engine admin path).",
                               registry=registry)
        self.sse_malformed = Counter("profiler_gateway_sse_malformed_events", "Upstream SSE events "
                                     "that could not be parsed (passed through untouched).",
                                     registry=registry)
        self.recovered = Counter("profiler_gateway_log_recovered_files", "Log files left open by a "
                                 "killed gateway, closed at start.", registry=registry)
        self.torn = Counter("profiler_gateway_log_torn_lines", "Torn last lines dropped from "
                            "those files.", registry=registry)
        self.dialect = Counter("profiler_gateway_dialect_calls", "Annotated calls by the engine "
                               "dialect their hints were rendered in (none: sys_annotations only).",
                               ["dialect"], registry=registry)
        self.identity = Counter("profiler_gateway_identity_calls", "Calls to annotated endpoints by "
                                "where their identity came from (app_metadata, metadata, "
                                "claude_code, codex, opencode, dynamo, none).", ["source"],
                                registry=registry)
        self.retries = Counter("profiler_gateway_retries", "Attempts recognised as retries of an "
                               "earlier one (retry), of one that had completed (after_completion), "
                               "and sessions rolled back after a failed attempt (rolled_back).",
                               ["outcome"], registry=registry)
        self.downstream = Counter("profiler_gateway_idle_downstream_boosts", "Calls whose "
                                  "priority rose because a model pool their workflow reaches next "
                                  "was about to idle (multi-model pools).", registry=registry)
        self.annotate_outcome = Labeled(self.annotate)
        self.upstream_outcome = Labeled(self.upstream)
        self.record_outcome = Labeled(self.records)


class Gateway:
    """The proxy logic; :func:`create_gateway_app` mounts it on a FastAPI app.

    Upstream calls go through one pooled ``aiohttp.ClientSession`` (keep-alive, no automatic
    decompression, no headers of its own; :class:`~serving_hooks.upstreams.UpstreamClient`: idle
    connections dropped before the engine drops them, one retry of a call that met a connection
    closed under it, before the engine read a byte): measured on this project's 2-core machine it costs
    about a third of an httpx ``AsyncClient`` round trip, and the gateway's added latency is
    mostly that round trip (see ``bench/bench_serving.py``).
    """

    def __init__(self, router: UpstreamRouter,
                 annotator: AnnotationSource | None = None, *,
                 log_writer: GatewayLog | None = None, options: GatewayOptions | None = None,
                 registry: CollectorRegistry | None = None,
                 service: PredictionService | None = None, retries: RetryLedger | None = None,
                 tracer: CallTracer | None = None, pools: ModelPools | None = None,
                 priority: PriorityPolicy | None = None) -> None:
        self.router = router
        self.pools = pools if pools is not None and pools.pooled else None
        #: the priority rule the annotations are made with (the in-process service's; a sidecar's
        #: annotation gets the pools' term here, by the same rule)
        self.priority = priority or (service.priority if service is not None
                                     and service.priority is not None else PriorityPolicy())
        self.annotator = annotator
        self.log = log_writer
        self.options = options or GatewayOptions()
        self.registry = registry or CollectorRegistry()
        self.service = service
        self.metrics = _GatewayMetrics(self.registry)
        if router.routing_stats() is not None:     # the capacity router's decisions and moves
            self.registry.register(RoutingCollector("profiler_gateway", router.routing_stats))
        if self.log is not None:
            written = self.metrics.record_outcome("written")
            self.log.on_written = written.inc
            self.metrics.recovered.inc(self.log.recovered_files)
            self.metrics.torn.inc(self.log.recovered_torn_lines)
        self.client = UpstreamClient(
            keepalive_s=self.options.upstream_keepalive_s, max_connections=self.options.max_connections,
            connect_timeout_s=self.options.connect_timeout_s,
            read_timeout_s=self.options.upstream_timeout_s, skip_auto_headers=SKIP_AUTO_HEADERS,
            retry_stale=self.options.retry_stale_connections)
        self.background: list = []   # objects with start()/stop() living as long as the app
        self.retries = retries or RetryLedger(self.options.retry_window_s)
        self.tracer = tracer
        self.ready = False           # GET /readyz: 503 until start() has loaded and warmed up
        self.sessions = SglangSessions(lambda: self.client.session, self.registry) \
            if self.options.sglang_sessions else None
        self._frozen_version: str | None = None   # the profile version gc.freeze() last covered

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self) -> None:
        await self.client.start()
        if self.annotator is not None:
            await self.annotator.start()
        await self.router.start()
        for obj in self.background:
            obj.start()
        if self.annotator is not None:
            # the first real call of each (type, agent) finds every lazy structure built, so no
            # cold-start call goes out unannotated for being over the time budget
            await self.annotator.warm_up()
        if self.options.freeze_gc:
            # What start-up built (the profile, the libraries) lives as long as the process: out
            # of the cyclic collector's sight, or each full collection scans all of it and stalls
            # every request and stream (tens to hundreds of ms on a busy machine). Reference
            # counting still frees it; a hot reload's new profile is frozen in turn
            # (:meth:`_freeze_reloaded_profile`).
            gc.freeze()
            self._frozen_version = self._profile_version()
        self.ready = True

    def _profile_version(self) -> str | None:
        return self.service.predictor.version if self.service is not None else None

    def _freeze_reloaded_profile(self) -> bool:
        """With ``freeze_gc``, after a hot reload: collect once (the old profile's cycles go)
        and freeze the new profile, so collections stop scanning it. One pause per reload
        instead of one per full collection. True when it froze."""
        version = self._profile_version()
        if not self.options.freeze_gc or version == self._frozen_version:
            return False
        self._frozen_version = version
        gc.collect()
        gc.freeze()
        return True

    def dialect_for(self, upstream: str) -> tuple[str | None, str | None]:
        """``(dialect, priority order)`` of one upstream (``--upstream URL,dialect=…``)."""
        if upstream in self.options.upstream_dialects:
            dialect, order = self.options.upstream_dialects[upstream]
            if dialect is not None:
                return dialect, order
        if self.options.dialect is not None:
            return self.options.dialect, None
        return ("sglang", None) if self.options.sglang_fields else (None, None)

    async def aclose(self) -> None:
        for obj in reversed(self.background):
            await asyncio.to_thread(obj.stop)
        await self.router.aclose()
        if self.annotator is not None:
            await self.annotator.aclose()
        await self.client.aclose()
        if self.log is not None:
            await asyncio.to_thread(self.log.close)
        if self.tracer is not None:
            await asyncio.to_thread(self.tracer.shutdown)

    # -- annotation with a time budget -----------------------------------------------------------
    async def _annotate(self, meta: dict | None, request_id: str, body: Any,
                        advance: bool = True) -> tuple[Annotation | None, str]:
        """The call's annotation (priority computed once, with the model pools' queues when
        there are pools), marked ``session_end`` by the end-of-session rule, and its outcome."""
        inputs = self._priority_inputs(meta)
        ann, outcome = await self._annotate_within_budget(meta, request_id, body, advance, inputs)
        if outcome in ("over_budget", "timeout", "error"):
            log.warning("request %s forwarded unannotated (fail open: %s)", request_id, outcome)
        if ann is not None and inputs is not None:
            ann = self._pools_priority(ann, meta, inputs)
        if ann is not None:
            ann = self.options.session_end.mark(ann, meta)
        return ann, outcome

    async def _annotate_within_budget(self, meta: dict | None, request_id: str, body: Any,
                                      advance: bool, priority_inputs: dict | None = None
                                      ) -> tuple[Annotation | None, str]:
        extra: dict[str, Any] = {} if advance else {"advance": False}
        if priority_inputs is not None and self.annotator is not None \
                and self.annotator.takes_priority_inputs:
            extra["priority_inputs"] = priority_inputs
        if body is None:
            return None, "not_json"
        if meta is None:
            return None, "no_metadata"
        if self.annotator is None:
            return None, "disabled"
        t0 = time.perf_counter()
        budget = self.options.budget_s
        try:
            if self.annotator.blocking:
                ann = self.annotator.annotate_now(meta, request_id, None, timeout_s=budget, **extra)
                if time.perf_counter() - t0 > budget:
                    return None, "over_budget"
            else:
                # asyncio.wait returns at the budget without waiting for the cancelled task to
                # unwind (wait_for would), so a slow sidecar costs at most the budget.
                task = asyncio.ensure_future(self.annotator.annotate(meta, request_id, None, **extra))
                done, _ = await asyncio.wait((task,), timeout=budget)
                if not done:
                    task.cancel()
                    task.add_done_callback(_swallow)
                    return None, "timeout"
                ann = task.result()
        except (asyncio.TimeoutError, TimeoutError):
            return None, "timeout"
        except Exception as exc:
            log.warning("annotation of %s failed: %s: %s", request_id, type(exc).__name__, exc)
            return None, "error"
        finally:
            self.metrics.annotate_seconds.observe(time.perf_counter() - t0)
        return ann, "annotated"

    # -- model pools: the idle-downstream term --------------------------------------------------
    def _priority_inputs(self, meta: dict | None) -> dict | None:
        """The priority policy's pool inputs for this call — waiting requests per pool
        (``queue_depth``) and the pool each agent of its workflow type calls (``agent_model``) —
        or None without pools or before any pool has reported."""
        if self.pools is None or meta is None:
            return None
        depths = self.pools.depths(self.router.queue_depths())
        if not depths:
            return None
        return {"queue_depth": depths,
                "agent_model": dict(self.pools.agent_pools(meta.get("workflow_type_id")))}

    def _pools_priority(self, ann: Annotation, meta: dict | None, inputs: dict) -> Annotation:
        """A known call's priority with the idle-downstream term (docs/serving.md). In process the
        predictor already computed it with ``inputs`` (once); a sidecar's policy knows no gateway
        queues, so the gateway applies the rule here. Counts the calls the term raised."""
        if not ann.known or ann.priority is None:
            return ann
        if not self.annotator.takes_priority_inputs:
            ann = dataclass_replace(ann, priority=self.priority.call_priority(ann, **inputs))
        if self.priority.idle_downstream_term(ann, **inputs) > 0:
            self.metrics.downstream.inc()
        return ann

    # -- upstream I/O -----------------------------------------------------------------------------
    async def _send(self, request: Request, upstream: str, content: bytes | None,
                    extra_headers: dict[str, str] | None = None
                    ) -> tuple[aiohttp.ClientResponse | None, Response | None]:
        """Send to ``upstream``: ``(response, None)``, or ``(None, error response)`` when no
        response came (504 on timeout, 502 when unreachable)."""
        url = upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.headers.raw
                   if k.decode("latin-1") not in HOP_HEADERS]
        if not self.options.allow_client_scheduler_fields:
            headers = [(k, v) for k, v in headers if not k.lower().startswith(HINT_HEADER_PREFIX)]
        if extra_headers:   # a client's own header of the same name wins (never doubled): e.g.
            # its X-Dynamo-Session-ID names the engine's session, which our end signal then closes
            theirs = {k.lower() for k, _ in headers}
            headers += [(k, v) for k, v in extra_headers.items() if k.lower() not in theirs]
        try:
            resp, retried = await self.client.request(request.method, url, data=content,
                                                      headers=headers)
        except asyncio.TimeoutError:
            self.metrics.upstream_outcome(upstream, "timeout").inc()
            log.warning("upstream %s timed out on %s", upstream, request.url.path)
            return None, _error_response(504, "upstream_timeout", f"upstream timed out "
                                         f"(no byte for {self.options.upstream_timeout_s:g}s)")
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.upstream_outcome(upstream, "unreachable").inc()
            log.warning("upstream %s unreachable: %s: %s", upstream, type(exc).__name__, exc)
            # the body names no host or port: those are the operator's, not the client's
            return None, _error_response(502, "upstream_unreachable",
                                         f"upstream unreachable ({type(exc).__name__})")
        if retried:
            self.metrics.upstream_outcome(upstream, "stale_connection_retried").inc()
            log.info("upstream %s closed a pooled connection under %s: sent again on a fresh one",
                     upstream, request.url.path)
        self.metrics.upstream_outcome(upstream, f"{resp.status // 100}xx").inc()
        return resp, None

    async def _read_all(self, resp: aiohttp.ClientResponse, upstream: str) -> bytes | Response:
        """The whole raw body (still content-encoded), or a 502/504 if the upstream broke off."""
        try:
            return await resp.read()
        except asyncio.TimeoutError:
            self.metrics.upstream_outcome(upstream, "timeout").inc()
            log.warning("upstream %s stopped sending", upstream)
            return _error_response(504, "upstream_timeout", "upstream stopped sending")
        except (aiohttp.ClientError, OSError) as exc:
            self.metrics.upstream_outcome(upstream, "stream_broken").inc()
            log.warning("upstream %s broke off: %s", upstream, exc)
            return _error_response(502, "upstream_broken",
                                   f"upstream broke off ({type(exc).__name__})")
        finally:
            resp.release()

    # -- the proxied OpenAI calls ----------------------------------------------------------------
    async def proxy_call(self, request: Request) -> Response:
        """One annotated call, in named steps: read the body, identify the call, annotate it,
        pick the upstream, rewrite the body in its dialect, forward and relay the answer."""
        t_arrival = time.time()
        if self.options.freeze_gc and self._profile_version() != self._frozen_version:
            asyncio.get_running_loop().call_soon(self._freeze_reloaded_profile)
        raw = await request.body()
        t0 = time.perf_counter()
        read = self._read_body(raw)
        if isinstance(read, Response):
            return read
        raw, body = read
        kind = endpoint_of(request.url.path) or "chat"
        meta, where, id_source = resolve_identity(body, request.headers, self.options.identity)
        refused = self._check_model_pool(body, meta)
        if refused is not None:
            return refused
        if body is not None:
            self.metrics.identity.labels(id_source or "none").inc()
        request_id, advance = self._request_id(meta, raw, request.headers)
        ann, outcome = await self._annotate(meta, request_id, body, advance)
        self.metrics.annotate_outcome(outcome).inc()
        ctx = _CallContext(request_id, t_arrival, body, meta, ann, outcome, upstream="",
                           chat=kind != "completions", stream=body is not None and body.get("stream") is True,
                           record_wanted=self._record_wanted(meta, body),
                           client_request_id=request.headers.get("x-request-id"), kind=kind,
                           identity_source=id_source, advanced=advance)
        ctx.upstream = self.router.choose_upstream(request_id, body, ann, meta)
        ctx.dialect, order = self.dialect_for(ctx.upstream)
        if self.sessions is not None and ctx.dialect == "sglang" and not client_manages_session(body):
            ctx.engine_session = session_name(meta)   # SGLang's own session of the workflow
            if ctx.engine_session is not None:
                await self.sessions.ensure_open(ctx.upstream, ctx.engine_session)
        fwd, hint_headers, inject_usage = self._rewrite(ctx, raw, where, order)
        self.metrics.overhead.observe(time.perf_counter() - t0)
        return await self._forward(request, ctx, fwd, hint_headers, inject_usage)

    def _read_body(self, raw: bytes) -> tuple[bytes, dict | None] | Response:
        """``(bytes to forward, parsed body or None)``, or a 400 for scheduler fields that
        cannot be removed. A body that is not strict JSON (NaN, 1e400, too deep…) is forwarded
        untouched and unannotated; a client's own scheduler fields are stripped (re-encoding the
        body) unless ``allow_client_scheduler_fields``."""
        try:
            body = strict_json_loads(raw) if raw else None
        except StrictJSONError:
            body = None
            if not self.options.allow_client_scheduler_fields and _may_set_scheduler_fields(raw):
                # it cannot be stripped without re-encoding what is not JSON: refuse it
                return _error_response(400, "invalid_request_error", "request sets scheduler "
                                       "fields (priority, custom_params, vllm_xargs, nvext hints) "
                                       "in a body that is not strict JSON (NaN, Infinity, 1e400, "
                                       "lone surrogate, too deep)")
        if not isinstance(body, dict):
            return raw, None
        if not self.options.allow_client_scheduler_fields:
            stripped = strip_scheduler_fields(body)
            if stripped is not None:
                self.metrics.stripped.inc()
                try:
                    raw = json.dumps(stripped, ensure_ascii=False, separators=(",", ":"),
                                     allow_nan=False).encode("utf-8")
                    body = stripped
                except (ValueError, RecursionError):  # cannot re-encode: refuse rather than leak
                    return _error_response(400, "invalid_request_error", "request sets scheduler "
                                           "fields (priority, custom_params, vllm_xargs, nvext "
                                           "hints) and cannot be re-encoded")
        return raw, body

    def _check_model_pool(self, body: dict | None, meta: dict | None) -> Response | None:
        """With model pools: 404 when no upstream serves the body's model; else learn which pool
        the call's agent uses (the idle-downstream term reads it)."""
        if self.pools is None:
            return None
        model = request_model(body)
        try:
            self.pools.candidates(model)
        except NoReplicaForModel as exc:
            return _error_response(404, "model_not_found", str(exc))
        pool = self.pools.pool_of(model)
        if pool is not None and meta is not None:
            self.pools.note_agent(str(meta.get("workflow_type_id")), str(meta.get("agent_id")), pool)
        return None

    def _request_id(self, meta: dict | None, raw: bytes, headers: Any) -> tuple[str, bool]:
        """``(request id, advance the session?)``: a retry of an earlier attempt shares its id
        (:mod:`serving_hooks.retries`) and a retry of a completed call does not advance again."""
        if meta is None or not raw:
            return f"gw-{uuid.uuid4().hex}", True  # ours: a client's header may repeat across calls
        attempt = self.retries.attempt(tuple(str(meta.get(k)) for k in
                                             ("workflow_type_id", "workflow_id", "agent_id")),
                                       raw, headers)
        if attempt.retry:
            self.metrics.retries.labels("after_completion" if attempt.completed else "retry").inc()
            return attempt.request_id, not attempt.completed
        return attempt.request_id, True

    def _record_wanted(self, meta: dict | None, body: dict | None) -> bool:
        """Whether the completed call is read back (logged, observed or traced)."""
        return (meta is not None and (self.log is not None or self.annotator is not None)) \
            or (self.tracer is not None and body is not None)

    def _rewrite(self, ctx: "_CallContext", raw: bytes, where: str | None,
                 order: str | None) -> tuple[bytes, dict, bool]:
        """``(bytes to send, extra headers, usage chunk injected?)``: the annotation spliced in
        (``sys_annotations``) and rendered in the upstream's dialect, and a stream asked for its
        usage when the gateway needs it. Fails open: on any error the client's bytes, unannotated."""
        body = ctx.body
        if body is None:
            return raw, {}, False
        client_usage = ctx.stream and isinstance(body.get("stream_options"), dict) and \
            body["stream_options"].get("include_usage") is True
        inject_usage = ctx.stream and ctx.record_wanted and self.options.stream_usage \
            and not client_usage and ctx.kind in ("chat", "completions")
        ann, patch, hint_headers = ctx.annotation, {}, {}
        try:
            if ann is not None and ctx.dialect is not None:
                patch, hint_headers = render_dialect(ctx.dialect, hint_values(ann, ctx.meta), body,
                                                     ctx.kind, order, self.options.dynamo_api,
                                                     ctx.identity_source)
            if ctx.engine_session is not None:
                patch = {**patch, "session_id": ctx.engine_session}
            fwd = forward_body(raw, body, where, ctx.annotation_dict(),
                               strip_metadata=self.options.strip_metadata,
                               request_stream_usage=inject_usage, extra_fields=patch)
        except (ValueError, TypeError, RecursionError) as exc:
            # fail open: the client's bytes as they came (never a re-encoding we cannot trust)
            log.warning("request %s forwarded unannotated: %s", ctx.request_id, exc)
            self.metrics.annotate_outcome("error").inc()
            ctx.annotation = None
            return raw, {}, False
        if ann is not None:
            self.metrics.dialect.labels(ctx.dialect or "none").inc()
        return fwd, hint_headers, inject_usage

    async def _forward(self, request: Request, ctx: "_CallContext", fwd: bytes,
                       hint_headers: dict, inject_usage: bool) -> Response:
        """Send upstream and relay the answer: streamed chunk by chunk, or whole; the completed
        call is logged and observed after the client has it."""
        try:
            resp, failed = await self._send(request, ctx.upstream, fwd, hint_headers)
        except BaseException:
            self.router.finished(ctx.request_id)
            raise
        if failed is not None:
            self.router.finished(ctx.request_id)
            await self._failed(ctx, failed.status_code, "no_response")
            return failed
        if resp.status >= 400:
            await self._failed(ctx, resp.status, f"http_{resp.status}")
        if ctx.stream and resp.status == 200 and resp.content_type == "text/event-stream":
            return self._stream_response(resp, ctx, strip_usage_chunk=inject_usage)
        try:
            content = await self._read_all(resp, ctx.upstream)
        finally:
            self.router.finished(ctx.request_id)
        if isinstance(content, Response):
            if resp.status < 400:
                await self._failed(ctx, content.status_code, "broken")
            return content
        out = _raw_response(resp, content)
        if resp.status == 200 and ctx.record_wanted:  # logged after the client has its answer
            out.background = BackgroundTask(self._completed_raw, ctx, content,
                                            resp.headers.get("content-encoding"), time.time())
        return out

    async def _failed(self, ctx: "_CallContext", status: int, why: str) -> None:
        """An attempt that produced no answer: log it, roll its session advance back (a retry
        advances afresh; a call that fails for good leaves the session as it was), trace it."""
        level = logging.INFO if 400 <= status < 500 and status != 429 else logging.WARNING
        rolled = False
        if ctx.meta is not None and ctx.annotation is not None and ctx.advanced \
                and self.annotator is not None:
            try:
                rolled = await self.annotator.cancel(ctx.meta, ctx.request_id)
            except Exception as exc:
                log.warning("rollback of %s failed: %s", ctx.request_id, exc)
        if rolled:
            self.metrics.retries.labels("rolled_back").inc()
        log.log(level, "upstream %s failed %s (%s) for request %s%s", ctx.upstream, status, why,
                ctx.request_id, "; session rolled back" if rolled else "")
        if self.tracer is not None and ctx.body is not None:
            self.tracer.record(endpoint=ctx.kind, model=ctx.body.get("model"), meta=ctx.meta,
                               ann=ctx.annotation, identity_source=ctx.identity_source,
                               dialect=ctx.dialect, t_arrival=ctx.t_arrival, t_finish=time.time(),
                               status=status, error=why)

    async def _completed_raw(self, ctx: "_CallContext", content: bytes, encoding: str | None,
                             t_finish: float) -> None:
        decoded = _decode(content, encoding)
        parsed, exact = None, True
        if decoded is not None:
            try:
                parsed = orjson.loads(decoded)
            except orjson.JSONDecodeError:
                try:   # what orjson refuses (NaN, 1e400): read leniently, logged exactly
                    parsed, exact = json.loads(decoded), False
                except ValueError:
                    parsed = None
        await self._completed(ctx, parsed, t_first_token=None, t_finish=t_finish, exact=exact)

    def _stream_response(self, resp: aiohttp.ClientResponse, ctx: "_CallContext",
                         strip_usage_chunk: bool) -> StreamingResponse:
        follower = StreamFollower()
        done = {"complete": False, "t_finish": None, "last": None, "final": False}
        native = ctx.kind in ("responses", "generate")

        def track(events) -> None:
            for e in events:
                done["last"], final = stream_final(ctx.kind, e.data, done["last"])
                done["final"] = done["final"] or final

        async def relay():
            try:
                async for chunk in resp.content.iter_any():
                    events = follower.feed(chunk)
                    if native:
                        track(events)
                    if follower.malformed:
                        self.metrics.sse_malformed.inc(follower.malformed)
                        follower.malformed = 0
                    # whole events only (byte for byte): a stream that breaks off never leaves
                    # the client half an event in front of the error event below
                    kept = [e.raw for e in events if not (strip_usage_chunk and e.usage_only)]
                    if kept:
                        yield b"".join(kept)
                tail = follower.flush()
                if native:
                    track(tail)
                if tail and not (strip_usage_chunk and tail[0].usage_only):
                    yield tail[0].raw
                done["complete"] = follower.saw_done or follower.finish_reason is not None \
                    or done["final"]
                done["t_finish"] = time.time()
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                timed_out = isinstance(exc, asyncio.TimeoutError)
                self.metrics.upstream_outcome(ctx.upstream, "timeout" if timed_out else "stream_broken").inc()
                log.warning("upstream stream broke off (%s): %r", ctx.upstream, exc)
                await self._failed(ctx, 504 if timed_out else 502, "stream_broken")
                if resp.headers.get("content-encoding", "identity") == "identity":
                    yield sse_error_event(ctx.kind, exc)   # the client learns why, in-band
            finally:
                if done["complete"]:
                    resp.release()
                else:
                    resp.close()  # client gone or upstream broke: do not reuse the connection

        async def after() -> None:  # runs once the client has the whole stream
            if done["complete"] and ctx.record_wanted:
                response = done["last"] if native else follower.response(chat=ctx.chat)
                await self._completed(ctx, response, t_first_token=follower.t_first_token,
                                      t_finish=done["t_finish"], exact=not follower.lenient)

        return _RelayResponse(relay(), resp, self.router, ctx.request_id, after)

    async def _completed(self, ctx: "_CallContext", response: dict | None, *,
                         t_first_token: float | None, t_finish: float, exact: bool = True) -> None:
        """Log the gateway record and observe the completion (a successful call only).
        ``exact=False``: the response was parsed leniently (the log encodes it exactly)."""
        if ctx.engine_session is not None and self._session_ended(ctx):   # release its KV
            self.sessions.close_soon(ctx.upstream, ctx.engine_session)
        response = as_chat_response(ctx.kind, response)
        if not isinstance(response, dict):
            self.metrics.record_outcome("not_json").inc()
            return
        usage = response.get("usage") or {}
        out_tokens, in_tokens = usage.get("completion_tokens"), usage.get("prompt_tokens")
        first = self.retries.completed(ctx.request_id)   # False: a retry of a completed call
        if self.tracer is not None and ctx.body is not None:
            self.tracer.record(endpoint=ctx.kind, model=ctx.body.get("model"), meta=ctx.meta,
                               ann=ctx.annotation, identity_source=ctx.identity_source,
                               dialect=ctx.dialect, t_arrival=ctx.t_arrival, t_finish=t_finish,
                               status=200, input_tokens=in_tokens, output_tokens=out_tokens)
        if ctx.meta is None or not first:
            return
        if out_tokens is None or in_tokens is None:
            self.metrics.record_outcome("no_usage").inc()
            return
        choice = (response.get("choices") or [{}])[0] or {}
        message = choice.get("message") or {}
        text = message.get("content") if ctx.chat else choice.get("text")
        if self.log is not None:
            self.log.write({  # counted as written by the log thread once the line is on disk
                "request_id": ctx.request_id, "t_arrival": ctx.t_arrival,
                "t_first_token": t_first_token, "t_finish": t_finish,
                "request": _with_identity(ctx), "response": response, "status": "ok",
                "sys_annotations": ctx.annotation_dict(),
                "upstream": ctx.upstream,
                "gateway": {"annotate": ctx.outcome, "stream": ctx.stream,
                            "client_request_id": ctx.client_request_id, "endpoint": ctx.kind,
                            "identity_source": ctx.identity_source, "dialect": ctx.dialect},
            }, exact=exact)
        if self.annotator is not None:
            tools = [tc.get("function", {}).get("name") for tc in message.get("tool_calls") or ()
                     if isinstance(tc, dict)]
            await self.annotator.observe({
                "app_metadata": ctx.meta, "request_id": ctx.request_id,
                "output_tokens": out_tokens, "input_tokens": in_tokens,
                "t_arrival": ctx.t_arrival, "t_finish": t_finish,
                "response_text": text[:OBSERVE_TEXT_CHARS] if isinstance(text, str) else None,
                "tool_names": [t for t in tools if t], "status": "ok"})

    def _session_ended(self, ctx: "_CallContext") -> bool:
        """Whether the call ended its workflow: the annotation's ``session_end``, or — a call
        forwarded unannotated (over budget, failed) — the client's own ``last_call``."""
        if ctx.annotation is not None:
            return ctx.annotation.session_end is True
        return self.options.session_end.enabled and isinstance(ctx.meta, dict) \
            and ctx.meta.get("last_call") is True

    # -- plain pass-through (GET /v1/models and anything else) ------------------------------------
    async def passthrough(self, request: Request) -> Response:
        if not path_forwarded(request.url.path, self.options.forward_paths):
            self.metrics.refused.inc()
            return _error_response(404, "not_found", "path not forwarded by the gateway")
        raw = await request.body()
        request_id = f"gw-{uuid.uuid4().hex}"
        upstream = self.router.choose_upstream(request_id, None, None, None)
        try:
            resp, failed = await self._send(request, upstream, raw or None)
            if failed is not None:
                return failed
            if resp.content_type == "text/event-stream":
                async def relay():
                    try:
                        async for chunk in resp.content.iter_any():
                            yield chunk
                    finally:
                        resp.close()
                        self.router.finished(request_id)
                out = _RelayResponse(relay(), resp, self.router, request_id)
                request_id = None  # finished by the relay
                return out
            content = await self._read_all(resp, upstream)
            return content if isinstance(content, Response) else _raw_response(resp, content)
        finally:
            if request_id is not None:
                self.router.finished(request_id)


def sse_error_event(kind: str, exc: BaseException) -> bytes:
    """The in-band error a client gets when the upstream's stream breaks off mid-way (issue 24:
    the stream used to just stop). The engines' own form: SGLang and vLLM end a failed stream
    with ``data: {"error": {...}}`` and ``data: [DONE]`` (the OpenAI SDK raises ``APIError`` on
    the error event); the Responses API has a typed ``event: error``. No host or port is named.
    """
    timed_out = isinstance(exc, asyncio.TimeoutError)
    kind_name = "upstream_timeout" if timed_out else "upstream_broken"
    message = ("upstream stopped sending mid-stream" if timed_out else
               f"upstream broke off mid-stream ({type(exc).__name__}); the response is incomplete")
    if kind == "responses":
        return b"event: error\ndata: " + json.dumps(
            {"type": "error", "code": kind_name, "message": message, "param": None}).encode() + b"\n\n"
    error = {"error": {"message": message, "type": kind_name, "code": 504 if timed_out else 502}}
    return b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n"


class _RelayResponse(StreamingResponse):
    """A streamed upstream response that always frees its upstream connection and router slot.

    The relay generator's ``finally`` does that when it runs; but if the client is gone before
    the first chunk (sending the headers fails), the generator never starts and its ``finally``
    never runs — :meth:`__call__` then closes the upstream response and reports the request
    finished itself (both are idempotent).
    """

    def __init__(self, iterator, resp: aiohttp.ClientResponse, router, request_id: str,
                 after=None) -> None:
        super().__init__(iterator, status_code=resp.status)
        self.raw_headers = _headers_out(resp)
        self._upstream, self._router, self._request_id, self._after = resp, router, request_id, after

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if not self._upstream.closed:
                self._upstream.close()
            self._router.finished(self._request_id)
        if self._after is not None:
            await self._after()


def _swallow(task: asyncio.Future) -> None:
    """Retrieve a cancelled annotation's outcome so asyncio does not log it as unhandled."""
    if not task.cancelled():
        task.exception()


@dataclass
class _CallContext:
    request_id: str
    t_arrival: float
    body: dict | None
    meta: dict | None
    annotation: Annotation | None       # the typed contract, end to end (rendered only at the edges)
    outcome: str
    upstream: str
    chat: bool
    stream: bool
    record_wanted: bool
    client_request_id: str | None = None
    kind: str = "chat"                  # serving_hooks.endpoints kind
    identity_source: str | None = None  # serving_hooks.identity source
    dialect: str | None = None
    advanced: bool = True               # this attempt advanced the session (roll back on failure)
    engine_session: str | None = None   # SGLang session the call is tagged with (--sglang-sessions)
    _annotation_dict: dict | None = None

    def annotation_dict(self) -> dict | None:
        """``annotation.to_dict()``, rendered once per call: the forwarded body and the call's
        log record carry the same dict."""
        if self.annotation is None:
            return None
        if self._annotation_dict is None:
            self._annotation_dict = self.annotation.to_dict()
        return self._annotation_dict


def _with_identity(ctx: _CallContext) -> dict | None:
    """The logged request: with the identity the gateway derived (headers, ``metadata``) as
    ``app_metadata``, so ``profiler fit`` learns the same ids the gateway predicts with."""
    if ctx.body is None or ctx.identity_source in (None, "app_metadata"):
        return ctx.body
    return {**ctx.body, "app_metadata": ctx.meta}


def create_gateway_app(gateway: Gateway) -> FastAPI:
    """The gateway's ASGI app (docs/serving.md)."""
    registry = gateway.registry
    requests_total, request_seconds = request_metrics(registry, "profiler_gateway")
    admin = admin_auth(gateway.options.admin_token)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await gateway.start()
        try:
            yield
        finally:
            await gateway.aclose()

    app = FastAPI(title="agent-workflow-profiler gateway", version="1", lifespan=lifespan, **NO_CDN_DOCS,
                  description="OpenAI-compatible proxy that injects workflow predictions "
                              "(sys_annotations) and logs completed calls for refitting. "
                              "Proxied (not listed here): POST /v1/chat/completions and "
                              "POST /v1/completions, POST /v1/responses and SGLang's POST /generate "
                              "(annotated), GET /v1/models and the other "
                              "paths of the allow-list (the allow_path setting); engine admin paths never.")
    app.state.gateway = gateway
    mount_local_docs(app)
    app.add_middleware(RequestMetricsMiddleware, requests=requests_total, latency=request_seconds)
    if gateway.options.max_request_bytes:
        app.add_middleware(BodySizeLimit, max_bytes=gateway.options.max_request_bytes,
                           body_timeout_s=gateway.options.body_timeout_s)

    @app.get("/healthz", tags=["gateway"])
    async def healthz() -> dict:
        """Liveness, profile version and online-refit state (no URLs or paths: see /admin/profile).
        With ``--sidecar``, the sidecar is asked too: ``status`` is ``degraded`` (still 200: calls
        are forwarded, without predictions) and ``sidecar`` says why while it does not answer."""
        svc = gateway.service
        out = {"status": "ok", "upstreams": len(gateway.router.upstreams),
               "profile_version": svc.predictor.version if svc is not None else None,
               "predictions": "in_process" if svc is not None else
               "sidecar" if gateway.annotator is not None else "none"}
        health = await gateway.annotator.health() if gateway.annotator is not None else None
        if health is not None:      # a sidecar: is it answering?
            out["sidecar"] = health
            if health != "ok":
                out["status"] = "degraded"
        if svc is not None:
            out["refit"] = svc.refit.as_dict()
            out["last_reload_error"] = svc.reloader.last_error if svc.reloader else None
        if gateway.log is not None:
            out["log"] = {"recovered_files": gateway.log.recovered_files,
                          "recovered_torn_lines": gateway.log.recovered_torn_lines,
                          "write_errors": gateway.log.write_errors}
        return out

    @app.get("/readyz", tags=["gateway"])
    async def readyz() -> JSONResponse:
        """Readiness: 200 once the profile is loaded and warmed up (or the sidecar was asked),
        503 before — point a load balancer's or Kubernetes' readiness probe here."""
        svc = gateway.service
        loaded = svc is None or svc.predictor.version is not None
        if not (gateway.ready and loaded):
            return JSONResponse({"ready": False}, status_code=503)
        return JSONResponse({"ready": True,
                             "profile_version": svc.predictor.version if svc is not None else None})

    @app.get("/metrics", tags=["gateway"])
    async def metrics() -> Response:
        body, ctype = render(registry)
        return Response(body, media_type=ctype)

    @app.get("/admin/profile", tags=["gateway"], dependencies=[Depends(admin)])
    async def profile() -> JSONResponse:
        """The in-process profile (with ``--profile``); 404 with ``--sidecar`` (ask the sidecar).
        Holds file paths and every workflow type clients sent: bearer token when configured."""
        if gateway.service is None:
            return JSONResponse({"detail": "predictions come from a sidecar: GET its /v1/profile"},
                                status_code=404)
        summary = gateway.service.profile_summary()
        summary["upstreams"] = gateway.router.upstreams
        if gateway.pools is not None:
            summary["pools"] = gateway.pools.as_dict()
        return JSONResponse(summary)

    @app.post("/admin/reload", tags=["gateway"], dependencies=[Depends(admin)])
    async def reload() -> dict:
        if gateway.service is None:
            return {"reloaded": False, "detail": "no in-process profile (sidecar mode)"}
        ok = await asyncio.to_thread(gateway.service.reload)
        reloader = gateway.service.reloader   # why a version was refused, as the sidecar replies
        return {"reloaded": ok, "profile_version": gateway.service.predictor.version,
                "error": reloader.last_error if reloader else
                "profile was given as a version folder: nothing to reload"}

    @app.post("/admin/rotate-log", tags=["gateway"], dependencies=[Depends(admin)])
    async def rotate_log() -> dict:
        """Close the current log file now so a refit sees it."""
        if gateway.log is None:
            return {"rotated": False, "detail": "no --log-dir"}
        await asyncio.to_thread(gateway.log.rotate)
        return {"rotated": True, "records_written": gateway.log.records_written}

    # The OpenAI routes are plain Starlette routes: no dependency injection or body validation
    # on the hot path (the upstream validates); they are OpenAI's API, documented there.
    app.add_route("/v1/chat/completions", gateway.proxy_call, methods=["POST"])
    app.add_route("/v1/completions", gateway.proxy_call, methods=["POST"])
    app.add_route("/v1/responses", gateway.proxy_call, methods=["POST"])
    app.add_route("/generate", gateway.proxy_call, methods=["POST"])
    app.add_route("/v1/models", gateway.passthrough, methods=["GET"])
    app.add_route("/{path:path}", gateway.passthrough,
                  methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"])
    return app
