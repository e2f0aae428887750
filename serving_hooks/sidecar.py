"""The prediction sidecar: ``profiler serve --profile DIR`` (FastAPI).

Endpoints (OpenAPI at ``/docs`` and ``/openapi.json``):

=========================  ===================================================================
``POST /v1/annotate``      one call's ``app_metadata`` → ``sys_annotations`` (+ ``custom_params``
                           on request); advances the session
``POST /v1/annotate:batch``  up to :data:`MAX_BATCH` calls in one round trip (same rules, in order)
``POST /v1/observe``       a finished call (output tokens, …) → advances/scores the session
                           (admin: bearer token when configured)
``POST /v1/reload``        load the version ``CURRENT`` names now (admin)
``GET /v1/profile``        active version, provenance, workflow types, shadow-mode state (admin)
``GET /v1/sessions/{wt}/{wf}``  one session's state, its last responses included (admin)
``GET /v1/autoscale``      replicas per model for the work the live sessions will send next
                           (Pythia alg. 4; ``?horizon=&window_s=&concurrency=&utilization=``;
                           admin)
``GET /healthz``           liveness, active version, online-refit state
``GET /metrics``           Prometheus: requests, latency histogram, unknown rate, profile version
=========================  ===================================================================

Annotate is synchronous compute of a few microseconds, so its handler is ``async`` and runs on
the event loop directly (no thread-pool hop). The profile is swapped by
:class:`serving_hooks.profile_reload.ProfileReloader` in a background thread; a request reads the
active profile once, so a swap in the middle of a stream of requests fails none of them.

With an admin token, every endpoint that returns session contents, file paths or the profile
needs it (``/v1/sessions``, ``/v1/profile``, ``/v1/observe``, ``/v1/reload``, and
``/v1/autoscale``, which reveals the live load per workflow type); annotate, ``/healthz`` and
``/metrics`` stay open. JSON bodies must be strict JSON
(:func:`serving_hooks.http_guard.strict_json_loads`): ``NaN``, ``Infinity``, ``1e400`` or a lone
surrogate get ``400``. A batch yields the event loop every :data:`BATCH_YIELD_EVERY` items, so a
full batch delays other requests by a few milliseconds at most.
"""
from __future__ import annotations

import time
import asyncio
from contextlib import asynccontextmanager
from typing import Any, Literal, Sequence

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, ConfigDict, Field

from predictors.contract import Annotation, to_sglang_custom_params
from serving_hooks.api_docs import NO_CDN_DOCS, mount_local_docs
from serving_hooks.http_guard import BodySizeLimit, StrictJSONBody, admin_auth
from serving_hooks.metrics import RequestMetricsMiddleware, render, request_metrics
from policies import AutoscalePolicy
from serving_hooks.service import PredictionService

API_TITLE = "agent-workflow-profiler prediction sidecar"
#: Most calls in one ``POST /v1/annotate:batch`` (422 beyond; send several batches).
MAX_BATCH = 256
#: A batch hands the event loop back after this many items (other requests interleave).
BATCH_YIELD_EVERY = 32
#: ``GET /v1/autoscale`` bounds (422 outside): the replica count divides busy seconds by
#: ``window_s × concurrency × utilization``, so a positive but tiny window or utilization
#: (``1e-320``) overflowed to ``inf`` or underflowed to a division by zero (500s, issue 24).
MIN_WINDOW_S, MAX_WINDOW_S = 1e-3, 1e7
MIN_UTILIZATION = 0.01
MAX_CONCURRENCY = 1 << 20


class AppMetadata(BaseModel):
    """What the client says about its call (docs/log-format.md). Missing ids give ``known: false``."""

    model_config = ConfigDict(extra="allow")
    workflow_type_id: str | None = Field(None, examples=["coding_assistant"])
    workflow_id: str | None = Field(None, examples=["s-42"])
    agent_id: str | None = Field(None, examples=["engineer"])
    parent_request_ids: list[str] | None = None


class AnnotateRequest(BaseModel):
    app_metadata: AppMetadata
    request_id: str | None = Field(None, description="makes the session advance idempotent and "
                                   "lets /v1/observe score the band this call was given")
    input_tokens: int | None = Field(None, ge=0, description="prompt tokens, for the conditional "
                                     "output-length model")
    advance: bool = Field(True, description="false: answer without advancing the session")
    sglang: bool = Field(False, description="also return SGLang's flat custom_params")


#: The predictor's answer: the annotation contract itself (``predictors.contract.Annotation``,
#: every field documented there); ``known: false`` carries only ids, a reason and its detail.
SysAnnotations = Annotation


class AnnotateResponse(BaseModel):
    sys_annotations: Annotation
    custom_params: dict[str, Any] | None = None


class AnnotateBatchRequest(BaseModel):
    requests: list[AnnotateRequest] = Field(..., max_length=MAX_BATCH,
                                            description=f"at most {MAX_BATCH} calls")


class AnnotateBatchResponse(BaseModel):
    results: list[AnnotateResponse]


class ObserveRequest(BaseModel):
    """A finished call. ``output_tokens`` is what the band is scored against."""

    app_metadata: AppMetadata
    request_id: str | None = None
    output_tokens: int | None = Field(None, ge=0)
    input_tokens: int | None = Field(None, ge=0)
    t_arrival: float | None = None
    t_finish: float | None = None
    response_text: str | None = None
    tool_names: list[str] | None = None
    status: Literal["ok", "error"] = "ok"


class ObserveResponse(BaseModel):
    in_band: bool | None = Field(None, description="output fell in the band the call was given "
                                 "(null: it had none)")


class ReloadResponse(BaseModel):
    reloaded: bool
    profile_version: str | None
    error: str | None = None


class Health(BaseModel):
    status: Literal["ok"]
    profile_version: str | None
    uptime_s: float
    sessions: int
    refit: dict[str, Any] | None = Field(None, description="online refits: runs, failures, last "
                                         "error (with --logs)")
    last_reload_error: str | None = None


def _annotate_one(service: PredictionService, req: AnnotateRequest) -> dict:
    meta = req.app_metadata.model_dump(exclude_none=True)
    ann = service.annotate_call(meta, request_id=req.request_id, input_tokens=req.input_tokens,
                                advance=req.advance)
    out: dict[str, Any] = {"sys_annotations": ann.to_dict()}
    if req.sglang:
        out["custom_params"] = to_sglang_custom_params(ann, meta)
    return out


def create_sidecar_app(service: PredictionService, *, registry: CollectorRegistry | None = None,
                       admin_token: str | None = None, max_request_bytes: int = 1 << 20,
                       body_timeout_s: float | None = 30.0,
                       background: list | None = None, routers: Sequence[APIRouter] = ()) -> FastAPI:
    """The sidecar ASGI app over a :class:`PredictionService`.

    ``registry`` must be the one ``service.metrics`` was created in. ``background`` holds objects
    with ``start()``/``stop()`` run for the app's lifetime (e.g. the online refit loop).
    ``routers`` are mounted as they are (extra endpoints, e.g. autoscale advice); their handlers
    reach the service as ``request.app.state.service``.
    """
    registry = registry or service.metrics.registry
    requests_total, request_seconds = request_metrics(registry, "profiler_sidecar")
    admin = admin_auth(admin_token)
    extras = list(background or [])

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        service.start()
        for obj in extras:
            obj.start()
        try:
            yield
        finally:
            for obj in reversed(extras):
                obj.stop()
            service.stop()

    app = FastAPI(title=API_TITLE, version="1", lifespan=lifespan, **NO_CDN_DOCS,
                  description="Per-call predictions (output-length band, next agents, remaining "
                              "work, tool latency) from a workflow profile. See README, section "
                              "'Serving predictions'.")
    app.state.service = service
    mount_local_docs(app)

    app.add_middleware(StrictJSONBody)
    app.add_middleware(RequestMetricsMiddleware, requests=requests_total, latency=request_seconds)
    if max_request_bytes:
        app.add_middleware(BodySizeLimit, max_bytes=max_request_bytes, body_timeout_s=body_timeout_s)

    @app.post("/v1/annotate", response_model=AnnotateResponse, tags=["predict"])
    async def annotate(req: AnnotateRequest) -> JSONResponse:
        """sys_annotations for one call; never fails because the prediction is unknown."""
        return JSONResponse(_annotate_one(service, req))

    @app.post("/v1/annotate:batch", response_model=AnnotateBatchResponse, tags=["predict"])
    async def annotate_batch(req: AnnotateBatchRequest) -> JSONResponse:
        """Annotate up to 256 calls in one round trip, in order."""
        results = []
        for i, r in enumerate(req.requests):
            if i and i % BATCH_YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let other requests in
            results.append(_annotate_one(service, r))
        return JSONResponse({"results": results})

    @app.post("/v1/observe", response_model=ObserveResponse, tags=["predict"],
              dependencies=[Depends(admin)])
    async def observe(req: ObserveRequest) -> JSONResponse:
        """Record a finished call: advances the session and scores its band (live coverage)."""
        completion = req.model_dump(exclude_none=True)
        completion["app_metadata"] = req.app_metadata.model_dump(exclude_none=True)
        return JSONResponse({"in_band": service.observe(completion)})

    @app.post("/v1/reload", response_model=ReloadResponse, tags=["admin"], dependencies=[Depends(admin)])
    async def reload() -> ReloadResponse:
        """Load the version the profile root's CURRENT names now (it is also polled)."""
        ok = await asyncio.to_thread(service.reload)
        return ReloadResponse(reloaded=ok, profile_version=service.predictor.version,
                              error=service.reloader.last_error if service.reloader else
                              "profile was given as a version folder: nothing to reload")

    @app.get("/v1/profile", tags=["admin"], dependencies=[Depends(admin)])
    async def profile() -> dict:
        """Active profile: version, provenance, workflow types, shadow mode."""
        return service.profile_summary()

    @app.get("/v1/sessions/{workflow_type_id}/{workflow_id}", tags=["admin"],
             dependencies=[Depends(admin)])
    async def session(workflow_type_id: str, workflow_id: str) -> JSONResponse:
        """One session's state (agents so far, last outputs); 404 if not held."""
        view = service.predictor.session_view(workflow_type_id, workflow_id)
        if view is None:
            return JSONResponse({"detail": "no such session"}, status_code=404)
        view.pop("path_state", None)
        return JSONResponse(view)

    @app.get("/v1/autoscale", tags=["admin"], dependencies=[Depends(admin)])
    async def autoscale(horizon: int = Query(10, ge=1, le=1000, description="steps ahead"),
                        window_s: float | None = Query(None, ge=MIN_WINDOW_S, le=MAX_WINDOW_S,
                                                       description="seconds the horizon spans "
                                                       "(default: horizon × mean call cycle)"),
                        concurrency: int = Query(8, ge=1, le=MAX_CONCURRENCY,
                                                 description="batch slots per replica"),
                        utilization: float = Query(0.75, ge=MIN_UTILIZATION, le=1,
                                                   description="target utilization")
                        ) -> dict:
        """Suggested replicas per model: the live sessions' projected calls over the next
        ``horizon`` steps times each agent's profiled service time, over the window, divided by
        what one replica serves at the target utilization."""
        return service.autoscale(horizon, window_s,
                                 AutoscalePolicy(target_utilization=utilization, concurrency=concurrency))

    for router in routers:
        app.include_router(router)

    @app.get("/healthz", response_model=Health, tags=["admin"])
    async def healthz() -> Health:
        return Health(status="ok", profile_version=service.predictor.version,
                      uptime_s=time.time() - service.started_at,
                      sessions=service.predictor.session_count(),
                      refit=service.refit.as_dict() if service.refit.runs else None,
                      last_reload_error=service.reloader.last_error if service.reloader else None)

    @app.get("/metrics", tags=["admin"])
    async def metrics() -> Response:
        body, ctype = render(registry)
        return Response(body, media_type=ctype)

    return app
