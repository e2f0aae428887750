"""Which upstream gets a request: the gateway's routing seam.

The gateway only talks to an :class:`UpstreamRouter`::

    url = router.choose_upstream(request_id, body, annotation, app_metadata)
    ...forward, stream...
    router.finished(request_id)          # always called, success or error

Two implementations:

* :class:`RoundRobinRouter` — cycles through the ``--upstream`` URLs; no state per request.
* :class:`CapacityRouting` — adapts :class:`serving_hooks.routing.CapacityRouter` (Pythia alg. 2:
  refuse a worker whose KV capacity the predicted upper bounds could overflow, keep a session
  on the worker that holds its prefix; it polls each worker's ``GET /v1/loads`` and, when a
  report is stale, judges on its own record of what it sent — never round robin). It needs the
  prompt size before the upstream has tokenized it: :func:`estimate_prompt_tokens` uses
  characters / 4, the usual rule of thumb for English text under BPE tokenizers.

Both take an optional :class:`~serving_hooks.policies.pools.ModelPools` (``--upstream
URL,pool=MODEL``): a request then goes only to the upstreams of the model its body names
(``model``), or to the upstreams without a pool; a model nobody serves raises
:class:`~serving_hooks.policies.pools.NoReplicaForModel` (the gateway answers 404). Round robin
keeps one turn per candidate set; the capacity router keeps a session's last upstream per pool.
``queue_depths()`` gives the upstreams' waiting requests (from the load reports; none under
round robin), which the gateway sums per pool for the priority's idle-downstream term.

The connections themselves: :class:`UpstreamClient` (the pooled HTTP/1.1 client, its idle
keep-alive shorter than the engine's, and one retry of a request that met a connection the
engine had already closed).
"""
from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import Any, Protocol, Sequence

import aiohttp

from predictors.contract import Annotation
from serving_hooks.policies.pools import ModelPools
from serving_hooks.routing import CapacityRouter
from serving_hooks.settings import GatewaySettings


def normalize_upstream(url: str) -> str:
    """``http://h:p``, ``http://h:p/`` and ``http://h:p/v1`` all name the same OpenAI server."""
    url = url.strip().rstrip("/")
    if url.endswith("/v1"):
        url = url[:-3]
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"upstream {url!r}: expected an http:// or https:// URL")
    return url


class UpstreamRouter(Protocol):
    """What the gateway needs of a router (module doc)."""

    upstreams: list[str]

    def choose_upstream(self, request_id: str, body: Any, annotation: Annotation | None,
                        app_metadata: dict | None) -> str: ...

    def finished(self, request_id: str) -> None: ...

    def queue_depths(self) -> dict[str, int]: ...

    def routing_stats(self) -> dict[str, int] | None: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


def request_model(body: Any) -> str | None:
    """The model a request body names (OpenAI's ``model`` field), if any."""
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


class RoundRobinRouter:
    """Cycle through the upstreams in order (with pools: through the request's candidates)."""

    def __init__(self, upstreams: Sequence[str], pools: ModelPools | None = None) -> None:
        if not upstreams:
            raise ValueError("at least one --upstream URL is needed")
        self.upstreams = [normalize_upstream(u) for u in upstreams]
        self.pools = pools if pools is not None and pools.pooled else None
        self._turns: dict[tuple[str, ...], itertools.count] = {}

    def choose_upstream(self, request_id: str, body: Any, annotation: Annotation | None,
                        app_metadata: dict | None) -> str:
        cands = tuple(self.pools.candidates(request_model(body)) if self.pools else self.upstreams)
        turn = self._turns.setdefault(cands, itertools.count())
        return cands[next(turn) % len(cands)]

    def finished(self, request_id: str) -> None:
        return None

    def queue_depths(self) -> dict[str, int]:
        """Round robin polls no load reports: no queue depth is known."""
        return {}

    def routing_stats(self) -> None:
        """Round robin takes no decisions worth counting."""
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None


def estimate_prompt_tokens(body: Any) -> int:
    """Rough prompt size in tokens (characters / 4) of a chat or completions request body."""
    if not isinstance(body, dict):
        return 0
    if "messages" in body:
        text = json.dumps(body["messages"], ensure_ascii=False)
    else:
        prompt = body.get("prompt", "")
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    return len(text) // 4


class CapacityRouting:
    """:class:`UpstreamRouter` over :class:`serving_hooks.routing.CapacityRouter`."""

    def __init__(self, upstreams: Sequence[str], pools: ModelPools | None = None,
                 **router_kwargs: Any) -> None:
        self.upstreams = [normalize_upstream(u) for u in upstreams]
        self.pools = pools if pools is not None and pools.pooled else None
        self.router = CapacityRouter(self.upstreams, **router_kwargs)

    def choose_upstream(self, request_id: str, body: Any, annotation: Annotation | None,
                        app_metadata: dict | None) -> str:
        """The worker for one request: its annotation contract's bound (as the simulator builds
        it) checked against the KV capacity of every worker that serves its model."""
        ann = annotation
        session = ann.workflow_id if ann is not None else None
        if session is None and isinstance(app_metadata, dict) and app_metadata.get("workflow_id") is not None:
            session = str(app_metadata["workflow_id"])
        workers = None
        if self.pools is not None:
            model = request_model(body)
            workers = self.pools.candidates(model)
            pool = self.pools.pool_of(model)
            if session is not None and pool is not None:
                session = f"{session}@{pool}"      # one home per session and pool
        return self.router.decide_annotated(request_id, session, estimate_prompt_tokens(body), ann,
                                            workers=workers).worker

    def finished(self, request_id: str) -> None:
        self.router.on_finish(request_id)

    def queue_depths(self) -> dict[str, int]:
        """Waiting requests per upstream from the latest ``/v1/loads`` reports."""
        return self.router.queue_depths()

    def routing_stats(self) -> dict[str, int]:
        """The router's decision counters (the gateway's ``/metrics`` reads them at scrape)."""
        return self.router.metrics()

    async def start(self) -> None:
        await self.router.start()

    async def aclose(self) -> None:
        await self.router.aclose()


#: Seconds a pooled upstream connection may sit idle before the gateway drops it: below the
#: engine's own idle limit (SGLang serves through uvicorn, whose ``timeout_keep_alive`` is 5 s),
#: so the gateway closes a connection before the engine does (the ``upstream_keepalive`` setting).
DEFAULT_UPSTREAM_KEEPALIVE_S = GatewaySettings.upstream_keepalive


def stale_connection_error(exc: BaseException, reused: bool) -> bool:
    """Whether a failed upstream request is safe to send again: it failed on a **reused** pooled
    connection, with a connection error (aiohttp ``ClientOSError`` — e.g. ``Can not write request
    body`` — or ``ServerDisconnectedError``) before any response byte came back.

    Why that means the engine saw nothing: an HTTP/1.1 server closes a persistent connection only
    between requests (uvicorn's idle ``timeout_keep_alive``; RFC 9112 §9.3.1.1 names exactly
    this race as the reason clients retry), so a request that meets a connection closed under it,
    with no response, was never read. aiohttp retries this case itself only for idempotent
    methods, never for POST. A fresh connection that fails (``ClientConnectorError``: refused,
    unreachable) is not this case and is not retried: the next attempt would meet the same.
    """
    if not reused or isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError))


class UpstreamClient:
    """The gateway's HTTP/1.1 client to its upstreams: one pooled ``aiohttp.ClientSession``
    (keep-alive, no automatic decompression, no headers of its own) plus a stale-connection retry.

    * Pooled connections idle longer than ``keepalive_s`` are not reused
      (:data:`DEFAULT_UPSTREAM_KEEPALIVE_S`, shorter than the engine's own idle limit).
    * A request that fails on a reused connection before any response byte
      (:func:`stale_connection_error`) is sent once more on a **fresh** connection (a one-shot
      connector, so it cannot meet another stale pooled one); ``retried`` counts them. A request
      whose response had begun is never resent.
    """

    def __init__(self, *, keepalive_s: float = DEFAULT_UPSTREAM_KEEPALIVE_S,
                 max_connections: int = 1024, connect_timeout_s: float = 10.0,
                 read_timeout_s: float = 600.0, skip_auto_headers: Sequence[str] = (),
                 retry_stale: bool = True) -> None:
        if keepalive_s < 0:
            raise ValueError(f"upstream keep-alive must be >= 0 s, not {keepalive_s}")
        self.keepalive_s, self.max_connections = keepalive_s, max_connections
        self.retry_stale = retry_stale
        self._session_kw = dict(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout_s,
                                          sock_read=read_timeout_s),
            auto_decompress=False, trust_env=False, skip_auto_headers=tuple(skip_auto_headers))
        self.session: aiohttp.ClientSession | None = None
        self._fresh: aiohttp.ClientSession | None = None
        self.retried = 0

    async def start(self) -> None:
        trace = aiohttp.TraceConfig()
        trace.on_connection_reuseconn.append(_mark_reused)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                           keepalive_timeout=self.keepalive_s or None,
                                           force_close=self.keepalive_s == 0),
            trace_configs=[trace], **self._session_kw)
        self._fresh = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True),
                                            **self._session_kw)

    async def request(self, method: str, url: str, *, data: bytes | None,
                      headers: list[tuple[str, str]]) -> tuple[aiohttp.ClientResponse, bool]:
        """Send one request: ``(response, retried)`` once the status line and headers are in
        (``retried``: the first attempt met a stale connection and this is the second). Raises
        what aiohttp raises when no response comes, after that one retry."""
        ctx = SimpleNamespace(reused=False)
        try:
            return await self.session.request(method, url, data=data, headers=headers,
                                              allow_redirects=False, trace_request_ctx=ctx), False
        except (aiohttp.ClientError, OSError) as exc:
            if not (self.retry_stale and stale_connection_error(exc, ctx.reused)):
                raise
        self.retried += 1
        return await self._fresh.request(method, url, data=data, headers=headers,
                                         allow_redirects=False), True

    async def aclose(self) -> None:
        for s in (self.session, self._fresh):
            if s is not None:
                await s.close()


async def _mark_reused(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
    """aiohttp trace hook: this request got a pooled connection (not a new one)."""
    if isinstance(ctx.trace_request_ctx, SimpleNamespace):
        ctx.trace_request_ctx.reused = True
