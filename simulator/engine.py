"""Discrete-event simulator of a multi-replica LLM serving cluster replaying agent workflows.

Events live in one ``heapq`` of :class:`Event` (time, sequence, kind, payload): a workflow arrives, a call is
issued, a replica finishes an iteration, a host→GPU load completes, a policy timer fires, a part
wakes an idle replica (idle-capacity work; model pools may change members: see the block
"elastic pools and idle-capacity work" at the end of :class:`Simulator`).

**Closed-loop replay.** A workflow's root calls are issued at its arrival (plus their recorded
offsets); every other call is issued when the last of its parents finishes plus its gap (the tool
or think time, recorded or sampled). Fan-out siblings share parents and so are issued together.

**A replica** (SGLang/vLLM-style continuous batching) repeats *rounds*:

1. *admission* — waiting calls in the scheduler's order are admitted while the prefill backlog is
   under one chunk, the running set is under ``max_running_requests`` and their KV fits: the
   cached prefix is matched (GPU run, then host run), the matched GPU segments are locked, the
   GPU tier evicts (policy order, leaf first) what the rest of the prompt needs, host hits are
   loaded back over PCIe (the call waits ``tokens × pcie_s_per_token`` before its prefill), and
   missing segments are recomputed. The first call that does not fit stops admission (no
   skipping), unless the scheduler is *preemptive* and running calls with a worse key can make
   room. When the running set is full (``max_running_requests``), a scheduler with
   ``slot_preemption`` (SGLang's priority scheduling) preempts the lowest-priority running call
   the first waiting call outranks by more than its threshold (recompute), as SGLang's
   ``preempt_to_schedule`` does; otherwise admission stops.
2. *an iteration* — up to ``chunked_prefill_size`` prefill tokens (admission order) plus one decode
   token per decoding call; its time is the calibrated step model. A call whose prefill completes
   emits its first token at the end of that iteration. When the batch is decode-only, the ``k``
   identical iterations until the next completion (or the KV limit) are simulated as one event
   with the exact arithmetic sum of their durations; if a call arrives at the replica meanwhile,
   the macro-step is cut at the end of the iteration in progress (:meth:`Simulator._wake`).
3. *KV growth* — every decoded token needs a KV slot; when the GPU tier cannot provide them even
   after eviction, running calls are **preempted** (largest ``victim_key`` first: the newest call
   for FCFS, as vLLM/SGLang do) and re-prefill their prompt and generated tokens when readmitted
   (recompute mode).

**Accounting.** A prompt token is *recomputed* when its segment had already been computed
somewhere in the cluster (evicted, or computed on another replica) or when its call was
preempted; first-time tokens are not counted. Per call the simulator records issue, admission,
first token, finish, GPU and host prefix hits, computed and recomputed prefill tokens.
"""
from __future__ import annotations

import bisect
import functools
import gc
import heapq
import math
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from simulator.cache import ReplicaCache
from simulator.config import ClusterConfig
from simulator.policy import IdlePrefill, Policy
from simulator.pools import Pools
from simulator.workload import Call, Workload

WAITING, LOADING, RUNNING, DONE = range(4)
EV_ARRIVE, EV_ISSUE, EV_STEP, EV_LOADED, EV_TIMER, EV_WAKE = range(6)


# The records below are NamedTuples, not dataclasses: they are built and unpacked in the event
# loop's hot path, and a NamedTuple is a tuple (C-speed construction, unpacking and heap order)
# whose fields have names.

class Event(NamedTuple):
    """One entry of the event heap, ordered by ``(t, seq)``: ``seq`` (a counter) breaks ties in
    push order, so ``kind`` and ``payload`` are never compared. ``payload`` by kind: EV_ARRIVE a
    workflow index, EV_ISSUE a call index, EV_STEP a :class:`StepDue`, EV_LOADED the
    :class:`Request`, EV_TIMER None, EV_WAKE a replica index."""
    t: float
    seq: int
    kind: int
    payload: Any


class StepDue(NamedTuple):
    """EV_STEP payload: replica ``replica``'s plan number ``plan_id`` ends now. A plan cut short
    (:meth:`Simulator._wake`) gets a new ``plan_id``, so the old event is recognised as stale."""
    replica: int
    plan_id: int


class PrefillChunk(NamedTuple):
    """``take`` prompt tokens of ``req`` prefilled in one iteration."""
    req: "Request"
    take: int


class StepPlan(NamedTuple):
    """What a replica runs until its next EV_STEP: the prefill chunks, the decoding calls, ``k``
    identical decode iterations (1 when anything prefills), their summed time ``dt`` and the
    decoders' KV tokens ``kv`` at the start (the step model's input)."""
    prefill: list[PrefillChunk]
    decoders: list["Request"]
    k: int
    dt: float
    kv: int


class Request:
    """Runtime state of one issued call."""

    __slots__ = (
        "call", "idx", "wf", "state", "replica", "t_issue", "t_admit", "t_first", "t_finish",
        "prefill_left", "prefill_total", "missing_path", "prefill_rate", "decoded", "private",
        "locked", "preempts", "service_s", "recompute_own", "gpu_hit", "host_hit", "computed",
        "recomputed", "pred", "hints", "t_enqueue", "swapped", "recomputed_evict",
        "recomputed_preempt", "input_tokens", "output_tokens",
    )

    def __init__(self, call: Call, t_issue: float) -> None:
        self.call = call
        #: The call's prompt and output tokens, copied: read in every iteration's loops.
        self.input_tokens = call.input_tokens
        self.output_tokens = call.output_tokens
        self.idx = call.idx
        self.wf = call.wf
        self.state = WAITING
        self.replica = -1
        self.t_issue = t_issue
        self.t_enqueue = t_issue
        self.t_admit = math.nan
        self.t_first = math.nan
        self.t_finish = math.nan
        self.prefill_left = 0
        self.prefill_total = 0
        self.missing_path = 0
        self.prefill_rate = 0.0
        self.decoded = 0
        self.private = 0
        self.locked: tuple[int, ...] = ()
        self.preempts = 0
        self.service_s = 0.0
        self.recompute_own = 0
        self.swapped = 0
        self.gpu_hit = 0
        self.host_hit = 0
        self.computed = 0
        self.recomputed = 0
        #: Of ``recomputed``: segments this replica had held and evicted (eviction-caused), and
        #: the call's own tokens redone after a preemption; the rest was computed elsewhere
        #: (routing-caused: the session moved).
        self.recomputed_evict = 0
        self.recomputed_preempt = 0
        #: The prediction feed's record of the call (:class:`simulator.ours.FeedPrediction`:
        #: annotation, app_metadata, the policies' view), None until it is annotated.
        self.pred: Any = None
        #: NAT's hints for the call (:class:`simulator.baselines.nat_hints.Hints`), None until
        #: the NAT-style scheduler looked them up.
        self.hints: Any = None

    @property
    def context_tokens(self) -> int:
        return self.call.input_tokens + self.decoded

    @property
    def remaining_output(self) -> int:
        return self.call.output_tokens - self.decoded


@dataclass
class Replica:
    idx: int
    cache: ReplicaCache
    #: The scheduler's container (``Scheduler.new_queue``): a list unless it keeps its own order.
    waiting: list[Request] = field(default_factory=list)
    running: list[Request] = field(default_factory=list)
    private: int = 0
    #: Σ prompt tokens of the waiting calls (kept on enqueue and admission).
    waiting_tokens: int = 0
    stepping: bool = False
    busy_s: float = 0.0
    plan: StepPlan | None = None
    plan_id: int = 0
    plan_start: float = 0.0
    #: the slowdown the plan in progress was timed with (``ClusterConfig.shared_compute``)
    plan_share: float = 1.0

    def load_tokens(self) -> int:
        """Outstanding tokens: KV of running calls plus prompts of waiting calls (no oracle)."""
        return sum(q.call.input_tokens + q.decoded for q in self.running) + self.waiting_tokens

    def free_tokens(self) -> int:
        return self.cache.capacity - self.cache.gpu_used - self.private


@dataclass
class SimResult:
    """Everything a run produced (inputs to :mod:`simulator.metrics`)."""

    policy: str
    workload: Workload
    config: ClusterConfig
    requests: list[Request]
    wf_arrival: np.ndarray
    wf_finish: np.ndarray
    replica_busy_s: list[float]
    makespan_s: float
    preemptions: int
    events: int
    host_loaded_tokens: int
    counters: dict = field(default_factory=dict)


def _cyclic_gc_paused(fn: Callable) -> Callable:
    """Run ``fn`` with Python's cyclic garbage collector paused (restored after). The event
    loop makes almost no reference cycles (15 objects in a 10k-call run of ``ours``), so the
    collector's passes over a heap that grows with every request found nothing and cost up to
    ~13 % of a long run; reference counting still frees everything else at once."""
    @functools.wraps(fn)
    def paused(*args: Any, **kwargs: Any) -> Any:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if enabled:
                gc.enable()
    return paused


class Simulator:
    """Replays ``workload`` under ``policy`` on the cluster ``config`` (see the module docstring).

    ``wf_arrivals[i]`` is the arrival time (s) of workflow ``i``; ``gap_fn(call)`` returns the gap
    before ``call`` is issued once its parents are done (default: the recorded gap). With
    ``concurrency = C`` the population is closed: only the first ``C`` workflows arrive at their
    given times, and each completed workflow lets the next one (in index order) arrive at once.
    """

    def __init__(self, workload: Workload, policy: Policy, config: ClusterConfig,
                 wf_arrivals: Sequence[float], gap_fn: Callable[[Call], float] | None = None,
                 concurrency: int | None = None, pools: "Pools | None" = None) -> None:
        if len(wf_arrivals) != len(workload.workflows):
            raise ValueError("one arrival time per workflow is needed")
        self.workload = workload
        self.policy = policy
        self.config = config
        self.step = config.step
        self.gap_fn = gap_fn or (lambda call: call.gap_s)
        for c in workload.calls:
            if c.input_tokens + c.output_tokens + 1 > config.kv_capacity_tokens:
                raise ValueError(
                    f"call {c.request_id}: {c.input_tokens} + {c.output_tokens} tokens do not fit "
                    f"the KV capacity of a replica ({config.kv_capacity_tokens} tokens); raise "
                    f"--kv-capacity-tokens")
        self.replicas = [
            Replica(i, ReplicaCache(config.kv_capacity_tokens, config.host_capacity_tokens,
                                    workload.seg_tokens, workload.seg_parent))
            for i in range(config.replicas)
        ]
        #: Per replica: has this segment ever been on its GPU tier? (a recompute of a segment it
        #: held is eviction-caused; of one it never held, routing-caused)
        self.held = [bytearray(len(workload.seg_tokens)) for _ in range(config.replicas)]
        #: Model pools (multi-model workflows): a call is served by the replicas of its agent's
        #: pool. None: one pool of every replica.
        self.pools = pools
        if pools is not None:
            pools.check(workload, config.replicas)
            self._pool_reps = [[self.replicas[i] for i in reps] for reps in pools.replicas]
            #: replica -> index of the pool it serves (absent: starting, draining or free)
            self._pool_of_rep = {i: p for p, reps in enumerate(pools.replicas) for i in reps}
        self.now = 0.0
        n = workload.n_calls
        self.requests: list[Request | None] = [None] * n
        self.pending_parents = np.array([len(c.parents) for c in workload.calls], dtype=np.int64)
        self.parents_done_t = np.full(n, -math.inf)
        self.issue_t = np.full(n, math.nan)
        self.finish_t = np.full(n, math.nan)
        self.wf_arrival = np.asarray(wf_arrivals, dtype=float).copy()
        n_wf = len(workload.workflows)
        self.concurrency = n_wf if concurrency is None else max(1, min(int(concurrency), n_wf))
        #: admission's decode reserve: the share counted (SGLang's ``new_token_ratio``, 1.0 for
        #: fixed-length requests) and the per-call cap (``new_token_clip``)
        self._fixed_length = config.fixed_length_requests
        self._reserve_ratio = 1.0 if self._fixed_length else config.new_token_ratio
        self._clip = config.new_token_clip
        self._next_wf = self.concurrency
        if self.concurrency < n_wf:
            self.wf_arrival[self.concurrency:] = math.nan
        self.wf_finish = np.full(len(workload.workflows), math.nan)
        self.wf_left = np.array([len(w.calls) for w in workload.workflows], dtype=np.int64)
        self.wf_done = 0
        #: Has this segment been computed anywhere yet? (0/1 per segment: bytearrays, read and
        #: written once per prompt segment at every admission)
        self.seg_computed = bytearray(len(workload.seg_tokens))
        #: Tokens of each call's prompt path (its reusable prefix), summed once.
        self.path_tokens = [workload.path_tokens(c) for c in workload.calls]
        self._heap: list[tuple] = []
        self._seq = 0
        self.preemptions = 0
        self.events = 0
        self.host_loaded_tokens = 0
        self.counters: dict[str, int] = {"admission_evictions": 0, "decode_evictions": 0,
                                         "max_waiting": 0}
        policy.bind(self)
        for rep in self.replicas:
            rep.waiting = policy.scheduler.new_queue()

    # --- model pools --------------------------------------------------------------------------
    def candidates(self, req: Request) -> list[Replica]:
        """The replicas that may serve ``req`` (its agent's model pool; all without pools)."""
        if self.pools is None:
            return self.replicas
        return self._pool_reps[self.pools.pool_of_call[req.idx]]

    def home_key(self, req: Request) -> object:
        """Key of a session's home replica for a router: the workflow, per model pool."""
        if self.pools is None:
            return req.wf
        return (req.wf, int(self.pools.pool_of_call[req.idx]))

    def pool_queue_depths(self) -> dict[str, int] | None:
        """Waiting calls per model pool (the idle-downstream term's input); None without pools."""
        if self.pools is None:
            return None
        return {name: sum(len(r.waiting) for r in reps)
                for name, reps in zip(self.pools.names, self._pool_reps)}

    # --- event plumbing -----------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: object) -> None:
        self._seq += 1
        heapq.heappush(self._heap, Event(t, self._seq, kind, payload))

    def add_timer(self, t: float) -> None:
        """Wake the cluster at ``t`` (a policy's TTL expiry may let waiting calls in)."""
        self._push(max(t, self.now), EV_TIMER, None)

    # --- run ----------------------------------------------------------------------------------
    @_cyclic_gc_paused
    def run(self, progress: Callable[[int, int], None] | None = None) -> SimResult:
        for wf in self.workload.workflows[:self.concurrency]:
            self._push(float(self.wf_arrival[wf.idx]), EV_ARRIVE, wf.idx)
        done_wf = 0
        heap = self._heap
        dirty: dict[int, Replica] = {}
        while heap:
            t, _, kind, payload = heapq.heappop(heap)
            self.now = t
            self.events += 1
            if kind == EV_STEP:
                rep = self.replicas[payload.replica]
                if payload.plan_id == rep.plan_id:   # else: a macro-step cut short and rescheduled
                    self._step_end(rep)
                    dirty[rep.idx] = rep
            elif kind == EV_ARRIVE:
                wf = self.workload.workflows[payload]
                for root, off in zip(wf.roots, wf.root_offsets):
                    self._push(t + off, EV_ISSUE, root)
            elif kind == EV_ISSUE:
                rep = self._issue(payload)
                dirty[rep.idx] = rep
            elif kind == EV_LOADED:
                req: Request = payload
                if req.state == LOADING:
                    req.state = RUNNING
                dirty[req.replica] = self.replicas[req.replica]
            elif kind == EV_TIMER:
                self.policy.hook("on_timer")
                for rep in self.replicas:
                    if rep.waiting:
                        dirty[rep.idx] = rep
            elif kind == EV_WAKE:              # a part has idle-capacity work for this replica
                dirty[payload] = self.replicas[payload]
            if dirty and (not heap or heap[0][0] > t):
                # every event of this instant is in: now the replicas react, in index order
                for idx in sorted(dirty):
                    self._wake(dirty[idx])
                dirty.clear()
            if progress is not None and self.wf_done != done_wf:
                done_wf = self.wf_done
                progress(done_wf, len(self.workload.workflows))
        unfinished = [c.request_id for c, r in zip(self.workload.calls, self.requests)
                      if r is None or r.state != DONE]
        if unfinished:
            raise RuntimeError(f"simulation ended with {len(unfinished)} unfinished calls "
                               f"(first: {unfinished[0]}); this is a simulator bug")
        makespan = float(np.nanmax(self.wf_finish) - np.nanmin(self.wf_arrival)) if len(self.wf_finish) else 0.0
        return SimResult(
            policy=self.policy.name, workload=self.workload, config=self.config,
            requests=list(self.requests), wf_arrival=self.wf_arrival, wf_finish=self.wf_finish,
            replica_busy_s=[r.busy_s for r in self.replicas], makespan_s=makespan,
            preemptions=self.preemptions, events=self.events,
            host_loaded_tokens=self.host_loaded_tokens, counters=dict(self.counters),
        )

    # --- issue and routing --------------------------------------------------------------------
    def _issue(self, idx: int) -> Replica:
        call = self.workload.calls[idx]
        req = Request(call, self.now)
        self.requests[idx] = req
        self.issue_t[idx] = self.now
        self.policy.hook("on_issue", req)
        r = self.policy.router.route(req)
        req.replica = r
        rep = self.replicas[r]
        self._enqueue(rep, req)
        if len(rep.waiting) > self.counters["max_waiting"]:
            self.counters["max_waiting"] = len(rep.waiting)
        return rep

    def _enqueue(self, rep: Replica, req: Request) -> None:
        """Queue ``req`` on ``rep``: at its place when the scheduler's order is static (the queue
        stays sorted, ties after equals as a stable sort leaves them), else at the end."""
        sched = self.policy.scheduler
        if sched.static_order:
            bisect.insort_right(rep.waiting, req, key=sched.queue_key)
        else:
            rep.waiting.append(req)
        rep.waiting_tokens += req.call.input_tokens

    # --- a scheduling round -------------------------------------------------------------------
    def _evict(self, rep: Replica, need: int) -> int:
        cp = self.policy.cache
        r = rep.idx
        return rep.cache.evict_gpu(need, self.now, cp.gpu_order(r), cp.host_order(r),
                                   functools.partial(cp.to_host, r))

    def _reserve(self, rep: Replica) -> int:
        """Tokens admission keeps free for the running calls' future decode: SGLang's estimate
        ``new_token_ratio × Σ min(max_new_tokens − decoded, clip)`` with the output length unknown
        (``max_new_tokens`` taken as the clip), or, for fixed-length requests
        (``ClusterConfig.fixed_length_requests``), ``Σ min(output, clip) − decoded`` in full."""
        return int(self._reserve_ratio * sum(self._decode_left(q) for q in rep.running))

    def _decode_left(self, q: Request) -> int:
        """Tokens ``q`` may still decode as admission counts them (see :meth:`_reserve`)."""
        cap = min(q.call.output_tokens, self._clip) if self._fixed_length else self._clip
        return max(cap - q.decoded, 0)

    def _try_admit(self, rep: Replica, req: Request, reserve: int = 0) -> bool:
        call = req.call
        cache = rep.cache
        path = call.path
        gpu_tok, host_tok, n_gpu = cache.match(path)
        need = (self.path_tokens[req.idx] - gpu_tok) + call.own_prompt_tokens + req.decoded + 1 + reserve
        head = path[:n_gpu]
        cache.lock_path(head, self.now)
        free = rep.free_tokens()
        if free < need:
            self.counters["admission_evictions"] += 1
            free += self._evict(rep, need - free)
            if free < need:
                cache.unlock_path(head, self.now)
                return False
        now = self.now
        # materialize the rest of the path: host hits are loaded back, misses recomputed
        # (or, for a call swapped out by a preemption, loaded back from its swap copy)
        missing = 0
        recomputed = 0
        evict_rc = 0
        held = self.held[rep.idx]
        host_left = host_tok
        tok = self.workload.seg_tokens
        swapped = req.swapped
        for s in path[n_gpu:]:
            if host_left > 0 and s in cache.host:
                host_left -= tok[s]
                cache.touch_host(s, now)
            elif not swapped:
                missing += tok[s]
                if self.seg_computed[s]:
                    recomputed += tok[s]
                    if held[s]:
                        evict_rc += tok[s]
                self.seg_computed[s] = True
            cache.insert_gpu(s, now)
            held[s] = True
        cache.lock_path(path[n_gpu:], now)
        req.locked = tuple(path)
        own = call.own_prompt_tokens + req.decoded
        load = host_tok
        if swapped:
            cache.release_host(swapped)
            req.swapped = 0
            load = call.input_tokens + req.decoded - gpu_tok
            prefill = 1
        else:
            prefill = missing + own
        recomputed += req.recompute_own
        req.recomputed_preempt += req.recompute_own
        req.recomputed_evict += evict_rc
        req.recompute_own = 0
        req.private = own
        rep.private += own
        req.prefill_total = max(prefill, 1)
        req.prefill_left = req.prefill_total
        req.missing_path = missing
        ctx = call.input_tokens + req.decoded
        # Per computed token: GEMMs (a), plus the context's KV read once per call (a_ctx, spread
        # over its chunks). A fitted model's context term is not charged when the whole path is a
        # cache hit (only the call's own tokens are computed) unless its fit saw hits pay it
        # (``ctx_on_hits``: fitted on an engine's reported cache hits).
        st = self.step
        ctx_cost = st.a_ctx * ctx if (missing > 0 or st.a_attn > 0 or st.ctx_on_hits) else 0.0
        req.prefill_rate = st.a + ctx_cost / req.prefill_total
        if req.preempts == 0:     # hit ratios describe each call's first admission
            req.gpu_hit = gpu_tok
            req.host_hit = host_tok
        req.computed += prefill
        req.recomputed += recomputed
        if math.isnan(req.t_admit):
            req.t_admit = now
        rep.running.append(req)
        if load > 0:
            req.state = LOADING
            self.host_loaded_tokens += load
            self._push(now + load * self.config.pcie_s_per_token, EV_LOADED, req)
        else:
            req.state = RUNNING
        self.policy.hook("on_admit", req)
        return True

    def preempt(self, rep: Replica, req: Request, swap: bool = False) -> None:
        """Free a running call's KV. In recompute mode it re-prefills its prompt and generated
        tokens when readmitted; with ``swap`` its own KV is copied to the host tier (if room) and
        loaded back over PCIe instead (the shared prefix stays in the radix cache either way)."""
        rep.cache.unlock_path(req.locked, self.now)
        req.locked = ()
        done_prefill = req.prefill_total - req.prefill_left
        own_done = max(0, done_prefill - req.missing_path)
        computed_own = own_done + (req.decoded if req.prefill_left == 0 else 0)
        context = req.call.input_tokens + req.decoded
        if swap and req.prefill_left == 0 and rep.cache.reserve_host(context, self.now):
            req.swapped = context
            self.counters["swapped_tokens"] = self.counters.get("swapped_tokens", 0) + context
            req.recompute_own = 0
        else:
            req.recompute_own = computed_own
        rep.private -= req.private
        req.private = 0
        req.prefill_left = 0
        req.state = WAITING
        req.preempts += 1
        req.t_enqueue = self.now
        self.preemptions += 1
        rep.running.remove(req)
        self._enqueue(rep, req)
        self.policy.hook("on_preempt", req)

    def _admit(self, rep: Replica) -> None:
        if not rep.waiting:
            return
        sched = self.policy.scheduler
        if len(rep.waiting) > 1 and not sched.static_order:
            rep.waiting.sort(key=sched.sort_key())
        cfg = self.config
        chunk = cfg.chunked_prefill_size
        # prefill backlog and the decode reserve's Σ max(clip − decoded, 0), in one pass (the
        # running list holds no finished call: _finish takes it out)
        backlog = 0
        left = 0
        for q in rep.running:
            backlog += q.prefill_left
            left += self._decode_left(q)
        reserve = int(self._reserve_ratio * left)
        while rep.waiting and backlog < chunk:
            req = rep.waiting[0]
            if len(rep.running) >= cfg.max_running_requests:
                if not (sched.slot_preemption and self._preempt_for_slot(rep, req)):
                    break
                reserve = self._reserve(rep)     # the victim went to the end of the queue
            ok = self._try_admit(rep, req, reserve)
            if not ok and sched.kv_preemption:
                ok = self._admit_by_preemption(rep, req)
                reserve = self._reserve(rep)
            if not ok and sched.preemptive:
                rank = sched.preempt_rank(req)
                victims = sorted((q for q in rep.running if sched.preempt_rank(q) > rank),
                                 key=sched.victim_key, reverse=True)
                for v in victims:
                    self.preempt(rep, v, swap=sched.swap_on_preempt)
                    reserve = self._reserve(rep)
                    if self._try_admit(rep, req, reserve):
                        ok = True
                        break
                if victims and not sched.static_order:
                    rep.waiting.sort(key=sched.sort_key())
            if not ok:
                break
            rep.waiting.remove(req)   # the head, unless preemptions re-sorted the queue
            rep.waiting_tokens -= req.call.input_tokens
            backlog += req.prefill_left
            reserve += int(self._reserve_ratio * self._decode_left(req))

    def _preempt_for_slot(self, rep: Replica, req: Request) -> bool:
        """SGLang's priority preemption with a full running set: the running call of the lowest
        priority (newest first among equals) that ``req`` outranks by more than the scheduler's
        threshold is preempted (recompute) to free its slot; False when there is none."""
        sched = self.policy.scheduler
        victims = [q for q in rep.running if q.state != DONE and sched.may_preempt(req, q)]
        if not victims:
            return False
        self.preempt(rep, max(victims, key=sched.victim_key), swap=sched.swap_on_preempt)
        self.counters["slot_preemptions"] = self.counters.get("slot_preemptions", 0) + 1
        return True

    def _admit_by_preemption(self, rep: Replica, req: Request) -> bool:
        """SGLang's priority preemption when the call does not fit in KV (``preempt_to_schedule``
        frees what the new request lacks, not only a slot): the running calls ``req`` outranks by
        more than the threshold (``may_preempt``) are preempted, lowest priority first, until
        ``req`` is admitted — none when even all of their KV (private tokens and the prefix they
        lock; a shared prefix may stay) would not cover its prompt (SGLang checks the sum before
        it commits). True when ``req`` was admitted."""
        sched = self.policy.scheduler
        victims = sorted((q for q in rep.running if q.state != DONE and sched.may_preempt(req, q)),
                         key=sched.victim_key, reverse=True)
        gpu_tok = rep.cache.match(req.call.path)[0]
        lack = (self.path_tokens[req.idx] - gpu_tok + req.call.own_prompt_tokens + req.decoded + 1
                - rep.free_tokens())
        tok = self.workload.seg_tokens
        if not victims or sum(q.private + sum(tok[x] for x in q.locked) for q in victims) < lack:
            return False
        for v in victims:
            self.preempt(rep, v, swap=sched.swap_on_preempt)
            self.counters["kv_preemptions"] = self.counters.get("kv_preemptions", 0) + 1
            if self._try_admit(rep, req, self._reserve(rep)):
                return True
        return False

    def _ensure_decode_memory(self, rep: Replica, steps: int, per_step: int | None = None) -> int:
        """Make room for one token per running call for up to ``steps`` iterations, evicting and
        then preempting; returns how many iterations fit (0 when a preemption changed the batch).
        ``per_step``: the running calls in state RUNNING, when the caller has counted them."""
        if per_step is None:
            per_step = sum(1 for q in rep.running if q.state == RUNNING)
        free = rep.free_tokens()
        want = per_step * steps
        if free < want:
            self.counters["decode_evictions"] += 1
            free += self._evict(rep, want - free)
        if free >= per_step:
            return max(1, min(steps, free // max(per_step, 1)))
        sched = self.policy.scheduler
        while free < per_step:
            victim = max((q for q in rep.running if q.state == RUNNING),
                         key=sched.victim_key, default=None)
            if victim is None:
                break
            self.preempt(rep, victim)
            per_step -= 1
            free = rep.free_tokens()
        return 0

    def _batch(self, rep: Replica) -> tuple[int, int, list[PrefillChunk], list[Request], int]:
        """One pass over the running calls in state RUNNING (admission order): how many, the
        iterations the next step may cover (1 while any prefills, else up to the nearest
        completion, at most ``max_macro_steps``), the prefill chunks (≤ ``chunked_prefill_size``
        tokens, admission order), the decoders and their KV tokens."""
        n = 0
        steps = self.config.max_macro_steps
        prefilling = False
        budget = self.config.chunked_prefill_size
        prefill: list[PrefillChunk] = []
        decoders: list[Request] = []
        kv = 0
        for q in rep.running:
            if q.state != RUNNING:
                continue
            n += 1
            left = q.prefill_left
            if left > 0:
                prefilling = True
                if budget > 0:
                    take = left if left < budget else budget
                    budget -= take
                    prefill.append(PrefillChunk(q, take))
            else:
                decoders.append(q)
                d = q.decoded
                kv += q.input_tokens + d
                if q.output_tokens - d < steps:
                    steps = q.output_tokens - d
        return n, (1 if prefilling else steps), prefill, decoders, kv

    def _round(self, rep: Replica) -> None:
        step = self.step
        k = 0
        for _attempt in range(64):
            self._admit(rep)
            n, steps, prefill, decoders, kv = self._batch(rep)
            if not n:
                break
            k = self._ensure_decode_memory(rep, steps, n)
            if k > 0:
                break      # nothing was preempted (eviction only): the batch stands
        if k <= 0:
            n, _, prefill, decoders, kv = self._batch(rep)
        if not n:
            rep.stepping = False
            rep.plan = None
            if not rep.running and not rep.waiting:
                self._idle_work(rep)
            return
        k = max(k, 1)
        b = len(decoders)
        if prefill:
            # one iteration: weights once (prefill_t0), the chunks, one token per decoder. The
            # decoders' fixed cost t0 is not added again: the weights are read once per iteration
            # (adding it counted the prefill stall twice).
            k = 1
            dt = step.prefill_t0 + step.e * b + step.c * kv
            if step.a_attn > 0:
                for q, take in prefill:
                    pos = q.call.input_tokens + q.decoded - q.prefill_left
                    dt += take * q.prefill_rate + step.a_attn * take * (pos + take / 2)
            else:
                dt += sum(take * q.prefill_rate for q, take in prefill)
        else:
            dt = k * (step.t0 + step.e * b + step.c * kv) + step.c * b * k * (k - 1) / 2
        share = self._compute_share(rep)
        dt *= share
        rep.plan = StepPlan(prefill, decoders, k, dt, kv)
        rep.plan_share = share
        rep.stepping = True
        rep.plan_id += 1
        rep.plan_start = self.now
        self._push(self.now + dt, EV_STEP, StepDue(rep.idx, rep.plan_id))

    def _compute_share(self, rep: Replica) -> float:
        """How many replicas share the host's compute for an iteration of ``rep`` starting now:
        1 plus ``ClusterConfig.compute_share`` per replica mid-iteration when
        ``ClusterConfig.shared_compute``, else 1."""
        if not self.config.shared_compute:
            return 1.0
        return 1.0 + self.config.compute_share * sum(1 for r in self.replicas if r is not rep and r.stepping)

    def _wake(self, rep: Replica) -> None:
        """Something changed on ``rep`` (a call arrived, a load finished, a pin expired): plan a
        round now if idle, or cut a decode macro-step short at the end of the iteration in
        progress so the next round sees the change at the right iteration boundary."""
        if not rep.stepping:
            self._round(rep)
            return
        plan = rep.plan
        _, decoders, k, _, kv = plan
        if k <= 1:
            return
        step = self.step
        b = len(decoders)
        dt0 = (step.t0 + step.e * b + step.c * kv) * rep.plan_share
        growth = step.c * b * rep.plan_share
        done = _steps_within(self.now - rep.plan_start, dt0, growth)
        m = min(k, done + 1)   # the iteration in progress completes
        if m >= k:
            return
        new_dt = m * dt0 + growth * m * (m - 1) / 2
        rep.plan = StepPlan(plan.prefill, decoders, m, new_dt, kv)
        rep.plan_id += 1
        self._push(rep.plan_start + new_dt, EV_STEP, StepDue(rep.idx, rep.plan_id))

    def _step_end(self, rep: Replica) -> None:
        prefill, decoders, k, dt, _ = rep.plan
        rep.plan = None
        rep.stepping = False
        rep.busy_s += dt
        on_step = self.policy.listeners("on_step")
        if on_step:
            batch = [q for q, _ in prefill] + decoders
            for fn in on_step:
                fn(rep.idx, dt, batch)
        now = self.now
        finished: list[Request] = []
        for q, take in prefill:
            q.service_s += dt
            q.prefill_left -= take
            if q.prefill_left == 0:
                q.decoded += 1
                q.private += 1
                rep.private += 1
                if math.isnan(q.t_first):
                    q.t_first = now
                    self.policy.hook("on_first_token", q)
                if q.decoded >= q.call.output_tokens:
                    finished.append(q)
        rep.private += k * len(decoders)
        for q in decoders:
            q.service_s += dt
            d = q.decoded + k
            q.decoded = d
            q.private += k
            if d >= q.output_tokens:
                finished.append(q)
        for q in finished:
            self._finish(rep, q)

    def _finish(self, rep: Replica, req: Request) -> None:
        now = self.now
        cache = rep.cache
        cache.unlock_path(req.locked, now)
        rep.private -= req.private
        req.private = 0
        call = req.call
        cache.insert_gpu(call.own_seg, now)
        self.seg_computed[call.own_seg] = True
        self.held[rep.idx][call.own_seg] = True
        req.state = DONE
        req.t_finish = now
        self.finish_t[req.idx] = now
        rep.running.remove(req)
        self.policy.hook("on_finish", req)
        for ch in call.children:
            self.pending_parents[ch] -= 1
            self.parents_done_t[ch] = max(self.parents_done_t[ch], now)
            if self.pending_parents[ch] == 0:
                self._push(now + max(self.gap_fn(self.workload.calls[ch]), 0.0), EV_ISSUE, ch)
        self.wf_left[req.wf] -= 1
        if self.wf_left[req.wf] == 0:
            self.wf_finish[req.wf] = now
            self.wf_done += 1
            if self._next_wf < len(self.workload.workflows):   # closed population: next one in
                self.wf_arrival[self._next_wf] = now
                self._push(now, EV_ARRIVE, self._next_wf)
                self._next_wf += 1

    # --- elastic pools and idle-capacity work --------------------------------------------------
    # An autoscaler (simulator.autoscale) changes which replicas serve a pool; a part with
    # idle-capacity work (simulator.preprefill) runs background prefill on an idle replica.
    def set_pool_members(self, pool: int, members: Sequence[int]) -> None:
        """Replicas ``members`` now take the new calls of ``pool`` (routers choose among them).
        A replica left out takes no new calls and finishes what it holds (a drain)."""
        if self.pools is None:
            raise ValueError("pool membership needs model pools")
        for r in self.pools.replicas[pool]:
            if self._pool_of_rep.get(r) == pool:
                del self._pool_of_rep[r]
        self.pools.replicas[pool] = sorted(int(r) for r in members)
        self._pool_reps[pool] = [self.replicas[r] for r in self.pools.replicas[pool]]
        for r in self.pools.replicas[pool]:
            self._pool_of_rep[r] = pool

    def pool_of_replica(self, r: int) -> int | None:
        """Index of the pool replica ``r`` takes new calls for (None: starting, draining, free;
        always 0 without pools)."""
        if self.pools is None:
            return 0
        return self._pool_of_rep.get(r)

    def reset_replica(self, r: int) -> None:
        """A replica restarts (a model is loaded): both KV tiers start empty and the parts forget
        what they knew of it (``on_replica_reset``). It must hold no calls."""
        rep = self.replicas[r]
        if rep.running or rep.waiting:
            raise RuntimeError(f"replica {r} restarted while it holds calls")
        rep.cache = ReplicaCache(self.config.kv_capacity_tokens, self.config.host_capacity_tokens,
                                 self.workload.seg_tokens, self.workload.seg_parent)
        rep.private = 0
        self.held[r] = bytearray(len(self.workload.seg_tokens))
        self.policy.hook("on_replica_reset", r)

    def wake(self, r: int) -> None:
        """Have replica ``r`` look for work now (an idle replica asks for idle-capacity work)."""
        self._push(self.now, EV_WAKE, int(r))

    def _idle_work(self, rep: Replica) -> None:
        """An idle replica (nothing running or waiting) asks the parts for background prefill:
        one chunk (:class:`~simulator.policy.IdlePrefill`). It runs as one prefill iteration
        with no call in the batch (the part is told at ``on_step`` with an empty batch); a call
        arriving meanwhile waits for the iteration's end, as for any iteration."""
        job: IdlePrefill | None = self.policy.ask("idle_prefill", rep.idx)
        if job is None:
            return
        take, pos, ctx, total = job.tokens, job.position, job.context, job.total
        st = self.step
        take = max(1, min(int(take), self.config.chunked_prefill_size))
        rate = st.a + st.a_ctx * ctx / max(total, 1)
        rep.plan_share = self._compute_share(rep)
        dt = (st.prefill_t0 + take * rate + st.a_attn * take * (pos + take / 2)) * rep.plan_share
        rep.plan = StepPlan([], [], 1, dt, 0)
        rep.stepping = True
        rep.plan_id += 1
        rep.plan_start = self.now
        self._push(self.now + dt, EV_STEP, StepDue(rep.idx, rep.plan_id))

    def materialize(self, r: int, segs: Sequence[int]) -> int:
        """Put segments computed in the background on replica ``r``'s GPU tier (root first),
        into free KV only; returns the tokens placed (stops at the first that does not fit)."""
        rep = self.replicas[r]
        tok = self.workload.seg_tokens
        placed = 0
        for s in segs:
            if s in rep.cache.gpu:
                continue
            if rep.free_tokens() < tok[s]:
                break
            rep.cache.insert_gpu(s, self.now)
            self.seg_computed[s] = True
            self.held[r][s] = True
            placed += tok[s]
        return placed


def _steps_within(horizon: float, dt0: float, growth: float) -> int:
    """Largest k with k·dt0 + growth·k(k−1)/2 ≤ horizon (decode iterations before an event)."""
    if growth <= 0:
        return int(horizon // dt0) if dt0 > 0 else 1 << 30
    a, b = growth / 2, dt0 - growth / 2
    disc = b * b + 4 * a * horizon
    return int((-b + math.sqrt(disc)) / (2 * a))
