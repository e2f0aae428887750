"""`profiler replay`: replay recorded workflows, closed loop, against an OpenAI-compatible server.

Each workflow of the plan (:mod:`serving_hooks.replay_plan`) runs as a small task graph: a call is
sent once all its parents have finished *and* its recorded tool/think gap has passed (times
``time_scale``), so a slower engine stretches the whole workflow exactly as it would stretch a
real agent. Workflows are released either ``concurrency`` at a time (a new one starts when one
ends: closed loop) or at ``rate`` per second with gamma-distributed inter-arrival times,

    Δt ~ Gamma(k = 1 / cv², θ = cv² / rate)    (mean 1 / rate, coefficient of variation cv;
                                                cv = 1 is Poisson, cv > 1 bursty)

optionally still capped at ``concurrency`` in flight. Every call is streamed (time to first token)
with ``stream_options.include_usage`` (prompt, completion and cached tokens as the engine counts
them), asks for ``max_tokens`` = the recorded output length and, by default, ``ignore_eos`` so the
engine really generates that many (SGLang and vLLM accept it; pass ``ignore_eos=False`` for servers
that reject unknown fields). The workflow identity travels as ``app_metadata`` in the body (what
the project's gateway reads) and/or as ``x-workflow-*`` headers.

Pooled connections: idle ones are dropped after :data:`KEEPALIVE_S` (below the 5 s after which
SGLang's uvicorn closes them), and a call that meets a pooled connection the server had already
closed, before any response byte, is sent again (:func:`open_stream`): the server read nothing.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np

from serving_hooks.replay_plan import PlannedCall, PlannedWorkflow
from serving_hooks.replay_prompts import Context, build_messages, estimate_tokens
from serving_hooks.settings import REPLAY_IDENTITY_MODES, ReplaySettings as R

IDENTITY_MODES = REPLAY_IDENTITY_MODES
#: Idle seconds before a pooled connection is dropped: below uvicorn's (SGLang's) 5 s.
KEEPALIVE_S = 4.0
#: Attempts of one call that keeps meeting closed pooled connections (each failure drops one).
STALE_ATTEMPTS = 4
#: httpx errors of a request whose connection was closed under it before any response byte.
STALE_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)


async def open_stream(client: httpx.AsyncClient, request: httpx.Request) -> httpx.Response:
    """``client.send(request, stream=True)``, sent again when it failed on a **reused** pooled
    connection before the response headers (``RemoteProtocolError: Server disconnected without
    sending a response``, a read or write error): an HTTP/1.1 server closes a persistent
    connection only between requests, so the server read nothing and resending is safe (the
    gateway does the same, :func:`serving_hooks.upstreams.stale_connection_error`). A failure
    on a new connection, or once the response has begun, is raised as is."""
    fresh = [False]

    async def trace(event: str, info: dict) -> None:
        if event.startswith("connection.connect_tcp."):
            fresh[0] = True      # a new connection: its failure is not the stale-pool race

    request.extensions = {**request.extensions, "trace": trace}
    for _ in range(STALE_ATTEMPTS - 1):
        fresh[0] = False
        try:
            return await client.send(request, stream=True)
        except STALE_ERRORS:
            if fresh[0]:
                raise
    return await client.send(request, stream=True)


@dataclass
class ReplayOptions:
    model: str | None = None          # None: the first model of GET /v1/models
    concurrency: int | None = 4       # workflows in flight (None: no cap, only with rate)
    rate: float | None = None         # workflow arrivals per second (None: closed loop)
    cv: float = 1.0                   # coefficient of variation of inter-arrival times
    time_scale: float = 1.0           # multiplies every recorded gap (0.1 = 10x faster)
    seed: int = 0
    ignore_eos: bool = R.ignore_eos  # the defaults of the wire knobs: ReplaySettings' (config keys)
    identity: str = R.identity
    run_tag: str = field(default_factory=lambda: uuid.uuid4().hex[:6])
    timeout_s: float = R.timeout
    extra_body: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.identity not in IDENTITY_MODES:
            raise ValueError(f"identity must be one of {', '.join(IDENTITY_MODES)}, not {self.identity!r}")
        if self.rate is None and not self.concurrency:
            raise ValueError("give a concurrency >= 1 or a rate > 0")
        if self.rate is not None and self.rate <= 0:
            raise ValueError(f"rate must be > 0, not {self.rate}")
        if self.cv <= 0:
            raise ValueError(f"cv must be > 0, not {self.cv}")
        if self.time_scale < 0:
            raise ValueError(f"time_scale must be >= 0, not {self.time_scale}")


@dataclass
class CallResult:
    workflow_type_id: str
    workflow_id: str
    request_id: str
    agent_id: str
    recorded_input_tokens: int
    recorded_output_tokens: int
    t_send: float
    t_first_token: float | None = None
    t_finish: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    status: str = "ok"
    error: str | None = None


@dataclass
class WorkflowResult:
    workflow_type_id: str
    workflow_id: str
    t_release: float
    t_end: float
    recorded_jct_s: float
    calls: int
    errors: int

    @property
    def jct_s(self) -> float:
        return self.t_end - self.t_release


@dataclass
class ReplayResult:
    calls: list[CallResult]
    workflows: list[WorkflowResult]
    wall_s: float
    model: str
    target: str
    options: ReplayOptions


def arrival_offsets(n: int, rate: float, cv: float, seed: int) -> np.ndarray:
    """Release times (s from the start) of ``n`` workflows: cumulative gamma inter-arrivals."""
    shape = 1.0 / cv**2
    gaps = np.random.default_rng(seed).gamma(shape, 1.0 / (rate * shape), n)
    gaps[0] = 0.0
    return np.cumsum(gaps)


def _api_base(target: str) -> str:
    base = target.rstrip("/")
    return base if base.endswith("/v1") else base + "/v1"


async def discover_model(client: httpx.AsyncClient, target: str) -> str:
    """The first model the server lists at ``/v1/models``."""
    resp = await client.get(_api_base(target) + "/models")
    resp.raise_for_status()
    data = resp.json().get("data") or []
    if not data:
        raise ValueError(f"{target} lists no model at /v1/models; pass --model")
    return str(data[0]["id"])


class _Replayer:
    def __init__(self, client: httpx.AsyncClient, target: str, model: str, opts: ReplayOptions,
                 on_call: Callable[[CallResult], None] | None) -> None:
        self.client, self.url, self.model, self.opts = client, _api_base(target) + "/chat/completions", model, opts
        self.on_call = on_call
        self.calls: list[CallResult] = []

    def _body_and_headers(self, wf: PlannedWorkflow, call: PlannedCall, wid: str,
                          messages: list[dict]) -> tuple[dict, dict]:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "max_tokens": call.output_tokens,
                                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
        if self.opts.ignore_eos:
            body["ignore_eos"] = True
        headers = dict(self.opts.headers)
        ident = {"workflow_type_id": wf.workflow_type_id, "workflow_id": wid, "agent_id": call.agent_id}
        if self.opts.identity in ("app_metadata", "both"):
            body["app_metadata"] = ident
        if self.opts.identity in ("headers", "both"):
            headers.update({"x-workflow-type-id": ident["workflow_type_id"],
                            "x-workflow-id": wid, "x-agent-id": call.agent_id})
        body.update(self.opts.extra_body)
        return body, headers

    async def _send(self, body: dict, headers: dict, res: CallResult) -> str:
        """Stream one call; fills ``res``; returns the reply text."""
        parts: list[str] = []
        try:
            request = self.client.build_request("POST", self.url, json=body, headers=headers)
            async with contextlib.aclosing(await open_stream(self.client, request)) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode("utf-8", "replace")
                    res.status, res.error = "error", f"HTTP {resp.status_code}: {text[:200]}"
                    return ""
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        res.status, res.error = "error", f"stream error: {json.dumps(chunk['error'])[:200]}"
                        break
                    for choice in chunk.get("choices") or ():
                        delta = choice.get("delta") or {}
                        piece = delta.get("content") or ""
                        if piece or delta.get("tool_calls") or delta.get("reasoning_content") \
                                or (choice.get("finish_reason") and res.t_first_token is None):
                            # tokens that decode to no text become visible with the finish chunk
                            if res.t_first_token is None:
                                res.t_first_token = time.time()
                            parts.append(piece)
                    usage = chunk.get("usage")
                    if usage:
                        res.prompt_tokens = usage.get("prompt_tokens")
                        res.completion_tokens = usage.get("completion_tokens")
                        details = usage.get("prompt_tokens_details") or {}
                        res.cached_tokens = details.get("cached_tokens")
        except (httpx.HTTPError, ValueError) as exc:
            res.status, res.error = "error", f"{type(exc).__name__}: {exc}"[:200]
        return "".join(parts)

    async def run_workflow(self, wf: PlannedWorkflow) -> WorkflowResult:
        t_release = time.time()
        wid = f"{wf.workflow_id}-{self.opts.run_tag}" if self.opts.run_tag else wf.workflow_id
        done: dict[str, asyncio.Event] = {c.request_id: asyncio.Event() for c in wf.calls}
        contexts: dict[str, Context] = {}
        last_of_agent: dict[str, str] = {}
        results: list[CallResult] = []

        async def one(call: PlannedCall, same_agent_prev: str | None) -> None:
            for p in call.parents:
                await done[p].wait()
            if call.delay_s and self.opts.time_scale:
                await asyncio.sleep(call.delay_s * self.opts.time_scale)
            keys = [*call.parents, *([same_agent_prev] if same_agent_prev else [])]
            candidates = [contexts[k] for k in dict.fromkeys(keys) if k in contexts]
            messages = build_messages(call.input_tokens, candidates,
                                      f"{wf.workflow_id}/{call.request_id}", self.opts.seed)
            body, headers = self._body_and_headers(wf, call, wid, messages)
            res = CallResult(wf.workflow_type_id, wid, f"{call.request_id}-{self.opts.run_tag}",
                             call.agent_id, call.input_tokens, call.output_tokens, time.time())
            reply = await self._send(body, headers, res)
            res.t_finish = time.time()
            if res.status == "ok":
                prompt = res.prompt_tokens if res.prompt_tokens is not None else estimate_tokens(messages)
                out = res.completion_tokens if res.completion_tokens is not None else len(reply.split())
                contexts[call.request_id] = Context(messages, reply, prompt, out)
            results.append(res)
            self.calls.append(res)
            if self.on_call is not None:
                self.on_call(res)
            done[call.request_id].set()

        tasks = []
        for call in wf.calls:
            tasks.append(asyncio.create_task(one(call, last_of_agent.get(call.agent_id))))
            last_of_agent[call.agent_id] = call.request_id
        await asyncio.gather(*tasks)
        t_end = max((r.t_finish for r in results if r.t_finish), default=time.time())
        return WorkflowResult(wf.workflow_type_id, wid, t_release, t_end, wf.recorded_jct_s,
                              len(results), sum(r.status != "ok" for r in results))


async def replay_async(plan: list[PlannedWorkflow], target: str, opts: ReplayOptions,
                       on_call: Callable[[CallResult], None] | None = None) -> ReplayResult:
    """Replay ``plan`` against ``target`` (base URL of an OpenAI-compatible server)."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
    async with httpx.AsyncClient(timeout=httpx.Timeout(opts.timeout_s, connect=30.0), limits=limits,
                                 trust_env=False) as client:
        model = opts.model or await discover_model(client, target)
        rp = _Replayer(client, target, model, opts, on_call)
        gate = asyncio.Semaphore(opts.concurrency) if opts.concurrency else None
        t0 = time.time()

        async def released(wf: PlannedWorkflow, at: float) -> WorkflowResult:
            if at > 0:
                await asyncio.sleep(max(0.0, t0 + at - time.time()))
            if gate is None:
                return await rp.run_workflow(wf)
            async with gate:
                return await rp.run_workflow(wf)

        offsets = (arrival_offsets(len(plan), opts.rate, opts.cv, opts.seed) if opts.rate
                   else np.zeros(len(plan)))
        workflows = await asyncio.gather(*(released(wf, float(at)) for wf, at in zip(plan, offsets)))
        wall = time.time() - t0
    return ReplayResult(rp.calls, list(workflows), wall, model, target, opts)


def replay(plan: list[PlannedWorkflow], target: str, opts: ReplayOptions,
           on_call: Callable[[CallResult], None] | None = None) -> ReplayResult:
    """Blocking wrapper around :func:`replay_async`."""
    return asyncio.run(replay_async(plan, target, opts, on_call))
