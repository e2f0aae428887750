"""Our policy in the simulator: the *same objects* the SGLang plugin and the gateway drive.

Nothing here decides anything on its own; each part turns simulator state into the inputs of one
object of :mod:`serving_hooks.policies` and applies its answer:

==================  ====================================  ========================================
part                object                                applied as
==================  ====================================  ========================================
prediction feed     ``predictors.Predictor``              ``annotate`` when a call is issued,
                    (profile fit on the *train* split)    ``observe`` when it finishes (clock =
                                                          simulated time) → ``CallView``
priority            ``PriorityPolicy`` (alg. 3)           queue key = SGLang integer priority of
                                                          the aged score (bigger first), FCFS ties
capacity routing    ``CapacityPolicy`` (alg. 2)           ``choose`` over the replicas' in-flight
                                                          requests (input + predicted upper bound,
                                                          α = 1 − band coverage); tie → the
                                                          session's last replica
keep/drop           ``KeepDropPolicy`` (alg. 1 + SAGA)    at completion a ``Retention`` per session;
                                                          eviction order ``(rank at now, LRU)``
                                                          on both tiers; dropped sessions are not
                                                          written to the host tier
prefetch            ``PrefetchPolicy`` (alg. 1)           a plan per call; when due, the session's
                                                          prefix is staged into host memory (copied
                                                          from the GPU, or refreshed in host LRU)
==================  ====================================  ========================================

Each part can be switched off for an ablation (:func:`build_ours`); the part then falls back to
what ``sglang-default`` does (FCFS, round robin, LRU, no prefetch). ``ours-sticky`` replaces only
the capacity router by the session-affinity router the cache-centric baselines use, and
``ours-belady`` only the eviction order by Bélády's MIN (the bound for our keep/drop).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from serving_hooks.policies import (
    ActiveRequest,
    CallView,
    CapacityPolicy,
    KeepDropPolicy,
    PrefetchPolicy,
    PriorityPolicy,
    ReplicaState,
    RetentionRank,
)
from simulator.baselines import FCFS, LRU, Belady, RoundRobin, StickyLeastLoad
from simulator.policy import CachePolicy, Part, Policy, Router, Scheduler

#: The single model every agent is served by in the simulated cluster (queue-depth key of alg. 3).
MODEL = "llm"


class PredictionFeed(Part):
    """Drives a ``predictors.Predictor`` with simulated time and attaches a ``CallView``.

    ``req.pred`` becomes ``{"ann": sys_annotations, "view": CallView}``; the view's tool p95 is
    that of the tool the call runs (known once its response names it).
    """

    def __init__(self, predictor: Any) -> None:
        self.predictor = predictor
        self.global_hi = 4096

    def bind(self, sim) -> None:
        super().bind(sim)
        self.predictor.clock = lambda: self.sim.now
        prof = self.predictor.profile
        try:
            self.global_hi = int(prof.data["output_length"]["global"]["hi"])
        except (KeyError, TypeError, AttributeError):
            self.global_hi = 4096
        self.coverage = float(getattr(prof, "coverage", None) or 0.99)

    def on_issue(self, req) -> None:
        wf = self.sim.workload.workflows[req.wf]
        meta = {"workflow_type_id": wf.workflow_type, "workflow_id": wf.workflow_id,
                "agent_id": req.call.agent}
        ann = self.predictor.annotate(meta, request_id=req.call.request_id,
                                      input_tokens=req.call.input_tokens)
        view = CallView.from_sys_annotations(ann, meta, tool=req.call.tool)
        req.pred = {"ann": ann, "meta": meta, "view": view}

    def on_finish(self, req) -> None:
        meta = req.pred["meta"] if req.pred else None
        if meta is None:
            return
        self.predictor.observe({"app_metadata": meta, "request_id": req.call.request_id,
                                "output_tokens": req.call.output_tokens,
                                "input_tokens": req.call.input_tokens, "t_finish": self.sim.now})

    # helpers used by the other parts
    def view(self, req) -> CallView:
        return req.pred["view"] if req.pred else CallView()

    def upper_bound(self, req) -> int:
        v = self.view(req)
        return int(v.pred_out_hi) if v.known and v.pred_out_hi is not None else self.global_hi


class CapacityRouter(Router):
    """``CapacityPolicy.choose`` over the replicas' in-flight requests (see the module table)."""

    def __init__(self, feed: PredictionFeed, policy: CapacityPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy or CapacityPolicy()
        self.home: dict[int, int] = {}
        self.active: list[dict[int, ActiveRequest]] = []
        self.fallbacks = 0
        self.decisions = 0

    def bind(self, sim) -> None:
        super().bind(sim)
        self.active = [{} for _ in sim.replicas]
        self.alpha = max(1e-6, 1.0 - self.feed.coverage)

    def route(self, req) -> int:
        sim = self.sim
        cap = sim.config.kv_capacity_tokens
        states = [ReplicaState(str(i), cap, tuple(act.values())) for i, act in enumerate(self.active)]
        view = self.feed.view(req)
        hi = self.feed.upper_bound(req)
        lo = view.pred_out_lo if view.known and view.pred_out_lo is not None else hi / 2
        home = self.home.get(req.wf)
        placement = self.policy.choose(
            states, req.call.input_tokens, hi, alpha=self.alpha if view.known else None,
            expected_out=(lo + hi) / 2, last_replica=None if home is None else str(home))
        r = int(placement.replica)
        self.decisions += 1
        self.fallbacks += placement.fallback
        self.home[req.wf] = r
        self.active[r][req.idx] = ActiveRequest(req.call.request_id, req.call.input_tokens, hi,
                                                self.alpha if view.known else self.policy.default_alpha,
                                                str(req.wf))
        return r

    def on_finish(self, req) -> None:
        self.active[req.replica].pop(req.idx, None)


class PriorityScheduler(Scheduler):
    """Queue key from ``PriorityPolicy``: SGLang's integer priority of the aged score, bigger
    first, then FCFS (``_sort_by_priority_and_fcfs``). Queue depth of the one model is the
    number of calls waiting in the cluster when the call is issued."""

    def __init__(self, feed: PredictionFeed, policy: PriorityPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy or PriorityPolicy()
        self.base: dict[int, float] = {}

    def on_issue(self, req) -> None:
        depth = sum(len(rep.waiting) for rep in self.sim.replicas)
        view = self.feed.view(req)
        self.base[req.idx] = self.policy.score_view(
            view, queue_depth={MODEL: depth}, agent_model=_AllToOneModel())

    def queue_key(self, req):
        aged = self.policy.aged(self.base[req.idx], req.t_issue, self.sim.now)
        return (-self.policy.to_sglang(aged), req.t_issue, req.idx)


class _AllToOneModel(dict):
    """``agent → model`` map sending every agent to the cluster's single model."""

    def get(self, key, default=None):  # noqa: D401 - dict protocol
        return MODEL


class KeepDropCache(CachePolicy):
    """Eviction order ``(RetentionRank at now, last access)`` from ``KeepDropPolicy`` decisions.

    A session's decision is taken when one of its calls finishes (with the tool that call runs)
    and applies to every segment of the session on both tiers; a session with no decision yet,
    and the shared system prompts, are ``NEUTRAL``. Segments of ``DROP`` sessions are not written
    to host memory when the GPU evicts them."""

    def __init__(self, feed: PredictionFeed, policy: KeepDropPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy or KeepDropPolicy()
        self.retention: dict[int, Any] = {}
        self.counts = {"keep": 0, "drop": 0, "neutral": 0}

    def on_finish(self, req) -> None:
        view = self.feed.view(req)
        ret = self.policy.decide_view(view, self.sim.now)
        self.retention[req.wf] = ret
        self.counts[ret.rank.name.lower()] += 1

    def _rank(self, seg: int, now: float) -> int:
        wf = self.sim.workload.seg_wf[seg]
        ret = self.retention.get(wf) if wf >= 0 else None
        return int(ret.rank_at(now)) if ret is not None else int(RetentionRank.NEUTRAL)

    def evict_key(self, replica, seg, now):
        return (self._rank(seg, now), self.sim.replicas[replica].cache.gpu[seg])

    def host_key(self, replica, seg, now):
        return (self._rank(seg, now), self.sim.replicas[replica].cache.host.get(seg, 0.0))

    def to_host(self, replica, seg) -> bool:
        return self._rank(seg, self.sim.now) != int(RetentionRank.DROP)


class HostPrefetch(Part):
    """``PrefetchPolicy`` plans made when a call is issued; due plans stage the session's prefix
    (the call's prompt path and its own segment) into the host tier of the session's replica."""

    def __init__(self, feed: PredictionFeed, policy: PrefetchPolicy | None = None) -> None:
        self.feed = feed
        self.policy = policy
        self.staged_tokens = 0
        self.plans = 0

    def bind(self, sim) -> None:
        super().bind(sim)
        if self.policy is None:
            st = sim.config.step
            self.policy = PrefetchPolicy(
                transfer_tok_s=1.0 / sim.config.pcie_s_per_token,
                prefill_tok_s=1.0 / st.a, decode_tok_s=1.0 / st.decode_step(0))

    def on_issue(self, req) -> None:
        view = self.feed.view(req)
        if not view.known:
            return
        now = self.sim.now
        finish = self.policy.predicted_finish(now, req.call.input_tokens, view.pred_out_lo)
        plan = self.policy.plan(str(req.wf), now, view.next_agent, view.next_agent_p, finish,
                                req.call.input_tokens + int(view.pred_out_lo or 0), payload=req)
        if plan is not None:
            self.plans += 1
            self.sim.add_timer(plan.start_at)

    def on_timer(self) -> None:
        now = self.sim.now
        for plan in self.policy.due(now):
            req = plan.payload
            if req.replica < 0:
                continue
            cache = self.sim.replicas[req.replica].cache
            for s in (*req.call.path, req.call.own_seg):
                if s in cache.host:
                    cache.touch_host(s, now)
                elif s in cache.gpu and cache.insert_host(s, now):
                    self.staged_tokens += self.sim.workload.seg_tokens[s]


@dataclass
class OursOptions:
    """Which parts of ours are on, and the policy objects' parameters (their own defaults)."""

    priority: bool = True
    #: "capacity" (CapacityPolicy), "round-robin" (sglang-default's, the ablation) or "sticky"
    #: (session affinity + least load, the routing of continuum-ttl / mori-idleness / belady).
    router: str = "capacity"
    keep_drop: bool = True
    prefetch: bool = True
    belady_eviction: bool = False
    priority_policy: PriorityPolicy = field(default_factory=PriorityPolicy)
    capacity_policy: CapacityPolicy = field(default_factory=CapacityPolicy)
    keep_drop_policy: KeepDropPolicy = field(default_factory=KeepDropPolicy)


#: Ablation variants: name -> which parts are switched off.
OURS_VARIANTS: dict[str, dict[str, bool]] = {
    "ours": {},
    "ours-no-priority": {"priority": False},
    "ours-no-capacity": {"router": "round-robin"},
    "ours-sticky": {"router": "sticky"},
    "ours-no-keepdrop": {"keep_drop": False},
    "ours-no-prefetch": {"prefetch": False},
    "ours-belady": {"belady_eviction": True},
}


def build_ours(predictor: Any, name: str = "ours", options: OursOptions | None = None) -> Policy:
    """Our policy (or an ablation variant) around ``predictor`` (a fitted ``Predictor``)."""
    opt = options or OursOptions()
    for key, value in OURS_VARIANTS.get(name, {}).items():
        opt = _replace(opt, key, value)
    feed = PredictionFeed(predictor)
    routers = {"capacity": lambda: CapacityRouter(feed, opt.capacity_policy),
               "round-robin": RoundRobin, "sticky": StickyLeastLoad}
    if opt.router not in routers:
        raise ValueError(f"unknown router {opt.router!r} for ours: {', '.join(routers)}")
    router: Router = routers[opt.router]()
    sched: Scheduler = PriorityScheduler(feed, opt.priority_policy) if opt.priority else FCFS()
    if opt.belady_eviction:
        cache: CachePolicy = Belady()
    else:
        cache = KeepDropCache(feed, opt.keep_drop_policy) if opt.keep_drop else LRU()
    extras: tuple[Part, ...] = (feed,)
    if opt.prefetch:
        extras += (HostPrefetch(feed),)
    off = [k for k in ("priority", "keep_drop", "prefetch") if not getattr(opt, k)]
    if opt.router != "capacity":
        off.append(f"capacity routing (→ {opt.router})")
    desc = "priority + capacity routing + keep/drop + prefetch (serving_hooks.policies)"
    if off:
        desc += "; off: " + ", ".join(off)
    if opt.belady_eviction:
        desc += "; eviction replaced by Bélády MIN"
    return Policy(name, router, sched, cache, desc, extras=extras)


def _replace(opt: OursOptions, key: str, value) -> OursOptions:
    from dataclasses import replace

    return replace(opt, **{key: value})


def ours_stats(policy: Policy) -> dict[str, Any]:
    """Counters of our parts after a run (fallback routes, keep/drop decisions, staged tokens)."""
    out: dict[str, Any] = {}
    for part in policy.parts:
        if isinstance(part, CapacityRouter):
            out["capacity_fallbacks"] = part.fallbacks
            out["capacity_decisions"] = part.decisions
        elif isinstance(part, KeepDropCache):
            out["retention_decisions"] = dict(part.counts)
        elif isinstance(part, HostPrefetch):
            out["prefetch_plans"] = part.plans
            out["prefetch_staged_tokens"] = part.staged_tokens
    return out
