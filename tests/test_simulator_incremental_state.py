"""The simulator's incremental state equals a from-scratch recomputation, at every step.

The speed work (``bench/bench_sim_speed.py``) replaced recomputations by state kept up to date:
the capacity ledger's sums (``ActiveTotals``), ours' waiting queue (``SessionQueue``), the
replicas' waiting-token counts, one fused pass per round (``Simulator._batch``) and eviction keys
read directly. Each is checked here against the computation it replaced — on its own with
adversarial inputs, and inside a real contended run of ``ours`` after every event that touches
it — and a whole run with the recomputations gives the same outcome, call by call.
"""
from __future__ import annotations

import math
import random
from types import SimpleNamespace

import pytest

from policies.bookkeeping import CapacityLedger
from policies.capacity import (ActiveRequest, ActiveTotals, CapacityPolicy,
                                             ReplicaState)
from simulator.baselines import BASELINES, LRU
from simulator.cache import EvictionOrder, ReplicaCache, lru_order
from simulator.config import ClusterConfig
from simulator.engine import RUNNING, Simulator
from simulator.ours import CapacityRouter, KeepDropCache, PriorityScheduler, build_ours
from simulator.policy import CachePolicy, Part, Policy
from simulator.runner import arrival_times, prepare
from simulator.session_queue import SessionQueue, sglang_int
from simulator.sources import make_predictor
from policies import Retention, RetentionRank

#: Two small replicas and a short running set: queues form, slot preemptions happen.
CFG = ClusterConfig(replicas=2, kv_capacity_tokens=60_000, max_running_requests=6)


# --------------------------------------------------------------------------------- ActiveTotals
def _random_request(rng: random.Random, i: int, tables: list) -> ActiveRequest:
    table = rng.choice(tables) if rng.random() < 0.6 else ()
    return ActiveRequest(str(i), rng.randint(1, 9000), rng.randint(1, 5000), rng.choice([0.01, 0.003, 1e-6, 0.02]),
                         None, table, rng.random() * 3000 + rng.random() * 1e-7)


def test_active_totals_running_sums_equal_the_sums_from_scratch_bit_for_bit():
    rng = random.Random(7)
    tables = [((0.05, 100), (0.01, 400), (0.001, 2000)), ((0.1, 30), (0.02, 90))]
    totals, live = ActiveTotals(), {}
    for i in range(3000):
        if live and rng.random() < 0.45:
            r = live.pop(rng.choice(list(live)))
            totals.remove(r)
        else:
            r = _random_request(rng, i, tables)
            live[r.request_id] = r
            totals.add(r)
        s = totals.summary()
        assert s == ActiveTotals.of(live.values()).summary()
        assert s.expected_tokens == math.fsum(r.expected_tokens for r in live.values())
        assert s.fixed_alpha == math.fsum(r.alpha for r in live.values() if not r.upper_bounds)
        assert s.bound_tokens == sum(r.bound_tokens for r in live.values())
    assert totals.count == len(live)


def test_a_state_with_the_kept_summary_decides_as_one_summed_over_its_requests():
    rng = random.Random(3)
    tables = [((0.05, 100), (0.01, 400), (0.001, 2000))]
    pol = CapacityPolicy()
    for _ in range(200):
        active = tuple(_random_request(rng, i, tables) for i in range(rng.randint(0, 12)))
        kept = ReplicaState("r", 60_000, active, summary=ActiveTotals.of(active).summary())
        scratch = ReplicaState("r", 60_000, active)
        for table in ((), tables[0]):
            args = (rng.randint(1, 9000), rng.randint(1, 4000), 0.01, 500.0, table)
            assert pol.check(kept, *args) == pol.check(scratch, *args)


def test_the_ledger_keeps_its_totals_through_starts_restarts_and_finishes():
    rng = random.Random(11)
    led = CapacityLedger(["a", "b"], max_sessions=None)
    tables = [((0.05, 100), (0.01, 400))]
    for i in range(500):
        rid = rng.randint(0, 60)           # ids come back: a restart replaces the reservation
        if rng.random() < 0.4:
            led.finish(rid, float(i))
        else:
            led.start(rid, rng.choice("ab"), _random_request(rng, rid, tables), float(i), session=rid % 7)
        for name in "ab":
            assert led.totals(name).summary() == ActiveTotals.of(led.active(name)).summary()
            assert led.state(name, 60_000, float(i)).active == tuple(led._active[name].values())
        assert led.bound_tokens() == {n: sum(q.bound_tokens for q in led.active(n)) for n in "ab"}


# --------------------------------------------------------------------------------- SessionQueue
def _sorted_like_the_engine(calls, refs, now, rate, scale):
    return sorted(calls, key=lambda c: (-sglang_int(*refs[c.wf], now, rate(c.wf), scale),
                                        c.t_enqueue, c.idx))


@pytest.mark.parametrize("aging,scale", [(0.001, 1000.0), (0.0, 1000.0), (0.37, 3.0)])
def test_session_queue_head_and_order_are_the_sorted_lists(aging, scale):
    """Sessions whose anchors are within one integer unit (ties that come and go with ``now``),
    rekeyed sessions, calls appended after a sort: the head is always what sorting gave."""
    _check_session_queue(aging, scale, None)


@pytest.mark.parametrize("scale", [1000.0, 3.0])
def test_session_queue_with_per_session_rates_is_the_sorted_list(scale):
    """Aging on each session's own time scale (``PriorityPolicy.aging_per_duration``): sessions
    age at different rates, so their order changes with ``now`` and a rekey may move a session
    to another rate; the queue (one heap per rate) still heads and iterates exactly as a
    brute-force sort by the score."""
    _check_session_queue(0.001, scale, [0.0, 0.00025, 0.001, 0.004, 0.37])


def _check_session_queue(aging, scale, rate_choices):
    rng = random.Random(5)
    refs: dict[int, tuple[float, float]] = {}
    rates: dict[int, float] = {}
    clock = SimpleNamespace(now=0.0)
    rate = (lambda wf: aging) if rate_choices is None else rates.__getitem__
    q = SessionQueue(refs.__getitem__, lambda: clock.now, aging, scale,
                     None if rate_choices is None else rate)
    shadow: list = []             # the engine's list: sorted part, then appended calls
    idx = 0
    for step in range(2500):
        clock.now += rng.choice([0.0, 0.2, 0.5, 1.0, 7.3])
        op = rng.random()
        if op < 0.35:                                   # a call is issued (its session re-noted)
            wf = rng.randrange(25)
            if wf not in refs or rng.random() < 0.5:
                # scores on a 1/scale grid, offsets of a fraction of a unit: near-ties
                refs[wf] = (rng.randint(0, 6) / scale + rng.choice([0.0, 0.4, 0.5, 0.6]) / scale,
                            clock.now)
                if rate_choices is not None:
                    rates[wf] = rng.choice(rate_choices)
                q.rekey(wf)
            c = SimpleNamespace(wf=wf, idx=idx, t_enqueue=clock.now)
            idx += 1
            q.append(c)
            shadow.append(c)
        elif op < 0.55 and len(shadow) > 1:               # an admission round sorts the queue
            q.sort()
            shadow = _sorted_like_the_engine(shadow, refs, clock.now, rate, scale)
            assert list(q) == shadow
            for _ in range(rng.randint(1, 3)):             # ... and admits from the head
                if not shadow:
                    break
                assert q[0] is shadow[0]
                q.remove(shadow.pop(0))
        elif op < 0.65 and shadow:                         # any call may leave (tail or sorted)
            c = shadow.pop(rng.randrange(len(shadow)))
            q.remove(c)
        assert len(q) == len(shadow) and bool(q) == bool(shadow)


# -------------------------------------------------------------------------- eviction key forms
def test_eviction_key_functions_give_the_policies_keys():
    host = {1: 4.0, 3: 2.5, 0: 4.0, 4: 1.0, 2: 2.5, 5: 4.0}     # equal times: ties by segment
    sim = SimpleNamespace(now=5.0, workload=SimpleNamespace(seg_wf=[-1, 0, 1, 2, 0, 3],
                                                            workflows=[0, 1, 2, 3]),
                          replicas=[SimpleNamespace(cache=SimpleNamespace(
                              gpu={0: 1.0, 1: 2.0, 2: 3.0, 3: 0.5, 4: 9.0, 5: 9.0}, host=host))])
    feed = SimpleNamespace(view=lambda req: None)
    kd = KeepDropCache(feed)
    kd.retention[3] = Retention(RetentionRank.KEEP, 5.5, 1.0, "set before the bind")
    kd.bind(sim)
    kd.retention[0] = Retention(RetentionRank.KEEP, 6.0, 1.0, "keep")
    kd.retention[1] = Retention(RetentionRank.DROP, 1.0, 1.0, "drop")
    gpu_key, host_order = kd.gpu_order(0), kd.host_order(0)
    for now in (5.0, 5.5, 6.0, 7.0):      # the KEEPs lapse to NEUTRAL at 5.5 and 6
        for seg in range(6):
            assert gpu_key(seg, now) == kd.evict_key(0, seg, now)
            want = int(kd.retention[sim.workload.seg_wf[seg]].rank_at(now)) \
                if sim.workload.seg_wf[seg] in kd.retention else int(RetentionRank.NEUTRAL)
            assert kd.rank(seg, now) == want
        heap_order = [s for _, s in sorted((kd.host_key(0, s, now), s) for s in host)]
        assert host_order.order(host, now) == heap_order
    # LRU reads the access times directly (None); an override is called
    lru = LRU()
    lru.bind(sim)
    assert lru.gpu_order(0) is None and lru.host_order(0) is None
    assert kd.gpu_order(0) is not None and BASELINES["saga"]().cache.gpu_order(0) is not None


def test_lru_eviction_without_a_key_evicts_what_the_explicit_key_does():
    def cache() -> ReplicaCache:
        c = ReplicaCache(500, 300, [100, 30, 40, 60, 20, 80], [-1, 0, 0, 1, 3, -1])
        for t, s in enumerate([0, 1, 2, 3, 4, 5]):
            c.insert_gpu(s, float(t))
        c.insert_host(5, 0.0)
        c.pin(2, 4.0)
        return c

    a, b = cache(), cache()
    freed_a = a.evict_gpu(250, 3.0, None, None)
    freed_b = b.evict_gpu(250, 3.0, lambda s, now: b.gpu[s], lambda s, now: b.host[s])
    assert freed_a == freed_b and a.gpu == b.gpu and a.host == b.host and a.pinned == b.pinned
    tier = {7: 3.0, 2: 1.0, 5: 3.0, 1: 2.0}
    assert lru_order(tier) == [s for _, s in sorted((t, s) for s, t in tier.items())] == [2, 1, 5, 7]


def test_the_host_tier_evicts_along_a_whole_order_as_along_its_key():
    def cache() -> ReplicaCache:
        c = ReplicaCache(1000, 100, [10] * 20, [-1] * 20)
        for s in range(10):
            c.insert_host(s, float(s % 3))
        return c

    key = lambda s, now: (s % 2, -s)                       # noqa: E731 - odd last, high first
    order = EvictionOrder(lambda tier, now: [s for _, s in sorted((key(s, now), s) for s in tier)])
    a, b = cache(), cache()
    for s in range(10, 14):
        a.insert_host(s, 5.0, key)
        b.insert_host(s, 5.0, order)
    assert a.host == b.host and a.host_used == b.host_used


# ------------------------------------------------------------------------------ hook dispatch
def test_hooks_skip_no_ops_and_reach_overrides_and_patched_methods():
    seen = []

    class Counts(Part):
        def on_issue(self, req):
            seen.append(("counts", req))

    router, sched, cache = BASELINES["sglang-rr"]().router, BASELINES["sglang-rr"]().scheduler, LRU()
    pol = Policy("p", router, sched, cache, extras=(Counts(),))
    sched.on_issue = lambda req: seen.append(("patched", req))
    pol.bind(SimpleNamespace())
    pol.hook("on_issue", 1)
    assert seen == [("counts", 1), ("patched", 1)]
    assert pol.listeners("on_step") == [] and pol.listeners("on_finish") == []
    assert isinstance(cache, CachePolicy)


# ------------------------------------------------------------------- a contended run of ours
@pytest.fixture(scope="module")
def coding(tmp_path_factory):
    return prepare("coding-assistant", 40, seed=4, n_train=60,
                   profile_dir=tmp_path_factory.mktemp("prof"), cfg=CFG)


def _reference_batch(sim: Simulator, rep) -> tuple:
    """The round's batch as the engine computed it before ``_batch`` fused the passes."""
    active = [q for q in rep.running if q.state == RUNNING]
    if any(q.prefill_left > 0 for q in active):
        steps = 1
    else:
        steps = min([q.remaining_output for q in active] + [sim.config.max_macro_steps])
    budget = sim.config.chunked_prefill_size
    prefill, decoders = [], []
    for q in active:
        if q.prefill_left > 0:
            if budget > 0:
                take = min(q.prefill_left, budget)
                budget -= take
                prefill.append((q, take))
        else:
            decoders.append(q)
    kv = sum(q.call.input_tokens + q.decoded for q in decoders)
    return len(active), steps, prefill, decoders, kv


class CheckedSimulator(Simulator):
    """Checks every piece of incremental state against its recomputation as the run goes."""

    checks = 0

    def _check(self) -> None:
        CheckedSimulator.checks += 1
        for rep in self.replicas:
            assert rep.waiting_tokens == sum(q.call.input_tokens for q in rep.waiting)
            assert rep.private == sum(q.private for q in rep.running)
            assert rep.load_tokens() == (sum(q.call.input_tokens + q.decoded for q in rep.running)
                                         + sum(q.call.input_tokens for q in rep.waiting))
        router = self.policy.router
        if isinstance(router, CapacityRouter):
            led = router.ledger
            for rep in self.replicas:
                name = str(rep.idx)
                assert led.totals(name).summary() == ActiveTotals.of(led.active(name)).summary()
                kept = led.state(name, self.config.kv_capacity_tokens, self.now)
                scratch = ReplicaState(name, kept.capacity_tokens, kept.active,
                                       drain_tokens_per_s=kept.drain_tokens_per_s)
                for args in ((2000, 800, 0.01, 400.0, ()), (2000, 800, 0.01, 400.0, ((0.05, 300), (0.001, 900)))):
                    assert router.policy.check(kept, *args) == router.policy.check(scratch, *args)

    def _admit(self, rep) -> None:
        q = rep.waiting
        if isinstance(q, SessionQueue) and len(q) > 1:
            # what the engine's list would hold after its sort: every waiting call by sort_key
            want = sorted(list(q), key=self.policy.scheduler.sort_key())
            q.sort()
            assert list(q) == want and q[0] is want[0]
        self._check()
        super()._admit(rep)

    def _batch(self, rep) -> tuple:
        got = super()._batch(rep)
        assert got == _reference_batch(self, rep)
        return got

    def _step_end(self, rep) -> None:
        super()._step_end(rep)
        self._check()


def _outcome(res) -> list[tuple]:
    return [(r.t_admit, r.t_first, r.t_finish, r.preempts, r.recomputed, r.replica) for r in res.requests]


def _run(coding, sim_cls=Simulator, reference: bool = False):
    policy = build_ours(make_predictor(coding.profile))
    if reference:            # the recomputations the speed work replaced
        policy.scheduler.new_queue = lambda: []
        led_state = CapacityLedger.state

        def state_from_scratch(self, replica, capacity_tokens, now, **kw):
            s = led_state(self, replica, capacity_tokens, now, **kw)
            return ReplicaState(s.name, s.capacity_tokens, s.active, s.reported_tokens,
                                s.unreported_tokens, s.drain_tokens_per_s)

        policy.router.bind = _bound_with(policy.router, state_from_scratch)
    arrivals = arrival_times(coding.workload, 0.5, 0)
    sim = sim_cls(coding.workload, policy, CFG, arrivals)
    return sim, sim.run()


def _bound_with(router: CapacityRouter, state_fn):
    bind = router.bind

    def bind_then_patch(sim):
        bind(sim)
        router.ledger.state = state_fn.__get__(router.ledger)

    return bind_then_patch


@pytest.mark.slow
def test_every_step_of_a_contended_run_of_ours_matches_the_recomputation(coding):
    CheckedSimulator.checks = 0
    sim, res = _run(coding, CheckedSimulator)
    assert isinstance(sim.replicas[0].waiting, SessionQueue)
    assert res.counters["max_waiting"] > 3 and res.counters.get("slot_preemptions", 0) > 0
    assert CheckedSimulator.checks > 500


def test_a_run_with_the_recomputations_gives_the_same_outcome_call_by_call(coding):
    sim_fast, fast = _run(coding)
    sim_ref, ref = _run(coding, reference=True)
    assert isinstance(sim_fast.replicas[0].waiting, SessionQueue)
    assert isinstance(sim_ref.replicas[0].waiting, list)
    assert _outcome(fast) == _outcome(ref)
    assert list(fast.wf_finish) == list(ref.wf_finish)


def test_a_scheduler_without_the_inlined_order_keeps_a_list(coding):
    pol = build_ours(make_predictor(coding.profile), "ours-call-aging")
    assert isinstance(pol.scheduler, PriorityScheduler) and pol.scheduler.new_queue() == []


# ------------------------------------------------------------ the cache-aware router's prune
def test_cache_aware_prune_takes_what_sorting_the_whole_tree_took():
    """The router's trees are kept in access order; pruning takes the oldest instant's entries
    (newest segment first) instead of sorting the whole tree by ``(last access, −segment)``."""
    from simulator.baselines import CacheAware

    rng = random.Random(9)
    n_seg = 300
    tok = [rng.randint(1, 50) for _ in range(n_seg)]
    sim = SimpleNamespace(now=0.0, replicas=[SimpleNamespace(idx=0)],
                          workload=SimpleNamespace(seg_tokens=tok))
    router = CacheAware(max_tree_size=4 * 1500, chars_per_token=4.0, eviction_interval_s=1e9)
    router.bind(sim)
    ref: dict[int, list] = {}
    ref_size = 0.0
    for _ in range(400):
        sim.now += rng.choice([0.0, 0.0, 1.0, 2.5])          # many calls share an instant
        path = tuple(sorted(rng.sample(range(n_seg - 1), rng.randint(1, 6))))
        own = n_seg - 1 if rng.random() < 0.2 else rng.randrange(n_seg)
        call = SimpleNamespace(path=path, own_seg=own, own_prompt_tokens=rng.randint(0, tok[own]))
        router._insert(0, SimpleNamespace(call=call))
        for s, n in [*((s, tok[s]) for s in path), (own, call.own_prompt_tokens)]:   # the old tree
            e = ref.get(s)
            if e is None:
                ref[s] = [n, sim.now]
                ref_size += n
            else:
                if n > e[0]:
                    ref_size += n - e[0]
                    e[0] = n
                e[1] = sim.now
        if rng.random() < 0.1:
            router._evict()
            if ref_size > router.max_tree_tokens:         # the old prune: sort everything
                for s in sorted(ref, key=lambda s: (ref[s][1], -s)):
                    ref_size -= ref.pop(s)[0]
                    if ref_size <= router.max_tree_tokens:
                        break
            assert dict(router.tree[0]) == ref and router.size[0] == ref_size
