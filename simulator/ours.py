"""Our policy in the simulator: the *same objects* the SGLang plugin and the gateway drive.

Nothing here decides anything on its own; each part turns simulator state into the inputs of one
object of :mod:`policies` and applies its answer, so the simulator scores exactly
what serving runs: the prediction feed (``predictors.Predictor``, profile fit on the *train*
split, clock = simulated time), priority (``PriorityPolicy``, alg. 3, per workflow), capacity
routing (``CapacityPolicy``, alg. 2), keep/drop (``KeepDropPolicy``, alg. 1 + SAGA), prefetch
(``PrefetchPolicy``) and pre-prefill (``Annotation.next_agent``, :mod:`simulator.preprefill`).

Each part can be switched off for an ablation (:func:`build_ours`); the part then falls back to
what ``sglang-rr`` does (FCFS, round robin, LRU, no prefetch). The named variants (``ours-sticky``,
``ours-belady``, ``ours-tokens``, ``ours-seconds``, ``ours-duration-aging``, ``ours-aging-1e-3``,
``ours-no-classes``, ``ours-slot-preempt``, ``ours-cap-8``, ``ours-slowdown-K``, ``ours-slowdown-start-K``,
``ours-monotone``, ``ours-start-rank-T``, ``ours-oldest-q`` and the rest) each change one part to measure what the
default buys. The idle-downstream term of alg. 3 is active only with model pools
(:mod:`simulator.pools`). Autoscaling is not a part of ours: any policy name takes
``+predictive`` or ``+reactive`` (:mod:`simulator.autoscale`).

How each part is applied, and what every variant changes and why: docs/simulator.md ("Ours in
the simulator: parts and variants (simulator/ours.py)").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

from policies import (
    Annotation,
    CapacityPolicy,
    KeepDropPolicy,
    PrefetchPolicy,
    PriorityPolicy,
    RetentionRank,
    SessionEndRule,
)
from policies.bookkeeping import CapacityLedger, SessionPriorityBook, capacity_request
from simulator.baselines import FCFS, LRU, Belady, RoundRobin, StickyLeastLoad
from simulator.cache import EvictionOrder
from simulator.engine import Request, Simulator
from simulator.policy import CachePolicy, Part, Policy, Router, Scheduler
from simulator.preprefill import PrePrefill
from simulator.session_queue import SessionQueue, sglang_int

#: What a policy reads for a call that has no annotation: an unknown one.
NO_PREDICTION = Annotation()


class FeedPrediction(NamedTuple):
    """What :class:`PredictionFeed` attaches to a call (``req.pred``)."""
    #: the annotation contract the gateway would serve
    ann: Annotation
    #: the call's app_metadata (workflow type and id, agent; its stage when recorded)
    meta: dict[str, str]
    #: the tool the call runs (known once its response names it): the keep/drop TTL's tool
    tool: str | None


class PredictionFeed(Part):
    """Drives a ``predictors.Predictor`` with simulated time and attaches its ``Annotation``.

    ``req.pred`` becomes a :class:`FeedPrediction` (the annotation contract the policies read,
    and the tool the call runs, known once its response names it: the keep/drop TTL is that
    tool's p95). The annotation is marked by the gateway's
    end-of-session rule (``session_end``; :class:`SessionEndRule`, the gateway's defaults), so
    the keep/drop and prefetch parts see what the SGLang plugin sees. A call is annotated with
    what a client of the gateway sends (its ids and, when the log records one, its ``stage`` as
    ``app_metadata.stage``) and observed with what the gateway reads off the response (its
    tokens and the ``tool_names`` it called), so stage- and tool-conditioned models are served
    in the replay as in production.
    """

    def __init__(self, predictor: Any, session_end: SessionEndRule | None = None) -> None:
        self.predictor = predictor
        self.session_end = session_end or SessionEndRule()
        self.global_hi = 4096
        self.coverage = 0.99

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        self.predictor.clock = lambda: self.sim.now
        prof = self.predictor.profile
        try:
            self.global_hi = int(prof.data["output_length"]["global"]["hi"])
        except (KeyError, TypeError, AttributeError):
            self.global_hi = 4096
        self.coverage = float(getattr(prof, "coverage", None) or 0.99)

    def on_issue(self, req: Request) -> None:
        wf = self.sim.workload.workflows[req.wf]
        meta = {"workflow_type_id": wf.workflow_type, "workflow_id": wf.workflow_id,
                "agent_id": req.call.agent}
        if req.call.stage is not None:  # what a client of the gateway sends
            meta["stage"] = req.call.stage
        ann = self.session_end.mark(self.predictor.annotate_call(
            meta, request_id=req.call.request_id, input_tokens=req.call.input_tokens), meta)
        req.pred = FeedPrediction(ann, meta, req.call.tool)

    def on_finish(self, req: Request) -> None:
        meta = req.pred.meta if req.pred else None
        if meta is None:
            return
        # the tools the response called, as the gateway reads them off the response
        self.predictor.observe({"app_metadata": meta, "request_id": req.call.request_id,
                                "output_tokens": req.call.output_tokens,
                                "input_tokens": req.call.input_tokens, "t_finish": self.sim.now,
                                "tool_names": list(req.call.tools)})

    # helpers used by the other parts
    def annotation(self, req: Request) -> Annotation | None:
        """The call's annotation contract (None before it was annotated)."""
        return req.pred.ann if req.pred else None

    def served(self, req: Request) -> Annotation:
        """The call's annotation, or an unknown one (no prediction) before it was annotated."""
        return req.pred.ann if req.pred else NO_PREDICTION


class CapacityRouter(Router):
    """``CapacityPolicy.choose`` over the replicas' in-flight requests (see the module table).

    The router knows what a gateway knows, kept in the same :class:`CapacityLedger` the gateway's
    router drives, and routes with the same step (``CapacityLedger.place``: the policy's choice
    with the session's last replica and cached prefix, counted and reserved): the requests it sent (input, predicted bounds, from the call's annotation by
    :func:`capacity_request`, exactly as the gateway builds them) and when they finished, from
    which the ledger measures each replica's drain rate (KV tokens of finished requests per
    second over the last ``drain_window_s``), which the policy uses to tell whether moving a
    session off its replica saves more waiting than the move costs. The policy's
    ``prefill_s_per_token`` is set from the simulated hardware.

    ``risk_split=False`` gives every request one fixed bound instead of its table: the band's
    ``hi`` at ``α = (1 − coverage)/2`` (its upper tail), as a gateway does without tables."""

    def __init__(self, feed: PredictionFeed, policy: CapacityPolicy | None = None,
                 risk_split: bool = True, drain_window_s: float = 60.0) -> None:
        self.feed = feed
        self.policy = policy or CapacityPolicy()
        self.risk_split = risk_split
        self.drain_window_s = drain_window_s
        self.ledger: CapacityLedger | None = None

    @property
    def counts(self) -> dict[str, int]:
        """The ledger's routing counters (``RoutingStats``: decisions, fallbacks, affinity,
        moved_sessions, move_recompute_tokens), the keys the gateway's metrics use."""
        return self.ledger.stats.as_dict()

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        self.policy = replace(self.policy, prefill_s_per_token=sim.config.step.a)
        self.ledger = CapacityLedger([str(rep.idx) for rep in sim.replicas],
                                     drain_window_s=self.drain_window_s, max_sessions=None,
                                     started_at=0.0)

    def drain(self, r: int) -> float | None:
        """KV tokens per second replica ``r`` released over the last ``drain_window_s``."""
        return self.ledger.drain(str(r), self.sim.now)

    def route(self, req: Request) -> int:
        sim = self.sim
        now = sim.now
        ledger = self.ledger
        cap = sim.config.kv_capacity_tokens
        states = [ledger.state(str(rep.idx), cap, now) for rep in sim.candidates(req)]
        ann = self.feed.annotation(req)
        key = sim.home_key(req)
        request = capacity_request(req.call.request_id, req.call.input_tokens, ann, str(req.wf),
                                   default_alpha=self.policy.default_alpha,
                                   unknown_output_tokens=self.feed.global_hi, risk_split=self.risk_split)
        placement = ledger.place(
            self.policy, states, request, now, session=key,
            alpha=request.alpha if ann is not None and ann.known else None, request_id=req.idx)
        return int(placement.replica)

    def on_finish(self, req: Request) -> None:
        self.ledger.finish(req.idx, self.sim.now)


class PriorityScheduler(Scheduler):
    """Workflow-level alg. 3 priority, applied the way the gateway and the SGLang plugin do.

    When a call is issued, its session's base score (``PriorityPolicy.score_annotation`` of the
    call's annotation, i.e. of the session's automaton state after it) becomes the *session's* base, and the
    call's priority is ``session_score(base, age of the workflow)`` — what the predictor sends;
    the plugin then ages it from enqueue (``aged``). Every waiting call of a session is ordered
    by the session's latest score, so the queue key is SGLang's integer priority of
    ``base_wf + aging · (now − workflow start)`` (bigger first), then FCFS. A call without a
    prediction keeps its session's score (``unknown_score`` if it never had one). The sessions'
    scores live in a :class:`SessionPriorityBook`, the object the SGLang plugin keeps them in.

    ``workflow_level=False`` is the earlier rule (each call scored alone, aged from its own
    enqueue time), kept for the ablation. With ``preemption_threshold`` set, a waiting call
    preempts the lowest-priority running call it outranks by more than that many integer
    units when the running set is full (SGLang's ``--priority-scheduling-preemption-threshold``);
    when KV runs out, the lowest priority is retracted first (``--retraction-policy priority``).
    """

    def __init__(self, feed: PredictionFeed, policy: PriorityPolicy | None = None,
                 workflow_level: bool = True, preemption_threshold: int | None = 500,
                 kv_preemption: bool = False) -> None:
        self.feed = feed
        self.policy = policy or PriorityPolicy()
        self.workflow_level = workflow_level
        self.preemption_threshold = preemption_threshold
        self.slot_preemption = preemption_threshold is not None
        self.kv_preemption = kv_preemption and self.slot_preemption
        self.base: dict[int, float] = {}       # per call (workflow_level=False)
        #: wf -> (score of its latest predicted call, when it arrived): the plugin's book
        self.book = SessionPriorityBook(self.policy, max_sessions=None)
        #: The replicas' waiting queues this scheduler orders itself (``new_queue``).
        self.queues: list[SessionQueue] = []

    def _inlined(self) -> bool:
        """Is the order ``(−sglang_int(session score aged), t_enqueue, idx)`` (``sort_key``'s and
        ``SessionQueue``'s inlined arithmetic)? Not for the per-call rule or a policy subclass
        that changes ``to_sglang`` / ``aged``."""
        pol = self.policy
        return (self.workflow_level and type(pol).to_sglang is PriorityPolicy.to_sglang
                and type(pol).aged is PriorityPolicy.aged)

    def new_queue(self) -> Any:
        """A :class:`SessionQueue` (the head without sorting every call; same order as
        ``sort_key``) for the workflow-level rule; a list otherwise."""
        if not self._inlined():
            return []
        refs = self.book.references()
        rate = self.book.rate if self.policy.aging_per_duration is not None else None
        q = SessionQueue(refs.__getitem__, lambda: self.sim.now, self.policy.aging_per_s,
                         self.policy.scale, rate)
        self.queues.append(q)
        return q

    def on_issue(self, req: Request) -> None:
        ann = self.feed.served(req)
        pol = self.policy
        # idle-downstream term: the queue depths of the model pools (multi-model scenarios;
        # with one model there is no other queue that could idle)
        depth = self.sim.pool_queue_depths()
        agent_model = self.sim.pools.agent_pool if depth is not None else None
        if not self.workflow_level:
            self.base[req.idx] = pol.score_annotation(ann, depth, agent_model)
            return
        age = self.sim.now - float(self.sim.wf_arrival[req.wf])
        rate = pol.aging_rate(ann, age)
        # the gateway's one priority rule, on the workflow's simulated age
        score = pol.call_priority(ann, age, depth, agent_model) if ann.known else None
        self.book.note(req.wf, score, self.sim.now, fallback=pol.session_score(pol.unknown_score, age),
                       rate=rate, started_at=float(self.sim.wf_arrival[req.wf]),
                       batch=ann.latency_class != "interactive")
        for q in self.queues:
            q.rekey(req.wf)
        if self.book.guard:
            self._rekey_changed()

    def on_finish(self, req: Request) -> None:
        """The relative guard's liveness (``PriorityPolicy.oldest_share``): a call finished, and
        a call the gateway's end-of-session rule marked ``session_end`` ends its session (what
        the SGLang plugin sees in ``decide_finished``)."""
        if not self.book.guard or not self.workflow_level:
            return
        ann = self.feed.served(req)
        self.book.finished(req.wf, self.sim.now, end=ann.session_end is True)
        self._rekey_changed()

    def _rekey_changed(self) -> None:
        for wf in self.book.changed():
            for q in self.queues:
                q.rekey(wf)

    def priority(self, req: Request) -> int:
        """SGLang integer priority of ``req`` now (bigger runs first)."""
        pol = self.policy
        if not self.workflow_level:
            return pol.to_sglang(pol.aged(self.base[req.idx], req.t_enqueue, self.sim.now))
        return self.book.priority(req.wf, self.sim.now)

    def queue_key(self, req: Request) -> tuple:
        return (-self.priority(req), req.t_enqueue, req.idx)

    def sort_key(self):
        """``queue_key`` with the policy's arithmetic inlined (``to_sglang(aged(score, t, now))``
        for the workflow-level rule): the same order, a fraction of the calls."""
        pol = self.policy
        if not self._inlined():
            return self.queue_key
        now, scale, session, rate = self.sim.now, pol.scale, self.book.references(), self.book.rate

        def key(req: Request) -> tuple:
            score, t = session[req.wf]
            return (-sglang_int(score, t, now, rate(req.wf), scale), req.t_enqueue, req.idx)

        return key

    def may_preempt(self, waiting: Request, running: Request) -> bool:
        return self.priority(waiting) - self.priority(running) > (self.preemption_threshold or 0)


_NEUTRAL = int(RetentionRank.NEUTRAL)


class _RetentionBook(dict):
    """wf -> ``Retention``; setting one also records ``flat[wf]`` = (rank as int, the time a KEEP
    lapses to NEUTRAL, ∞ for the other ranks): what ``Retention.rank_at`` reads, flattened for
    the eviction keys (evaluated once per segment and eviction) — and, once :meth:`size` gave
    the number of workflows, the same as two arrays indexed by wf (``rank``, ``until``; the
    extra last slot, index −1, is the shared segments' NEUTRAL) for whole-tier orders."""

    def __init__(self) -> None:
        super().__init__()
        self.flat: dict[int, tuple[int, float]] = {}
        self.rank = np.full(1, _NEUTRAL, dtype=np.int64)
        self.until = np.full(1, math.inf)

    def size(self, n_workflows: int) -> None:
        self.rank = np.full(n_workflows + 1, _NEUTRAL, dtype=np.int64)
        self.until = np.full(n_workflows + 1, math.inf)
        for wf, (r, until) in self.flat.items():
            self.rank[wf], self.until[wf] = r, until

    def __setitem__(self, wf: int, ret: Any) -> None:
        super().__setitem__(wf, ret)
        keep = ret.rank == RetentionRank.KEEP
        self.flat[wf] = e = (int(ret.rank), ret.retain_until if keep else math.inf)
        if 0 <= wf < len(self.rank) - 1:
            self.rank[wf], self.until[wf] = e


class KeepDropCache(CachePolicy):
    """Eviction order ``(RetentionRank at now, last access)`` from ``KeepDropPolicy`` decisions.

    A session's decision is taken when one of its calls finishes (with the tool that call runs)
    and applies to every segment of the session on both tiers; a session with no decision yet,
    and the shared system prompts, are ``NEUTRAL``. Segments of ``DROP`` sessions are not written
    to host memory when the GPU evicts them."""

    def __init__(self, feed: PredictionFeed, policy: KeepDropPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy or KeepDropPolicy()
        #: wf -> its session's latest ``Retention``
        self.retention: dict[int, Any] = _RetentionBook()
        self.counts = {"keep": 0, "drop": 0, "neutral": 0}

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        self._seg_wf = sim.workload.seg_wf
        self._seg_wf_arr = np.asarray(sim.workload.seg_wf, dtype=np.int64)
        self.retention.size(len(sim.workload.workflows))

    def ranks(self, segs: np.ndarray, now: float) -> np.ndarray:
        """:meth:`rank` of every segment of ``segs`` at ``now`` (arrays)."""
        book = self.retention
        wfs = self._seg_wf_arr[segs]
        return np.where(now >= book.until[wfs], _NEUTRAL, book.rank[wfs])

    def on_finish(self, req: Request) -> None:
        ret = self.policy.decide_annotation(self.feed.served(req), self.sim.now,
                                            req.pred.tool if req.pred else None)
        self.retention[req.wf] = ret
        self.counts[ret.rank.name.lower()] += 1

    def rank(self, seg: int, now: float) -> int:
        """``int(Retention.rank_at(now))`` of the segment's session (NEUTRAL without one)."""
        e = self.retention.flat.get(self._seg_wf[seg])
        if e is None:
            return _NEUTRAL
        return _NEUTRAL if now >= e[1] else e[0]

    def evict_key(self, replica: int, seg: int, now: float) -> tuple:
        return (self.rank(seg, now), self.sim.replicas[replica].cache.gpu[seg])

    def host_key(self, replica: int, seg: int, now: float) -> tuple:
        return (self.rank(seg, now), self.sim.replicas[replica].cache.host.get(seg, 0.0))

    def gpu_order(self, replica: int) -> Any:
        """``evict_key`` of ``replica`` as one closure (the cache calls it once per leaf; the
        replica's tier is read once per eviction, so a restarted replica's new tier is used)."""
        flat, seg_wf, gpu = self.retention.flat, self._seg_wf, self.sim.replicas[replica].cache.gpu

        def key(seg: int, now: float) -> tuple:
            e = flat.get(seg_wf[seg])
            return (_NEUTRAL if e is None or now >= e[1] else e[0], gpu[seg])

        return key

    def host_order(self, replica: int) -> Any:
        """The host tier's whole order by ``host_key`` = ``(rank at now, last access)``, ties by
        segment, computed on arrays (``EvictionOrder``) rather than one key per segment."""

        def order(host: dict, now: float) -> list:
            n = len(host)
            segs = np.fromiter(host.keys(), np.int64, n)
            times = np.fromiter(host.values(), np.float64, n)
            return segs[np.lexsort((segs, times, self.ranks(segs, now)))].tolist()

        return EvictionOrder(order)

    def to_host(self, replica: int, seg: int) -> bool:
        return self.rank(seg, self.sim.now) != int(RetentionRank.DROP)


class HostPrefetch(Part):
    """``PrefetchPolicy`` plans made when a call is issued; a due plan stages the session's prefix
    (the call's prompt path and its own segment) into the host tier of the session's replica —
    only into free host memory or over host copies of *dropped* sessions
    (``PrefetchPolicy.may_stage``); a copy that would displace anything else is skipped."""

    def __init__(self, feed: PredictionFeed, policy: PrefetchPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy
        self.keep_drop: KeepDropCache | None = None
        self.staged_tokens = 0
        self.plans = 0
        self.skipped = 0

    def bind(self, sim: Simulator) -> None:
        super().bind(sim)
        cache = sim.policy.cache
        self.keep_drop = cache if isinstance(cache, KeepDropCache) else None
        if self.policy is None:
            st = sim.config.step
            self.policy = PrefetchPolicy(
                transfer_tok_s=1.0 / sim.config.pcie_s_per_token,
                # a fitted step time may put all prefill cost on the context (a = 0): new tokens free
                prefill_tok_s=1.0 / st.a if st.a > 0 else math.inf, decode_tok_s=1.0 / st.decode_step(0))

    def on_issue(self, req: Request) -> None:
        ann = self.feed.served(req)
        if not ann.known and not ann.session_end:
            return
        now = self.sim.now
        finish = self.policy.predicted_finish(now, req.call.input_tokens, ann.output_lo)
        plan = self.policy.plan(str(req.wf), now, ann.next_agent_id, ann.next_agent_p, finish,
                                req.call.input_tokens + int(ann.output_lo or 0), payload=req,
                                session=str(req.wf), session_end=ann.session_end is True)
        if plan is not None:
            self.plans += 1
            self.sim.add_timer(plan.start_at)

    def _dropped_host(self, cache, now: float) -> list[int]:
        if self.keep_drop is None:
            return []
        # KeepDropCache.rank of every host segment at once (a scan of the host tier), in the
        # tier's order
        segs = np.fromiter(cache.host.keys(), np.int64, len(cache.host))
        return segs[self.keep_drop.ranks(segs, now) == int(RetentionRank.DROP)].tolist()

    def on_timer(self) -> None:
        now = self.sim.now
        tok = self.sim.workload.seg_tokens
        for plan in self.policy.due(now):
            req = plan.payload
            if req.replica < 0:
                continue
            cache = self.sim.replicas[req.replica].cache
            segs = [s for s in (*req.call.path, req.call.own_seg) if s in cache.gpu and s not in cache.host]
            for s in (*req.call.path, req.call.own_seg):
                cache.touch_host(s, now)
            need = sum(tok[s] for s in segs)
            if not need:
                continue
            free = cache.host_capacity - cache.swap_used - cache.host_used
            dropped = self._dropped_host(cache, now) if need > free else []
            if not self.policy.may_stage(need, free, sum(tok[s] for s in dropped)):
                self.skipped += 1
                continue
            for s in sorted(dropped, key=lambda s: cache.host[s]):
                if cache.host_capacity - cache.swap_used - cache.host_used >= need:
                    break
                cache.drop_host(s)
            for s in segs:
                if cache.insert_host(s, now):
                    self.staged_tokens += tok[s]


@dataclass
class OursOptions:
    """Which parts of ours are on, and the policy objects' parameters (their own defaults)."""

    priority: bool = True
    #: Workflow-level priority (the session's score, aged from the workflow's start); False =
    #: the earlier per-call rule (each call aged from its own enqueue time).
    workflow_priority: bool = True
    #: SGLang's ``--priority-scheduling-preemption-threshold`` (None: no priority preemption).
    preemption_threshold: int | None = 500
    #: Priority preemption also when a call does not fit in KV (SGLang's ``preempt_to_schedule``
    #: frees tokens too; ``Simulator._admit_by_preemption``); on by default since issue 39 (no
    #: simulator figure of the README worse beyond its interval, docs/simulator-results.md "Bounded
    #: tail"); off (``ours-slot-preempt``): running slots only, the earlier model.
    kv_preemption: bool = True
    #: "capacity" (CapacityPolicy), "round-robin" (sglang-default's, the ablation) or "sticky"
    #: (session affinity + least load, the routing of continuum-ttl / mori-idleness / belady).
    router: str = "capacity"
    #: Split the risk budget over a replica's requests with each request's bound table (False:
    #: one fixed bound per request, the band's hi at α = (1 − coverage)/2).
    risk_split: bool = True
    keep_drop: bool = True
    prefetch: bool = True
    #: Pre-prefill the predicted next call's known prefix on idle replicas (simulator.preprefill).
    preprefill: bool = True
    belady_eviction: bool = False
    priority_policy: PriorityPolicy = field(default_factory=PriorityPolicy)
    capacity_policy: CapacityPolicy = field(default_factory=CapacityPolicy)
    keep_drop_policy: KeepDropPolicy = field(default_factory=KeepDropPolicy)


#: Ablation variants: name -> which parts are switched off (or put back to an earlier rule).
OURS_VARIANTS: dict[str, dict[str, Any]] = {
    "ours": {},
    "ours-no-priority": {"priority": False},
    "ours-call-aging": {"workflow_priority": False,
                        "priority_policy": PriorityPolicy(aging_per_s=0.05)},
    "ours-no-capacity": {"router": "round-robin"},
    "ours-sticky": {"router": "sticky"},
    "ours-no-move": {"capacity_policy": CapacityPolicy(move_margin=math.inf)},
    "ours-move-own-cost": {"capacity_policy": CapacityPolicy(rebuild_delays_target=False)},
    "ours-move-gain-1": {"capacity_policy": CapacityPolicy(move_gain_ratio=1.0)},
    "ours-move-own-agent": {"capacity_policy": CapacityPolicy(left_behind_weight=0.0)},
    "ours-p99": {"risk_split": False},
    "ours-no-keepdrop": {"keep_drop": False},
    "ours-keep-idle": {"keep_drop_policy": KeepDropPolicy(keep_idle=True)},
    "ours-no-prefetch": {"prefetch": False},
    "ours-no-preprefill": {"preprefill": False},
    "ours-belady": {"belady_eviction": True},
    "ours-seconds": {"priority_policy": PriorityPolicy(remaining_unit="seconds")},
    "ours-tokens": {"priority_policy": PriorityPolicy(remaining_unit="tokens")},
    "ours-no-idle": {"priority_policy": PriorityPolicy(w2=0.0)},
    "ours-duration-aging": {"priority_policy": PriorityPolicy(aging_per_s=0.001,
                                                              aging_per_duration=0.03)},
    "ours-aging-1e-3": {"priority_policy": PriorityPolicy(aging_per_s=0.001)},
    "ours-aging-1e-5": {"priority_policy": PriorityPolicy(aging_per_s=1e-5)},
    "ours-aging-3e-5": {"priority_policy": PriorityPolicy(aging_per_s=3e-5)},
    "ours-aging-1e-4": {"priority_policy": PriorityPolicy(aging_per_s=1e-4)},
    "ours-no-classes": {"priority_policy": PriorityPolicy(interactive_boost=0.0)},
    "ours-kv-preempt": {"kv_preemption": True},      # the default since issue 39: = ours
    "ours-slot-preempt": {"kv_preemption": False},
    "ours-cap-8": {"priority_policy": PriorityPolicy(remaining_cap=8.0)},
    "ours-slowdown-4": {"priority_policy": PriorityPolicy(slowdown_bound=4.0)},
    "ours-slowdown-8": {"priority_policy": PriorityPolicy(slowdown_bound=8.0)},
    "ours-slowdown-start-2": {"priority_policy": PriorityPolicy(slowdown_bound=2.0, overdue_by_start=True)},
    "ours-slowdown-start-4": {"priority_policy": PriorityPolicy(slowdown_bound=4.0, overdue_by_start=True)},
    "ours-slowdown-start-8": {"priority_policy": PriorityPolicy(slowdown_bound=8.0, overdue_by_start=True)},
    "ours-start-rank-0.5": {"priority_policy": PriorityPolicy(rank_skill_min=0.5)},
    "ours-start-rank-0.6": {"priority_policy": PriorityPolicy(rank_skill_min=0.6)},
    "ours-monotone": {"priority_policy": PriorityPolicy(monotone=True)},
    "ours-monotone-aging-3e-5": {"priority_policy": PriorityPolicy(monotone=True, aging_per_s=3e-5)},
    # the relative tail guard (issue 39, ninth round): the oldest q of the live batch sessions
    # run first, by start (docs/simulator-results.md, "Bounded tail")
    **{f"ours-oldest-{q}": {"priority_policy": PriorityPolicy(oldest_share=float(q))}
       for q in ("0.02", "0.05", "0.1")},
    "ours-kv-preempt-no-classes": {"kv_preemption": True,
                                   "priority_policy": PriorityPolicy(interactive_boost=0.0)},
    "ours-seconds-p90": {"priority_policy": PriorityPolicy(remaining_unit="seconds",
                                                           remaining_quantile=0.9)},
}


def build_ours(predictor: Any, name: str = "ours", options: OursOptions | None = None) -> Policy:
    """Our policy (or an ablation variant) around ``predictor`` (a fitted ``Predictor``)."""
    opt = replace(options or OursOptions(), **OURS_VARIANTS.get(name, {}))
    feed = PredictionFeed(predictor)
    routers = {"capacity": lambda: CapacityRouter(feed, opt.capacity_policy, opt.risk_split),
               "round-robin": RoundRobin, "sticky": StickyLeastLoad}
    if opt.router not in routers:
        raise ValueError(f"unknown router {opt.router!r} for ours: {', '.join(routers)}")
    router: Router = routers[opt.router]()
    profile = getattr(predictor, "profile", None)
    # the priority bound to the profile it serves (the gateway's service does the same per version)
    priority = opt.priority_policy.for_profile(getattr(profile, "data", None))
    sched: Scheduler = (PriorityScheduler(feed, priority, opt.workflow_priority,
                                          opt.preemption_threshold, opt.kv_preemption)
                        if opt.priority else FCFS())
    if opt.belady_eviction:
        cache: CachePolicy = Belady()
    elif opt.keep_drop:
        cache = KeepDropCache(feed, opt.keep_drop_policy)
    else:
        cache = LRU()
    extras: tuple[Part, ...] = (feed,)
    if opt.prefetch:
        extras += (HostPrefetch(feed),)
    if opt.preprefill:
        extras += (PrePrefill(feed),)
    off = [k for k in ("priority", "keep_drop", "prefetch", "preprefill") if not getattr(opt, k)]
    if opt.router != "capacity":
        off.append(f"capacity routing (→ {opt.router})")
    desc = "priority + capacity routing + keep/drop + prefetch + pre-prefill (policies)"
    if off:
        desc += "; off: " + ", ".join(off)
    if opt.priority and not opt.workflow_priority:
        desc += "; per-call aging"
    if opt.router == "capacity" and not opt.risk_split:
        desc += "; one fixed bound per request"
    if opt.belady_eviction:
        desc += "; eviction replaced by Bélády MIN"
    return Policy(name, router, sched, cache, desc, extras=extras)


def ours_stats(policy: Policy) -> dict[str, Any]:
    """Counters of our parts after a run (fallback routes, keep/drop decisions, staged tokens)."""
    out: dict[str, Any] = {}
    for part in policy.parts:
        if isinstance(part, CapacityRouter):
            out["capacity_fallbacks"] = part.counts["fallbacks"]
            out["capacity_decisions"] = part.counts["decisions"]
            out["capacity_affinity"] = part.counts["affinity"]
            out["capacity_moved_sessions"] = part.counts["moved_sessions"]
            out["capacity_move_recompute_tokens"] = part.counts["move_recompute_tokens"]
            out["capacity_move_left_behind_tokens"] = part.counts["move_left_behind_tokens"]
        elif isinstance(part, KeepDropCache):
            out["retention_decisions"] = dict(part.counts)
        elif isinstance(part, HostPrefetch):
            out["prefetch_plans"] = part.plans
            out["prefetch_staged_tokens"] = part.staged_tokens
            out["prefetch_skipped"] = part.skipped
        elif isinstance(part, PrePrefill):
            out.update(part.stats())
    return out
