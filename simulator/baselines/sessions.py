"""Session baselines users deploy today: SGLang's sticky router, SGLang's session radix cache
closed at the session's end, and Dynamo's ThunderAgent program scheduler.

* :class:`StickyRouter` — SGLang router ``--policy sticky`` (sgl-model-gateway, ``StickyConfig``):
  a request's routing key (``x-sgl-routing-key``; here the session, per model pool) is pinned to
  the worker it was first sent to; a new key takes the fallback policy's pick (``round_robin``, the
  default ``--sticky-fallback-policy``); a background sweep every ``--sticky-eviction-interval-secs``
  (60) drops assignments unreferenced for more than ``--sticky-idle-secs`` (600), so a session
  that comes back after that starts over on the fallback's next worker.
* :class:`SessionRadixCache` — SGLang ``--enable-session-radix-cache`` (its server-args help:
  "eviction consumes unreferenced entries before referenced ones, and closing a session only
  dereferences its KV"): the KV of an open session is evicted only after every unreferenced
  entry; at ``close_session`` — here the session's true end, its last call's finish — it becomes
  an ordinary LRU entry. Nothing is pinned outright (a full GPU still evicts referenced KV, LRU).
* :class:`ThunderAgentControl` with its router, scheduler and cache parts — Dynamo's ThunderAgent
  program scheduler (docs "ThunderAgent Program Scheduler" and "ThunderAgent Scheduler
  Reference"; Kang et al. 2026): programs (sessions) move through (REASONING | ACTING) ×
  (ACTIVE | PAUSED); every ``scheduler_interval_s`` (5 s) a worker whose program working set
  (Σ of its active programs' context tokens) exceeds ``pause_threshold`` (0.95) of its retention
  budget (GPU KV + host HiCache) pauses ACTING programs until ``pause_target`` (0.80) is reached;
  when a worker is below ``pause_threshold − resume_hysteresis`` (0.85) paused programs resume,
  smallest first, best-fit-decreasing packed onto the worker with the least room left under that
  line; a program paused for ``resume_timeout_s`` (1800 s) is resumed whatever the load. A resumed
  program's next call gets ``resume_priority_boost_s`` (1 s) of priority. Routing is Dynamo's KV
  router (:class:`simulator.baselines.nat_hints.DynamoKVRouter`), which ThunderAgent wraps.

Where the model departs from the real components (each our reading, none tuned):

* ThunderAgent pauses the *largest* ACTING programs first (frees the working set with the fewest
  pauses; the docs do not say the order) and leaves out the soft-demote band.
* A paused program's next call is held behind every active call of its replica (the lowest
  queue class) instead of at the router: it runs only when nothing active waits there, so the
  deferral never idles a GPU. Its KV is evicted before any active program's (the engine "is
  free to evict their KV").
"""
from __future__ import annotations

import math

from simulator.baselines.caches import LRU
from simulator.baselines.nat_hints import DynamoKVRouter
from simulator.baselines.routers import RoundRobin, _serves
from simulator.engine import Request, Simulator
from simulator.policy import Part, Scheduler


class StickyRouter(RoundRobin):
    """SGLang router's ``sticky`` policy (module docstring): key -> worker until idle for more
    than ``idle_s`` at one of the sweeps every ``sweep_s``; new keys round robin (the parent's
    :meth:`RoundRobin.route`)."""

    def __init__(self, idle_s: float = 600.0, sweep_s: float = 60.0) -> None:
        super().__init__()
        self.idle_s = idle_s
        self.sweep_s = sweep_s
        #: routing key -> [worker, last time a request referenced it]
        self.assigned: dict[object, list] = {}
        self.counts = {"sticky_hit": 0, "assigned": 0, "expired": 0}

    def stats(self) -> dict:
        """The router's counters for a run's row: calls sent to their session's worker, sessions
        (re)assigned by the fallback, assignments dropped as idle."""
        return {f"sticky_{k}" if not k.startswith("sticky") else k: v for k, v in self.counts.items()}

    def _expired(self, last_seen: float, now: float) -> bool:
        """Was the entry swept: did a sweep run after it had been idle ``idle_s``? (The sweeps
        run at multiples of ``sweep_s``; an untouched entry is dropped at the first one past
        ``last_seen + idle_s``, so only the latest sweep before ``now`` matters.)"""
        last_sweep = math.floor(now / self.sweep_s) * self.sweep_s
        return last_sweep - last_seen > self.idle_s

    def route(self, req: Request) -> int:
        key, now = self.sim.home_key(req), self.sim.now
        entry = self.assigned.get(key)
        if entry is not None and self._expired(entry[1], now):
            self.counts["expired"] += 1
            entry = None
        if entry is None or not _serves(self.sim, req, entry[0]):
            entry = self.assigned[key] = [super().route(req), now]
            self.counts["assigned"] += 1
        else:
            entry[1] = now
            self.counts["sticky_hit"] += 1
        return entry[0]


class SessionRadixCache(LRU):
    """SGLang's session radix cache (module docstring): open sessions' KV is evicted after every
    unreferenced entry, LRU within each class; closed at the session's last call's finish.
    Segments shared across sessions (system prompts) count as referenced."""

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        sim = self.sim
        wf = sim.workload.seg_wf[seg]
        referenced = wf < 0 or (sim.wf_left[wf] > 0 and not math.isnan(sim.wf_arrival[wf]))
        return (referenced, sim.replicas[replica].cache.gpu[seg])


class ThunderAgentControl(Part):
    """ThunderAgent's program scheduler state and control loop (module docstring); its router,
    scheduler and cache parts read it."""

    def __init__(self, pause_threshold: float = 0.95, pause_target: float = 0.80,
                 resume_hysteresis: float = 0.10, resume_priority_boost_s: float = 1.0,
                 resume_timeout_s: float = 1800.0, scheduler_interval_s: float = 5.0) -> None:
        self.pause_threshold = pause_threshold
        self.pause_target = pause_target
        self.resume_hysteresis = resume_hysteresis
        self.resume_priority_boost_s = resume_priority_boost_s
        self.resume_timeout_s = resume_timeout_s
        self.scheduler_interval_s = scheduler_interval_s

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        #: program (workflow) -> context tokens it holds (its latest call's prompt + output)
        self.tokens: dict[int, int] = {}
        #: program -> the worker of its latest call (where its working set counts)
        self.worker: dict[int, int] = {}
        #: program -> calls in flight (> 0: REASONING, 0: ACTING)
        self.inflight: dict[int, int] = {}
        #: paused program -> when it was paused
        self.paused: dict[int, float] = {}
        #: resumed program -> the worker its next call goes to (the BFD placement)
        self.placed: dict[int, int] = {}
        #: programs whose next call carries the resume priority boost
        self.boosted: set[int] = set()
        self.counts = {"pauses": 0, "resumes": 0, "forced_resumes": 0}
        #: when the next control pass is due (None: none scheduled, no program known)
        self._due: float | None = None

    def stats(self) -> dict:
        """The control loop's counters for a run's row: programs paused, resumed, force-resumed."""
        return {f"thunderagent_{k}": v for k, v in self.counts.items()}

    def budget(self, r: int) -> float:
        """A worker's retention budget: GPU KV plus host HiCache capacity (tokens)."""
        cache = self.sim.replicas[r].cache
        return float(cache.capacity + cache.host_capacity)

    def working_set(self) -> list[float]:
        ws = [0.0] * len(self.sim.replicas)
        for wf, r in self.worker.items():
            if wf not in self.paused:
                ws[r] += self.tokens[wf]
        return ws

    def _tick_later(self) -> None:
        if self._due is None:
            self._due = self.sim.now + self.scheduler_interval_s
            self.sim.add_timer(self._due)

    def on_issue(self, req: Request) -> None:
        self.inflight[req.wf] = self.inflight.get(req.wf, 0) + 1
        self.tokens.setdefault(req.wf, req.call.input_tokens)
        self._tick_later()

    def on_finish(self, req: Request) -> None:
        wf, sim = req.wf, self.sim
        self.inflight[wf] -= 1
        if sim.wf_left[wf] == 1:            # its last call (the engine counts it down after this)
            for d in (self.tokens, self.worker, self.inflight, self.paused, self.placed):
                d.pop(wf, None)
            self.boosted.discard(wf)
            return
        self.tokens[wf] = req.call.input_tokens + req.call.output_tokens
        self.worker[wf] = req.replica

    def on_timer(self) -> None:
        if self._due is None or self.sim.now + 1e-9 < self._due:
            return                          # another part's timer
        self._due = None
        self.control()
        if self.tokens:
            self._tick_later()

    def control(self) -> None:
        """One pass of the control loop: pause over the threshold, then resume under it."""
        now, ws = self.sim.now, self.working_set()
        for r, used in enumerate(ws):
            budget = self.budget(r)
            if used <= self.pause_threshold * budget:
                continue
            acting = sorted((wf for wf, w in self.worker.items()
                             if w == r and wf not in self.paused and not self.inflight.get(wf)),
                            key=lambda wf: (-self.tokens[wf], wf))
            for wf in acting:
                if used <= self.pause_target * budget:
                    break
                self.paused[wf] = now
                self.placed.pop(wf, None)
                used -= self.tokens[wf]
                self.counts["pauses"] += 1
            ws[r] = used
        line = self.pause_threshold - self.resume_hysteresis
        for wf in sorted(self.paused, key=lambda w: (self.tokens[w], w)):
            tok = self.tokens[wf]
            fits = [r for r in self.candidate_workers(wf) if ws[r] + tok <= line * self.budget(r)]
            forced = now - self.paused[wf] >= self.resume_timeout_s
            if not fits and not forced:
                continue
            pool = fits or self.candidate_workers(wf)
            r = min(pool, key=lambda r: (line * self.budget(r) - ws[r] - tok, r))   # best fit
            del self.paused[wf]
            self.placed[wf] = r
            self.worker[wf] = r
            self.boosted.add(wf)
            ws[r] += tok
            self.counts["resumes"] += 1
            self.counts["forced_resumes"] += forced and not fits

    def candidate_workers(self, wf: int) -> list[int]:
        """The workers that may serve the program (its model pool's; all without pools)."""
        sim = self.sim
        home = self.worker.get(wf)
        pool = sim.pool_of_replica(home) if home is not None else None
        if pool is None:
            return [rep.idx for rep in sim.replicas]
        return [rep.idx for rep in sim.replicas if sim.pool_of_replica(rep.idx) == pool]


class ThunderAgentRouter(DynamoKVRouter):
    """Dynamo's KV router, except that a resumed program's next call goes where the control
    loop placed it."""

    def __init__(self, control: ThunderAgentControl) -> None:
        super().__init__()
        self.control = control

    def route(self, req: Request) -> int:
        r = self.control.placed.pop(req.wf, None)
        if r is not None and _serves(self.sim, req, r):
            return r
        return super().route(req)


class ThunderAgentScheduler(Scheduler):
    """FCFS with paused programs' calls last and a resumed program's next call ``boost`` s
    earlier (re-sorted at every admission: a pause or resume changes a waiting call's class)."""

    def __init__(self, control: ThunderAgentControl) -> None:
        self.control = control
        #: call -> the priority seconds it carries (a resumed program's next call)
        self.boost: dict[int, float] = {}

    def on_issue(self, req: Request) -> None:
        if req.wf in self.control.boosted:
            self.control.boosted.discard(req.wf)
            self.boost[req.idx] = self.control.resume_priority_boost_s

    def queue_key(self, req: Request) -> tuple:
        return (req.wf in self.control.paused, req.t_issue - self.boost.get(req.idx, 0.0), req.idx)


class ThunderAgentCache(LRU):
    """LRU, paused programs' KV first."""

    def __init__(self, control: ThunderAgentControl) -> None:
        self.control = control

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        wf = self.sim.workload.seg_wf[seg]
        return (wf not in self.control.paused, self.sim.replicas[replica].cache.gpu[seg])
