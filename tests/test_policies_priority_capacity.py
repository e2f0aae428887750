"""Priority (Pythia alg. 3) and capacity (alg. 2) policies against hand-computed cases."""
from __future__ import annotations

import pytest

from dataclasses import replace

from policies import (
    ActiveRequest,
    Annotation,
    CapacityPolicy,
    PriorityPolicy,
    ReplicaState,
    replicas_from_snapshot,
)
from policies.capacity import bound_at
from predictors.contract import from_custom_params

# A small workflow graph, agents = models:
#   planner -> coder (1.0);  coder -> coder (0.5) | tester (0.5);  tester -> END (1.0)
# Expected calls remaining after a call at each agent (absorbing chain, by hand):
#   r_tester = 0;  r_coder = 1 + 0.5 r_coder + 0.5 r_tester  => r_coder = 2;  r_planner = 1 + r_coder = 3
# Expected distance (calls) to tester: d(coder) = 1 + 0.5 d(coder) => 2;  d(planner) = 1 + 2 = 3.
GRAPH_STATE = {
    "a": {"agent": "planner", "remaining": 3.0, "distance": {"coder": 1.0, "tester": 3.0}},
    "b": {"agent": "coder", "remaining": 2.0, "distance": {"tester": 2.0}},
    "c": {"agent": "tester", "remaining": 0.0, "distance": {}},
}


def _scores(policy: PriorityPolicy, depth: dict[str, int]) -> dict[str, float]:
    return {
        rid: policy.base_score(s["remaining"], s["distance"], depth) for rid, s in GRAPH_STATE.items()
    }


def test_priority_alg3_order_on_small_graph_with_idle_downstream():
    pol = PriorityPolicy(w1=1.0, w2=1.0, idle_queue_threshold=2, aging_per_s=0.05)
    # coder's queue is empty (at risk of idling); planner and tester are busy.
    scores = _scores(pol, {"planner": 5, "coder": 0, "tester": 3})
    # a = 1/(1+3) + 1/1 (coder idle, 1 call away) = 1.25; b = 1/3; c = 1/(1+0) = 1.0
    assert scores == pytest.approx({"a": 1.25, "b": 1 / 3, "c": 1.0})
    order = pol.order([(rid, scores[rid], 100.0) for rid in "abc"], now=100.0)
    assert order == ["a", "c", "b"]
    assert pol.to_sglang(scores["a"]) == 1250


def test_priority_without_idle_models_is_shortest_remaining_first():
    pol = PriorityPolicy()
    scores = _scores(pol, {"planner": 5, "coder": 4, "tester": 3})
    # a = 0.25, b = 0.333, c = 1.0 -> c, b, a
    assert pol.order([(rid, scores[rid], 0.0) for rid in "abc"], now=0.0) == ["c", "b", "a"]


def test_priority_aging_lets_a_long_waiter_overtake():
    pol = PriorityPolicy(aging_per_s=0.05)
    scores = _scores(pol, {"planner": 5, "coder": 0, "tester": 3})
    # b enqueued 20 s before the others: 1/3 + 0.05*20 = 1.333 > a's 1.25 (a enqueued at now)
    items = [("a", scores["a"], 100.0), ("b", scores["b"], 80.0), ("c", scores["c"], 100.0)]
    assert pol.order(items, now=100.0) == ["b", "a", "c"]
    assert pol.aged(scores["b"], 80.0, 100.0) == pytest.approx(1 / 3 + 1.0)
    assert pol.aged(1.0, 10.0, 5.0) == 1.0  # a clock step backwards never lowers a score


def test_priority_unknown_call_is_neutral_and_annotation_uses_agent_model_map():
    pol = PriorityPolicy(unknown_score=0.25, remaining_unit="calls")
    assert pol.base_score(None, known=True) == 0.25
    assert pol.base_score(5.0, known=False) == 0.25
    ann = Annotation(known=True, expected_remaining_calls=1.0, expected_distance={"coder": 2.0, "fixer": 1.0})
    # both agents run on model m1 (idle): distance to m1 = min(2, 1) = 1 -> 1/2 + 1/1
    assert pol.score_annotation(ann, {"m1": 0}, agent_model={"coder": "m1", "fixer": "m1"}) == pytest.approx(1.5)
    # flat custom_params carry the next agent only: distance 1 to it
    flat = from_custom_params({"known": True, "exp_remaining_calls": 3, "next_agent": "coder", "next_agent_p": 0.9})
    assert pol.score_annotation(flat, {"coder": 0}) == pytest.approx(0.25 + 1.0)


def _req(i: int, inp: int, hi: int, alpha: float = 0.01) -> ActiveRequest:
    return ActiveRequest(f"r{i}", inp, hi, alpha)


def test_union_bound_refuses_a_replica_with_room():
    pol = CapacityPolicy(epsilon=0.05)
    big = ReplicaState("big", 100_000, (_req(1, 100, 100, 0.02), _req(2, 100, 100, 0.02)))
    small = ReplicaState("small", 2_000)
    placement = pol.choose([big, small], input_tokens=500, predicted_hi=500, alpha=0.02)
    checks = {c.name: c for c in placement.checks}
    # big: fits (400 + 1000 <= 100000) but risk 0.02 * 3 = 0.06 > 0.05 -> refused
    assert checks["big"].fits and not checks["big"].safe
    assert checks["big"].risk == pytest.approx(0.06)
    # small: 0 + 1000 <= 2000 and risk 0.02 -> safe, chosen despite less headroom
    assert checks["small"].safe and placement.replica == "small"
    assert not placement.fallback


def test_capacity_bound_that_overflows_is_not_safe_and_reported_usage_counts():
    pol = CapacityPolicy()
    # tracked 300+200 + 250+150 = 900; new 100+50 -> 1050 > 1000
    r = ReplicaState("w", 1000, (_req(1, 300, 200), _req(2, 250, 150)))
    assert r.committed_tokens == 900
    assert not pol.check(r, 100, 50).fits
    assert pol.check(r, 60, 40).fits  # 900 + 100 = 1000 fits exactly
    # the worker reports more than we track (other clients): 950 + 100 > 1000
    r2 = ReplicaState("w", 1000, (_req(1, 300, 200),), reported_tokens=950)
    assert r2.committed_tokens == 950 and not pol.check(r2, 60, 40).fits


def test_capacity_affinity_first_then_largest_headroom_then_fallback():
    pol = CapacityPolicy(affinity_slack=0.05)
    reps = replicas_from_snapshot(
        {"w0": 1000, "w1": 1000, "w2": 1000},
        [("w1", _req(1, 10, 10)), ("w2", _req(2, 300, 300))],
    )
    # headrooms for 100 + 100: w0 800, w1 780, w2 200; a new session takes the largest
    placed = pol.choose(reps, 100, 100)
    assert placed.replica == "w0" and not placed.affinity and not placed.fallback
    # a returning session stays on its replica whenever it is safe, even 600 tokens behind:
    # w2 holds 600 + 200 = 800 <= 1000 tokens at risk 0.01 + 0.01 <= 0.05
    placed = pol.choose(reps, 100, 100, last_replica="w2")
    assert placed.replica == "w2" and placed.affinity and not placed.fallback
    # 500 + 500 does not fit w2 (600 + 1000 > 1000) but fits w0: home not safe, another is;
    # no drain rate known: it moves since it would wait at home in expectation
    # (1000 - 600 - 1000 = -600 < 0) and fits w0 (1000 - 1000 = 0 >= 0), a gain of 600 > 5 % of 1000
    placed = pol.choose(reps, 500, 500, last_replica="w2")
    assert placed.replica == "w0" and not placed.affinity
    # nothing fits 900 + 900: least loaded by headroom share, flagged as fallback
    placed = pol.choose(reps, 900, 900)
    assert placed.fallback and placed.replica == "w0" and pol.safe_names(placed) == []
    # ... and a session already on w1 stays there: it queues everywhere in expectation
    placed = pol.choose(reps, 900, 900, last_replica="w1")
    assert placed.fallback and placed.replica == "w1" and placed.affinity
    assert pol.choose([], 1, 1).replica is None


def test_capacity_moves_a_session_only_when_the_wait_it_saves_is_twice_the_rebuild():
    # prefill 1 ms/token, a move costs 2x the prefill of the cached prefix
    pol = CapacityPolicy(prefill_s_per_token=0.001, move_cost_factor=2.0)
    assert pol.move_gain_ratio == 2.0                         # the default the docs measure
    home_busy = (_req(1, 900, 300),)                          # expects 1200 of 1000 tokens
    reps = [ReplicaState("home", 1000, home_busy, drain_tokens_per_s=100.0),
            ReplicaState("idle", 1000, (), drain_tokens_per_s=100.0)]
    # new request 50 + 50: home headroom 1000 - 1200 - 100 = -300 -> waits 300/100 = 3 s;
    # idle: 900 >= 0 -> 0 s. Rebuilding a 1000-token prefix costs 2 * 1000 * 0.001 = 2 s:
    # 3 s saved clears the cost but not twice it -> the session stays where its prefix is
    # (the rule before, move_gain_ratio = 1, moved it: 3 s > 2 s)
    assert pol.move_cost_s(1000) == pytest.approx(2.0)
    placed = pol.choose(reps, 50, 50, last_replica="home", cached_tokens=1000)
    assert placed.replica == "home" and placed.affinity and not placed.moved
    before = replace(pol, move_gain_ratio=1.0)
    assert before.choose(reps, 50, 50, last_replica="home", cached_tokens=1000).replica == "idle"
    # a 700-token prefix costs 1.4 s; 3 s > 2 x 1.4 s: worth it, it moves with its prefix
    placed = pol.choose(reps, 50, 50, last_replica="home", cached_tokens=700)
    assert placed.replica == "idle" and placed.moved and placed.recompute_tokens == 700
    # a 2000-token prefix costs 4 s > 3 s of waiting: it stays under either ratio
    for p in (pol, before):
        placed = p.choose(reps, 50, 50, last_replica="home", cached_tokens=2000)
        assert placed.replica == "home" and placed.affinity
    # a faster drain (1000 tok/s) makes the wait 0.3 s: not worth even the small rebuild
    fast = [replace(r, drain_tokens_per_s=1000.0) for r in reps]
    assert pol.choose(fast, 50, 50, last_replica="home", cached_tokens=700).replica == "home"


def test_a_moves_recompute_is_load_on_the_target_its_requests_wait_out():
    # the same 3 s of waiting saved as above, a 500-token prefix: 2 x 0.5 s = 1 s on an idle
    # target (moves); on a target with 2 requests in flight each of them also waits the 0.5 s
    # rebuild out: (2 + 2) x 0.5 s = 2 s < 3 s (moves); with 4 in flight 3 s, not < 3 s (stays)
    # (the cost itself, compared with the gain at ratio 1)
    pol = CapacityPolicy(prefill_s_per_token=0.001, move_cost_factor=2.0, move_gain_ratio=1.0)
    assert pol.move_cost_s(500, target_requests=4) == pytest.approx(3.0)
    home = ReplicaState("home", 1000, (_req(1, 900, 300),), drain_tokens_per_s=100.0)

    def target(n: int) -> ReplicaState:
        return ReplicaState("t", 10_000, tuple(_req(10 + i, 10, 10) for i in range(n)),
                            drain_tokens_per_s=100.0)

    for n, where in ((0, "t"), (2, "t"), (4, "home")):
        placed = pol.choose([home, target(n)], 50, 50, last_replica="home", cached_tokens=500)
        assert placed.replica == where, n
    # the rule before: only the moved session's rebuild counts (1 s < 3 s): it moves
    own = replace(pol, rebuild_delays_target=False)
    assert own.choose([home, target(4)], 50, 50, last_replica="home", cached_tokens=500).replica == "t"



def test_a_move_costs_the_prefixes_the_sessions_other_agents_leave_behind():
    # the same 3 s saved as above; the moving call holds 700 tokens (1.4 s: moves on its own),
    # but its session's other agents hold 600 more at home, rebuilt on the target when they run
    # next: 2 x 1300 x 1 ms = 2.6 s, 3 s is not twice that -> stays; weight 0 is the rule before
    pol = CapacityPolicy(prefill_s_per_token=0.001, move_cost_factor=2.0)
    assert pol.left_behind_weight == 1.0
    reps = [ReplicaState("home", 1000, (_req(1, 900, 300),), drain_tokens_per_s=100.0),
            ReplicaState("idle", 1000, (), drain_tokens_per_s=100.0)]
    placed = pol.choose(reps, 50, 50, last_replica="home", cached_tokens=700, left_behind_tokens=600)
    assert placed.replica == "home" and placed.affinity and not placed.moved
    before = replace(pol, left_behind_weight=0.0)
    placed = before.choose(reps, 50, 50, last_replica="home", cached_tokens=700, left_behind_tokens=600)
    assert placed.moved and placed.recompute_tokens == 700 and placed.left_behind_tokens == 600
    # half weight: 2 x (700 + 300) ms = 2 s, 3 s < 4 s -> stays; 40 left behind: 1.48 s -> moves
    half = replace(pol, left_behind_weight=0.5)
    assert half.choose(reps, 50, 50, last_replica="home", cached_tokens=700,
                       left_behind_tokens=600).replica == "home"
    assert pol.choose(reps, 50, 50, last_replica="home", cached_tokens=700,
                      left_behind_tokens=40).replica == "idle"


TABLE = ((0.1, 100), (0.05, 120), (0.01, 200), (0.005, 260), (0.001, 400))


def test_union_bound_splits_the_risk_budget_over_a_replicas_requests():
    pol = CapacityPolicy(epsilon=0.05)
    flex = lambda i: ActiveRequest(f"r{i}", 100, 150, 0.005, upper_bounds=TABLE)  # noqa: E731
    one = ReplicaState("one", 10_000, (flex(1),))
    # 2 requests with tables share alpha = 0.05 / 2 = 0.025 -> U at the tabulated 0.01: 200
    check = pol.check(one, 100, 150, upper_bounds=TABLE)
    assert check.alpha_each == pytest.approx(0.025) and check.risk == pytest.approx(0.05)
    assert one.committed_at(0.025) == 100 + 200
    # 10 requests: alpha 0.005 each -> U = 260 per request: 10 * 360 = 3600 tokens
    nine = ReplicaState("nine", 3_600, tuple(flex(i) for i in range(9)))
    assert pol.check(nine, 100, 150, upper_bounds=TABLE).fits
    assert not pol.check(replace(nine, capacity_tokens=3_599), 100, 150, upper_bounds=TABLE).fits
    # 20 requests would break a fixed alpha = 0.005 budget (20 * 0.005 = 0.1 > 0.05) ...
    fixed = ReplicaState("fixed", 10**6, tuple(_req(i, 100, 260, 0.005) for i in range(19)))
    assert not pol.check(fixed, 100, 260, alpha=0.005).safe
    # ... while with tables each takes 0.0025 (-> U at 0.001: 400) and stays safe if it fits
    twenty = ReplicaState("twenty", 10**6, tuple(flex(i) for i in range(19)))
    check = pol.check(twenty, 100, 150, upper_bounds=TABLE)
    assert check.safe and check.alpha_each == pytest.approx(0.0025)
    assert twenty.committed_at(0.0025) == 19 * 500
    # a fixed-alpha request takes its own share first: (0.05 - 0.02) / 2 flexible = 0.015 each
    mixed = ReplicaState("mixed", 10**6, (_req(1, 100, 100, 0.02), flex(2)))
    assert pol.check(mixed, 100, 150, upper_bounds=TABLE).alpha_each == pytest.approx(0.015)
    # past the table's smallest alpha the last (most conservative) entry is used
    assert bound_at(TABLE, 1e-6) == 400 and bound_at(TABLE, 0.5) == 100


def test_priority_is_a_workflow_property_aged_from_the_workflow_start():
    pol = PriorityPolicy(aging_per_s=0.001)      # aging 0.001 per second of the workflow's age
    old = pol.session_score(pol.base_score(12.0), session_age_s=600.0)    # 1/13 + 0.6
    near_done = pol.session_score(pol.base_score(1.0), session_age_s=0.0)  # 1/2
    assert old == pytest.approx(1 / 13 + 0.6) and near_done == pytest.approx(0.5)
    # both age at the same rate while they wait: their order never changes
    for wait in (0.0, 100.0, 10_000.0):
        assert pol.aged(old, 50.0, 50.0 + wait) - pol.aged(near_done, 50.0, 50.0 + wait) == pytest.approx(
            old - near_done)
    # a newer workflow one call from done passes an older starting one only within
    # Δbase / aging = (0.5 - 1/14) / 0.001 ≈ 429 s of their start times
    start = pol.base_score(13.0)
    assert pol.session_score(start, 428.0) < pol.session_score(0.5, 0.0) < pol.session_score(start, 430.0)


def test_slowdown_bound_marks_only_known_batch_sessions_past_their_multiple():
    pol = PriorityPolicy(slowdown_bound=3.0, seconds_per_call=30.0)
    ann = Annotation(known=True, expected_remaining_calls=4.0, expected_remaining_s=200.0)
    assert not pol.overdue(ann, 600.0) and pol.overdue(ann, 601.0)      # 3 x 200 s
    assert pol.call_priority(ann, 601.0) == pytest.approx(0.2 + 2.0 + 1e-5 * 601.0)   # lifted
    by_start = PriorityPolicy(slowdown_bound=3.0, overdue_by_start=True)
    assert by_start.call_priority(ann, 601.0) == pytest.approx(2.0 + 1e-5 * 601.0)   # one base
    assert pol.call_priority(ann, 599.0) == pytest.approx(0.2 + 1e-5 * 599.0)
    # without remaining seconds: (1 + calls) x seconds_per_call = 150 s; at least one call's worth
    calls_only = Annotation(known=True, expected_remaining_calls=4.0)
    assert pol.expected_seconds(calls_only) == 150.0 and pol.overdue(calls_only, 451.0)
    assert pol.expected_seconds(Annotation(known=True, expected_remaining_s=1.0)) == 30.0
    # never overdue: an unknown call, an interactive one, or with the bound off (the default)
    assert not pol.overdue(Annotation(known=False), 1e6)
    assert not pol.overdue(replace(ann, latency_class="interactive"), 1e6)
    assert not PriorityPolicy().overdue(ann, 1e6)


# ------------------------------------------------------------------ the relative tail guard
def test_oldest_share_lifts_the_oldest_live_batch_sessions_and_serves_them_by_start():
    """q = 0.25 over 8 live batch sessions lifts the 2 oldest: they rank above every other batch
    session however short its remaining work, and the older of the two first (FCFS); when the
    oldest ends (``session_end``) the third oldest takes its place; interactive sessions are
    never counted or lifted."""
    from policies.bookkeeping import SessionPriorityBook
    pol = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, oldest_share=0.25)
    book = SessionPriorityBook(pol)
    # sessions s0..s7 started at 0, 10, ..., 70 s; the oldest expects 50 calls left, the
    # youngest 0 (so without the guard the order would be the reverse of their start)
    for i in range(8):
        t = 100.0 + i
        book.note(f"s{i}", pol.call_priority(Annotation(known=True, expected_remaining_calls=50 - 7 * i),
                                             t - 10 * i), t, started_at=10.0 * i)
    book.note("human", pol.call_priority(Annotation(known=True, expected_remaining_calls=0.0,
                                                    latency_class="interactive"), 200.0), 108.0,
              started_at=-100.0, batch=False)
    assert book.live() == 8 and [s for s in book.references() if book.lifted(s)] == ["s0", "s1"]
    prio = {s: book.priority(s, 110.0) for s in [f"s{i}" for i in range(8)] + ["human"]}
    assert prio["human"] > prio["s0"] > prio["s1"] > max(prio[f"s{i}"] for i in range(2, 8))
    assert book.reference("s0") == (pol.lifted_score(), 0.0)        # lifted at its start
    assert book.changed() >= {"s0", "s1"}
    # s0's call finishes marked session_end: 7 live, floor(0.25 · 7) = 1 lifted: s1 alone
    book.finished("s0", 120.0, end=True)
    assert book.live() == 7 and book.lifted("s1") and not book.lifted("s0") and not book.lifted("s2")
    assert book.changed() == {"s0"}
    assert book.score("s0", 120.0) == pytest.approx(1 / 51 + 0.001 * 120.0)   # its own again
    # a ninth and a tenth session: 9 live -> 2 lifted (s1, s2)
    book.note("s8", pol.call_priority(Annotation(known=True, expected_remaining_calls=1.0), 0.0),
              121.0, started_at=121.0)
    book.note("s9", None, 122.0, started_at=122.0)
    assert book.live() == 9 and [s for s in book.references() if book.lifted(s)] == ["s1", "s2"]
    # liveness: a session with no call in flight for live_window_s (600 s) is no longer live
    for i in range(1, 10):
        book.finished(f"s{i}", 130.0)
    book.note("s9", None, 500.0, started_at=122.0)        # s9 calls again: still live
    assert book.live(731.0) == 1 and not any(book.lifted(f"s{i}") for i in range(10))
    # off by default: no live set, no lift
    plain = SessionPriorityBook(PriorityPolicy())
    plain.note("a", 0.5, 0.0, started_at=0.0)
    assert not plain.guard and plain.live() == 0 and not plain.lifted("a")
    with pytest.raises(ValueError, match="oldest_share"):
        PriorityPolicy(oldest_share=1.5)


def test_oldest_share_book_matches_its_definition_on_random_events():
    """Random arrivals, finishes, ends and idle expiries: after every event the lifted sessions
    are exactly the oldest ``floor(q · n)`` of the ``n`` live batch sessions (recomputed by
    brute force from the events), and each lifted session's reference is ``(lifted, start)``."""
    import random
    from policies.bookkeeping import SessionPriorityBook
    pol = PriorityPolicy(oldest_share=0.2, live_window_s=50.0)
    book = SessionPriorityBook(pol)
    rng = random.Random(7)
    start, inflight, last_done, ended, interactive = {}, {}, {}, set(), set()
    t = 0.0
    for _ in range(3000):
        t += rng.expovariate(1.0)
        s = f"w{rng.randrange(60)}"
        if s not in start:
            start[s] = t - rng.uniform(0, 30)        # started a while before we see it
        if rng.random() < 0.55 or inflight.get(s, 0) == 0:
            batch = s not in interactive and rng.random() > 0.02
            if not batch:
                interactive.add(s)
            book.note(s, rng.random(), t, started_at=start[s], batch=batch)
            ended.discard(s)
            if batch:
                inflight[s] = inflight.get(s, 0) + 1
            else:
                inflight.pop(s, None)
        else:
            end = rng.random() < 0.1
            book.finished(s, t, end=end)
            inflight[s] -= 1
            if end:
                ended.add(s)
                inflight.pop(s, None)
            elif inflight[s] == 0:
                last_done[s] = t
        for w in [w for w in list(inflight) if inflight[w] == 0 and last_done.get(w, -1e9) < t - 50.0]:
            inflight.pop(w)
            ended.add(w)        # expired: live again only with a new call
        live = [w for w in start if w in inflight and w not in interactive]
        oldest = sorted(live, key=lambda w: start[w])[:int(0.2 * len(live))]
        assert book.live() == len(live)
        assert {w for w in start if book.lifted(w)} == set(oldest)
        for w in oldest:
            assert book.reference(w) == (pol.lifted_score(), start[w])
