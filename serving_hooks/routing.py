"""Capacity router for the gateway: which upstream worker gets the next request.

The gateway (``serving_hooks/gateway*.py``) calls, per request::

    worker = router.decide_annotated(rid, session_id, input_tokens, annotation).worker
    ...forward to worker...
    router.on_finish(rid)            # when the response (or the error) is complete

``decide_annotated`` turns the call's annotation contract into its KV bound with
:func:`policies.bookkeeping.capacity_request` — the function the simulator's router
uses — and reserves it atomically, so concurrent requests never see the same headroom twice.
``decide`` takes the bound's parts directly (``request_id`` given: reserved at once; else the
caller calls :meth:`on_start` once it has sent the request).

The router polls every worker's ``GET /v1/loads`` every ``poll_interval_s`` (KV capacity and the
worker's own token count), keeps its in-flight requests in a
:class:`~policies.bookkeeping.CapacityLedger` (the simulator's router keeps the
same object) and routes with :meth:`CapacityLedger.place` and :class:`CapacityPolicy`. A stale
or failed worker is judged on what the router knows without it; nothing is ever routed round
robin. How the choice is made, step by step: docs/routing.md, "The gateway's router".

The poller runs either as an asyncio task in the caller's loop (:meth:`start` /
:meth:`aclose`, for the FastAPI gateway's lifespan) or in a daemon thread with its own loop
(:meth:`start_background` / :meth:`stop_background`). State is guarded by one lock, so
``choose``/``on_start``/``on_finish`` may be called from any thread.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from predictors.contract import Annotation
from policies.bookkeeping import UNKNOWN_OUTPUT_TOKENS, CapacityLedger, capacity_request
from policies.capacity import (ActiveRequest, BoundTable, CapacityPolicy, Placement,
                                             ReplicaState)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerLoad:
    """One worker's load report, summed over its DP ranks."""

    capacity_tokens: int
    reported_tokens: int
    waiting_requests: int
    fetched_at: float
    requested_at: float


@dataclass(frozen=True)
class RouteDecision:
    """Where a request goes and why (``mode``: ``capacity``; ``fallback``: no worker was safe;
    ``no_report``: a candidate never reported its capacity)."""

    worker: str
    mode: str
    placement: Placement | None = None


def parse_loads(body: Any, fetched_at: float, requested_at: float | None = None) -> WorkerLoad | None:
    """Sum SGLang's ``GET /v1/loads`` JSON over DP ranks; ``None`` if it carries no capacity.

    Accepts ``{"loads": [{...}, ...]}`` (SGLang 0.5.x) or a single load object.
    ``requested_at`` (default ``fetched_at``) is when the poll was sent: a request sent after
    it cannot be counted in the report.
    """
    if not isinstance(body, Mapping):
        return None
    loads = body.get("loads")
    ranks = loads if isinstance(loads, list) else [body]
    capacity = reported = waiting = 0
    for rank in ranks:
        if not isinstance(rank, Mapping):
            continue
        try:
            capacity += int(rank.get("max_total_num_tokens") or 0)
            total = rank.get("num_total_tokens")
            reported += int(total if total is not None else rank.get("num_used_tokens") or 0)
            waiting += int(rank.get("num_waiting_reqs") or 0)
        except (TypeError, ValueError):
            return None
    if capacity <= 0:
        return None
    return WorkerLoad(
        capacity, reported, waiting, fetched_at, fetched_at if requested_at is None else requested_at
    )


class CapacityRouter:
    """Route requests over ``workers`` with the capacity policy (see the module docstring).

    Parameters
    ----------
    workers:
        Base URLs of the upstream workers (``http://host:port``).
    policy:
        The :class:`CapacityPolicy` (ε, default α, affinity slack).
    poll_interval_s, timeout_s:
        How often ``/v1/loads`` is polled and how long one poll may take.
    stale_after_s:
        A load report older than this counts as missing (default ``4 · poll_interval_s``,
        at least 1 s).
    clock:
        Monotonic clock (seconds); injectable for tests and the simulator.
    max_sessions:
        How many sessions' last worker to remember (LRU).
    drain_window_s:
        Window over which each worker's drain rate (released tokens per second) is measured.
    unknown_output_tokens:
        Output bound reserved for a request without a prediction (the profile's global ``hi``).
    """

    def __init__(
        self,
        workers: Sequence[str],
        policy: CapacityPolicy | None = None,
        poll_interval_s: float = 0.25,
        timeout_s: float = 0.5,
        stale_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_sessions: int = 100_000,
        loads_path: str = "/v1/loads",
        drain_window_s: float = 60.0,
        unknown_output_tokens: int = UNKNOWN_OUTPUT_TOKENS,
    ) -> None:
        if not workers:
            raise ValueError("CapacityRouter needs at least one worker URL")
        self.workers = [w.rstrip("/") for w in workers]
        self.policy = policy or CapacityPolicy()
        self.poll_interval_s = poll_interval_s
        self.timeout_s = timeout_s
        self.stale_after_s = stale_after_s if stale_after_s is not None else max(1.0, 4 * poll_interval_s)
        self.clock = clock
        self.max_sessions = max_sessions
        self.loads_path = loads_path
        self._lock = threading.Lock()
        self._loads: dict[str, WorkerLoad] = {}
        #: Each worker's latest reported KV capacity (kept when its reports go stale or fail).
        self._capacity: dict[str, int] = {}
        self.unknown_output_tokens = int(unknown_output_tokens)
        self.ledger = CapacityLedger(self.workers, drain_window_s=drain_window_s,
                                     max_sessions=max_sessions, started_at=clock())
        self._turn = itertools.count()
        self._counters: dict[str, int] = {
            "capacity": 0,
            "fallback": 0,
            "no_report": 0,
            "stale": 0,
            "poll_ok": 0,
            "poll_errors": 0,
        }
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ----------------------------------------------------------------- decisions
    def decide_annotated(self, request_id: str, session_id: str | None, input_tokens: int,
                         annotation: Annotation | dict | None,
                         workers: Sequence[str] | None = None) -> RouteDecision:
        """Route and reserve one request from its annotation contract (module doc), among
        ``workers`` (default: all; a multi-model gateway passes the pool of the request's
        model)."""
        ann = Annotation.from_dict(annotation) if annotation is not None else None
        req = capacity_request(request_id, int(input_tokens), ann, session_id,
                               default_alpha=self.policy.default_alpha,
                               unknown_output_tokens=self.unknown_output_tokens)
        known = ann is not None and ann.known
        return self._decide(session_id, req, req.alpha if known else None, request_id, workers)

    def decide(
        self,
        session_id: str | None,
        input_tokens: int,
        predicted_hi: int | None,
        alpha: float | None = None,
        request_id: str | None = None,
        expected_out: float | None = None,
        upper_bounds: BoundTable = (),
        agent_id: str | None = None,
    ) -> RouteDecision:
        """Route one request (``.worker`` is the URL) from its bound's parts; reserve it when
        ``request_id`` is given. ``predicted_hi`` None: ``unknown_output_tokens`` at the policy's
        default ``α``; ``upper_bounds`` (``((α, U(α)), …)``) lets it share the worker's risk
        budget instead; ``agent_id`` keys the session's per-agent prefix ledger (what a move
        leaves behind)."""
        hi = int(predicted_hi) if predicted_hi is not None else self.unknown_output_tokens
        a = self.policy.default_alpha if alpha is None else float(alpha)
        req = ActiveRequest(request_id or "", int(input_tokens), hi, a, session_id,
                            tuple(upper_bounds), expected_out, agent_id)
        return self._decide(session_id, req, alpha, request_id)

    def _decide(self, session_id: str | None, req: ActiveRequest, alpha: float | None,
                request_id: str | None, workers: Sequence[str] | None = None) -> RouteDecision:
        now = self.clock()
        cands = self.workers if workers is None else [w.rstrip("/") for w in workers]
        with self._lock:
            states, stale = self._replica_states(now, cands)
            if states is None:
                decision = self._without_capacity(session_id, req, cands, request_id, now)
            else:
                placement = self.ledger.place(self.policy, states, req, now, session=session_id or None,
                                              alpha=alpha, request_id=request_id)
                decision = RouteDecision(placement.replica, "fallback" if placement.fallback else "capacity",
                                         placement)
                self._counters["stale"] += stale
            self._counters[decision.mode] += 1
        return decision

    def _without_capacity(self, session_id: str | None, req: ActiveRequest, cands: Sequence[str],
                          request_id: str | None, now: float) -> RouteDecision:
        """A candidate never reported its capacity: the session's last worker among ``cands``,
        else the one with the fewest reserved tokens (ties taken in turn); counted and reserved
        by the ledger like every decision."""
        session = session_id or None
        home = self.ledger.last_replica(session)
        if home in cands:
            worker = home
        else:
            reserved = self.ledger.bound_tokens()
            start = next(self._turn)
            order = [cands[(start + i) % len(cands)] for i in range(len(cands))]
            worker = min(order, key=lambda w: reserved.get(w, 0))
        placement = Placement(worker, fallback=False, affinity=worker == home)
        self.ledger.stats.count(placement, home, self.ledger.cached_prefix(session, req.input_tokens),
                                self.ledger.left_behind(session, home, req.agent_id))
        if request_id is not None:
            self.ledger.start(request_id, worker, req, now, session=session)
        return RouteDecision(worker, "no_report", placement)

    def _replica_states(self, now: float, workers: Sequence[str]) -> tuple[list[ReplicaState] | None, bool]:
        """The policy's view of ``workers`` and whether a report was stale: a fresh report adds
        the worker's own token count; a stale or failed one leaves the router's own (the last
        capacity, the requests it sent: the simulator's view). None: a capacity never known."""
        states = []
        stale = False
        for w in workers:
            cap = self._capacity.get(w)
            if cap is None:
                return None, False
            load = self._loads.get(w)
            if load is None or now - load.fetched_at > self.stale_after_s:
                stale = True
                states.append(self.ledger.state(w, cap, now))
            else:
                states.append(self.ledger.state(w, load.capacity_tokens, now,
                                                reported_tokens=load.reported_tokens,
                                                reported_at=load.requested_at))
        return states, stale

    # -------------------------------------------------------------- in-flight
    def on_start(
        self,
        request_id: str,
        worker: str,
        input_tokens: int,
        predicted_hi: int | None,
        alpha: float | None = None,
        session_id: str | None = None,
        agent_id: str | None = None,
    ) -> None:
        """Track a request sent to ``worker`` with its predicted bound until :meth:`on_finish`
        (``agent_id``: the session's agent that sent it, for the per-agent prefix ledger)."""
        a = self.policy.default_alpha if alpha is None else float(alpha)
        hi = int(predicted_hi) if predicted_hi is not None else self.unknown_output_tokens
        with self._lock:
            self.ledger.start(request_id, worker.rstrip("/"),
                              ActiveRequest(request_id, int(input_tokens), hi, a, session_id,
                                            agent_id=agent_id),
                              self.clock(), session=session_id or None)

    def on_finish(self, request_id: str) -> None:
        """Forget a finished (or failed) request (its expected tokens count toward its worker's
        drain rate); unknown ids are ignored."""
        with self._lock:
            self.ledger.finish(request_id, self.clock())

    def note_load(self, worker: str, load: WorkerLoad | None) -> None:
        """Record a worker's load report (None: it failed) and its waiting-queue depth."""
        with self._lock:
            if load is None:
                self._counters["poll_errors"] += 1
                self._loads.pop(worker, None)
                self.ledger.forget_queue_depth(worker)
            else:
                self._counters["poll_ok"] += 1
                self._loads[worker] = load
                self._capacity[worker] = load.capacity_tokens
                self.ledger.note_queue_depths({worker: load.waiting_requests})

    # ------------------------------------------------------------------ views
    def inflight(self) -> dict[str, int]:
        """Tracked bound tokens per worker."""
        with self._lock:
            return self.ledger.bound_tokens()

    def queue_depths(self) -> dict[str, int]:
        """Waiting requests per worker from the last load reports (the ledger's; for the
        priority policy's idle-downstream term)."""
        with self._lock:
            return self.ledger.queue_depths()

    def loads(self) -> dict[str, WorkerLoad]:
        with self._lock:
            return dict(self._loads)

    def metrics(self) -> dict[str, int]:
        """Decision and poll counters: decisions by mode (``capacity``, ``fallback``: no worker
        was safe, ``no_report``), ``stale`` (decided with a stale report), and the ledger's
        ``decisions``, ``fallbacks``, ``affinity``, ``moved_sessions``,
        ``move_recompute_tokens`` and ``move_left_behind_tokens`` (the simulator's
        ``capacity_*`` figures)."""
        with self._lock:
            return {**self._counters, **self.ledger.stats.as_dict()}

    # ---------------------------------------------------------------- polling
    async def _poll_worker(self, client: httpx.AsyncClient, worker: str) -> None:
        sent = self.clock()
        try:
            resp = await client.get(worker + self.loads_path, timeout=self.timeout_s)
            load = parse_loads(resp.json(), self.clock(), sent) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("load poll of %s failed: %s", worker, exc)
            load = None
        self.note_load(worker, load)

    async def poll_once(self, client: httpx.AsyncClient | None = None) -> None:
        """Poll every worker once, concurrently."""
        if client is None:
            async with httpx.AsyncClient() as own:
                await self.poll_once(own)
            return
        await asyncio.gather(*(self._poll_worker(client, w) for w in self.workers))

    def poll_once_blocking(self) -> None:
        """:meth:`poll_once` for callers without an event loop (tests, CLI tools)."""
        asyncio.run(self.poll_once())

    async def _poll_forever(self) -> None:
        async with httpx.AsyncClient() as client:
            while not self._stop.is_set():
                await self.poll_once(client)
                await asyncio.sleep(self.poll_interval_s)

    async def start(self) -> None:
        """Start polling as a task of the running event loop (first poll done on return)."""
        if self._task is None:
            self._stop.clear()
            await self.poll_once()
            self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def aclose(self) -> None:
        """Stop the polling task started by :meth:`start`."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    def start_background(self) -> None:
        """Start polling in a daemon thread with its own event loop."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=lambda: asyncio.run(self._poll_forever()), name="capacity-router-poller", daemon=True
            )
            self._thread.start()

    def stop_background(self, timeout_s: float = 5.0) -> None:
        """Stop the thread started by :meth:`start_background`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
