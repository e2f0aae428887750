"""Capacity router for the gateway: which upstream worker gets the next request.

The gateway (``serving_hooks/gateway*.py``) calls, per request::

    worker = router.decide(session_id, input_tokens, predicted_hi, alpha, request_id=rid).worker
    ...forward to worker...
    router.on_finish(rid)            # when the response (or the error) is complete

``decide(..., request_id=rid)`` reserves the request's bound atomically (it calls
:meth:`CapacityRouter.on_start` itself), so concurrent requests never see the same headroom
twice; without ``request_id`` the caller calls :meth:`on_start` once it has sent the request.

How the choice is made
----------------------
* The router polls every worker's ``GET /v1/loads`` (SGLang's load endpoint) every
  ``poll_interval_s`` and keeps, per worker, its KV capacity (``max_total_num_tokens``) and
  its own count of tokens in use or queued (``num_total_tokens``), summed over DP ranks.
* It tracks the requests it has in flight with their predicted bounds ``input + hi`` and
  ``α`` (the chance the output runs past ``hi``), and when each was sent: a request sent
  after the last poll cannot be in the worker's count yet, so its bound is added to it.
* With a fresh load report from every worker it asks :class:`CapacityPolicy` (Pythia alg. 2,
  union bound): the session's last worker when it is safe, else the safe worker with the
  largest expected headroom — a session moves only when the wait it saves exceeds rebuilding
  its prefix, judged with each worker's drain rate (expected KV tokens, ``input + E[out]``, of the
  requests that finished there over the last ``drain_window_s``); if no worker is safe it counts a
  ``fallback_least_loaded`` decision.
* If any worker's report is missing or stale (no ``/v1/loads``, an error, a timeout), it
  falls back to round robin over all workers and counts ``round_robin`` decisions.

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
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from serving_hooks.policies.capacity import (ActiveRequest, BoundTable, CapacityPolicy, Placement,
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
    """Where a request goes and why (``mode``: ``capacity``, ``fallback_least_loaded`` or
    ``round_robin``)."""

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
        # request id -> (worker, time sent, request with its bound)
        self._inflight: dict[str, tuple[str, float, ActiveRequest]] = {}
        self._last_worker: OrderedDict[str, str] = OrderedDict()
        self.drain_window_s = drain_window_s
        self._released: dict[str, deque] = {w: deque() for w in self.workers}   # (t, tokens)
        self._rr = itertools.count()
        self._counters: dict[str, int] = {
            "capacity": 0,
            "fallback_least_loaded": 0,
            "round_robin": 0,
            "affinity": 0,
            "poll_ok": 0,
            "poll_errors": 0,
        }
        self._task: asyncio.Task | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # ----------------------------------------------------------------- decisions
    def decide(
        self,
        session_id: str | None,
        input_tokens: int,
        predicted_hi: int | None,
        alpha: float | None = None,
        request_id: str | None = None,
        expected_out: float | None = None,
        upper_bounds: BoundTable = (),
    ) -> RouteDecision:
        """Route one request (``.worker`` is the URL); reserve its bound when ``request_id`` is
        given.

        A request without a prediction (``predicted_hi`` None) is counted with ``hi = 0`` and
        the policy's default ``α``; ``upper_bounds`` (``((α, U(α)), …)``, the annotation's
        ``output_len_upper``) lets it share the worker's risk budget instead.
        """
        hi = int(predicted_hi or 0)
        now = self.clock()
        with self._lock:
            states = self._replica_states(now)
            if states is None:
                worker = self.workers[next(self._rr) % len(self.workers)]
                decision = RouteDecision(worker, "round_robin")
            else:
                last = self._last_worker.get(session_id) if session_id else None
                placement = self.policy.choose(
                    states, int(input_tokens), hi, alpha, expected_out, last_replica=last,
                    upper_bounds=tuple(upper_bounds),
                )
                mode = "fallback_least_loaded" if placement.fallback else "capacity"
                decision = RouteDecision(placement.replica, mode, placement)
                if placement.affinity:
                    self._counters["affinity"] += 1
            self._counters[decision.mode] += 1
            if request_id is not None:
                self._start_locked(request_id, decision.worker, int(input_tokens), hi, alpha, session_id,
                                   tuple(upper_bounds), expected_out)
        return decision

    def _replica_states(self, now: float) -> list[ReplicaState] | None:
        per: dict[str, list[tuple[float, ActiveRequest]]] = {w: [] for w in self.workers}
        for worker, started_at, req in self._inflight.values():
            per.setdefault(worker, []).append((started_at, req))
        states = []
        for w in self.workers:
            load = self._loads.get(w)
            if load is None or now - load.fetched_at > self.stale_after_s:
                return None
            unreported = sum(r.bound_tokens for t, r in per[w] if t >= load.requested_at)
            states.append(
                ReplicaState(
                    w,
                    load.capacity_tokens,
                    tuple(r for _, r in per[w]),
                    load.reported_tokens,
                    unreported,
                    self._drain_locked(w, now),
                )
            )
        return states

    def _drain_locked(self, worker: str, now: float) -> float | None:
        """Expected KV tokens (``input + E[out]``) per second of the requests that finished on
        ``worker`` over the last ``drain_window_s``."""
        q = self._released.setdefault(worker, deque())
        while q and q[0][0] < now - self.drain_window_s:
            q.popleft()
        return sum(t for _, t in q) / self.drain_window_s if q else None

    # -------------------------------------------------------------- in-flight
    def on_start(
        self,
        request_id: str,
        worker: str,
        input_tokens: int,
        predicted_hi: int | None,
        alpha: float | None = None,
        session_id: str | None = None,
    ) -> None:
        """Track a request sent to ``worker`` with its predicted bound until :meth:`on_finish`."""
        with self._lock:
            self._start_locked(request_id, worker.rstrip("/"), int(input_tokens), int(predicted_hi or 0), alpha, session_id)

    def _start_locked(self, request_id, worker, input_tokens, hi, alpha, session_id,
                      upper_bounds=(), expected_out=None) -> None:
        a = self.policy.default_alpha if alpha is None else float(alpha)
        self._inflight[request_id] = (
            worker,
            self.clock(),
            ActiveRequest(request_id, input_tokens, hi, a, session_id, upper_bounds, expected_out),
        )
        if session_id:
            self._last_worker[session_id] = worker
            self._last_worker.move_to_end(session_id)
            while len(self._last_worker) > self.max_sessions:
                self._last_worker.popitem(last=False)

    def on_finish(self, request_id: str) -> None:
        """Forget a finished (or failed) request (its expected tokens count toward its worker's
        drain rate); unknown ids are ignored."""
        with self._lock:
            done = self._inflight.pop(request_id, None)
            if done is not None:
                worker, _, req = done
                self._released.setdefault(worker, deque()).append((self.clock(), req.expected_tokens))

    # ------------------------------------------------------------------ views
    def inflight(self) -> dict[str, int]:
        """Tracked bound tokens per worker."""
        with self._lock:
            out = {w: 0 for w in self.workers}
            for worker, _, req in self._inflight.values():
                out[worker] = out.get(worker, 0) + req.bound_tokens
            return out

    def queue_depths(self) -> dict[str, int]:
        """Waiting requests per worker from the last load reports (for the priority policy)."""
        with self._lock:
            return {w: load.waiting_requests for w, load in self._loads.items()}

    def loads(self) -> dict[str, WorkerLoad]:
        with self._lock:
            return dict(self._loads)

    def metrics(self) -> dict[str, int]:
        """Decision and poll counters (``fallback_least_loaded``: no replica was safe)."""
        with self._lock:
            return dict(self._counters)

    # ---------------------------------------------------------------- polling
    async def _poll_worker(self, client: httpx.AsyncClient, worker: str) -> None:
        sent = self.clock()
        try:
            resp = await client.get(worker + self.loads_path, timeout=self.timeout_s)
            load = parse_loads(resp.json(), self.clock(), sent) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError) as exc:
            logger.debug("load poll of %s failed: %s", worker, exc)
            load = None
        with self._lock:
            if load is None:
                self._counters["poll_errors"] += 1
                self._loads.pop(worker, None)
            else:
                self._counters["poll_ok"] += 1
                self._loads[worker] = load

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
