"""SAGA and Astraea, the two agent-serving systems the issue names as seeds, rebuilt from the
mechanisms its summary lists (issue 16, "What to build" 1). The papers' texts were not at hand
while writing this: each class states the rule it implements, and the constants are the ones a
reader would pick from that rule; treat both rows as *our reading* of those systems, not as
their authors' code.

* **SAGA** — workflow-aware LRU with a tool-latency TTL keep-alive (:class:`SagaCache`),
  session-affinity routing with work stealing (:class:`SagaRouter`), Agent Fair Share
  scheduling (:class:`AgentFairShare`).
* **Astraea** — state-aware multi-level feedback queue with HRRN aging (:class:`AstraeaMLFQ`);
  at each tool call a session's KV is kept, swapped to host or discarded by GPU memory pressure
  (:class:`AstraeaCache`).
"""
from __future__ import annotations

import math

from simulator.baselines.caches import ContinuumTTL
from simulator.baselines.routers import StickyLeastLoad
from simulator.engine import Request
from simulator.policy import CachePolicy, Scheduler


class SagaCache(ContinuumTTL):
    """Workflow-aware LRU with a TTL keep-alive: after a call that runs a tool the session's KV is
    pinned for the running mean of that tool's latency (as :class:`ContinuumTTL`), and eviction
    takes segments of *finished* workflows first (their KV has no future), then LRU."""

    def bind(self, sim) -> None:
        super().bind(sim)
        self.done: set[int] = set()

    def on_finish(self, req: Request) -> None:
        super().on_finish(req)
        if self.sim.wf_left[req.wf] <= 1:      # the hook runs before the engine counts it
            self.done.add(req.wf)

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        wf = self.sim.workload.seg_wf[seg]
        return (0 if wf in self.done else 1, self.sim.replicas[replica].cache.gpu[seg])


class SagaRouter(StickyLeastLoad):
    """Session affinity with work stealing: a session's calls go to its home replica (a new
    session: the fewest outstanding tokens); when the home has calls waiting and another replica
    of the pool has none waiting and a free running slot, that replica steals the call and
    becomes the session's home."""

    def __init__(self) -> None:
        super().__init__()
        self.steals = 0

    def route(self, req: Request) -> int:
        key = self.sim.home_key(req)
        known = key in self.home
        r = super().route(req)
        if not known or not self.sim.replicas[r].waiting:
            return r
        cap = self.sim.config.max_running_requests
        idle = [q for q in self.sim.candidates(req)
                if not q.waiting and len(q.running) < cap and q.idx != r]
        if idle:
            r = min(idle, key=lambda q: (q.load_tokens(), q.idx)).idx
            self.home[key] = r
            self.steals += 1
        return r


class AgentFairShare(Scheduler):
    """Agent Fair Share: the waiting call whose agent session (workflow) has received the least
    service so far runs first (service = seconds in running batches), FCFS among equals; non
    preemptive. Every running agent converges to an equal share of the engine."""

    def __init__(self) -> None:
        self.service: dict[int, float] = {}

    def on_step(self, replica: int, dt: float, batch: list[Request]) -> None:
        for q in batch:
            self.service[q.wf] = self.service.get(q.wf, 0.0) + dt

    def queue_key(self, req: Request) -> tuple:
        return (self.service.get(req.wf, 0.0), req.t_enqueue, req.idx)


class AstraeaMLFQ(AgentFairShare):
    """State-aware MLFQ with HRRN aging: a call's queue is set by its workflow's attained service
    (queue 0 below ``quantum_s``, queue ``i`` for ``[q·2^(i−1), q·2^i)``, ``levels`` queues);
    within a queue the highest response ratio ``(wait + S)/S`` runs first (HRRN; ``S`` = the
    running mean service of a call), and a call whose ratio reaches ``promote_ratio`` is aged up
    to queue 0. *State-aware*: a call that resumes its workflow after a tool (its KV likely
    still cached) is placed one queue higher than its service alone would put it."""

    def __init__(self, quantum_s: float = 2.0, levels: int = 8, promote_ratio: float = 2.0) -> None:
        super().__init__()
        self.quantum_s = quantum_s
        self.levels = levels
        self.promote_ratio = promote_ratio
        self.n_done = 0
        self.s_done = 0.0

    def on_finish(self, req: Request) -> None:
        self.n_done += 1
        self.s_done += req.service_s

    def _level(self, req: Request) -> int:
        t = self.service.get(req.wf, 0.0)
        lvl = 0 if t < self.quantum_s else min(self.levels - 1, int(math.log2(t / self.quantum_s)) + 1)
        if req.call.parents and self.sim.workload.calls[req.call.parents[0]].tool is not None:
            lvl = max(0, lvl - 1)
        return lvl

    def queue_key(self, req: Request) -> tuple:
        s = self.s_done / self.n_done if self.n_done else 1.0
        rr = (self.sim.now - req.t_enqueue + s) / max(s, 1e-9)
        lvl = 0 if rr >= self.promote_ratio else self._level(req)
        return (lvl, -rr, req.idx)


class AstraeaCache(CachePolicy):
    """Keep / swap / discard by memory pressure, decided when a call that runs a tool finishes:
    GPU KV use ``u`` below ``keep_below`` (0.5) keeps the session on the GPU (evicted last among
    equals), up to ``discard_above`` (0.85) swaps it (evicted first, written to the host tier),
    above it discards it (evicted first, not written to host). LRU within each class; a session
    is unmarked when its next call is issued."""

    def __init__(self, keep_below: float = 0.5, discard_above: float = 0.85) -> None:
        self.keep_below = keep_below
        self.discard_above = discard_above
        self.mark: dict[int, int] = {}      # wf -> 0 discard, 1 swap, 3 keep (evicted last)
        self.decisions = {"keep": 0, "swap": 0, "discard": 0}

    def on_finish(self, req: Request) -> None:
        if req.call.tool is None or not req.call.children:
            self.mark.pop(req.wf, None)
            return
        rep = self.sim.replicas[req.replica]
        u = (rep.cache.gpu_used + rep.private) / max(rep.cache.capacity, 1)
        m = 3 if u < self.keep_below else (1 if u < self.discard_above else 0)
        self.mark[req.wf] = m
        self.decisions[{3: "keep", 1: "swap", 0: "discard"}[m]] += 1

    def on_issue(self, req: Request) -> None:
        self.mark.pop(req.wf, None)

    def _rank(self, seg: int) -> int:
        wf = self.sim.workload.seg_wf[seg]
        return self.mark.get(wf, 2) if wf >= 0 else 2

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        return (self._rank(seg), self.sim.replicas[replica].cache.gpu[seg])

    def to_host(self, replica: int, seg: int) -> bool:
        return self._rank(seg) != 0
