"""Priority (Pythia alg. 3) and capacity (alg. 2) policies against hand-computed cases."""
from __future__ import annotations

import pytest

from serving_hooks.policies import (
    ActiveRequest,
    CallView,
    CapacityPolicy,
    PriorityPolicy,
    ReplicaState,
    replicas_from_snapshot,
)

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


def test_priority_unknown_call_is_neutral_and_view_uses_agent_model_map():
    pol = PriorityPolicy(unknown_score=0.25)
    assert pol.base_score(None, known=True) == 0.25
    assert pol.base_score(5.0, known=False) == 0.25
    view = CallView(known=True, exp_remaining_calls=1.0, expected_distance={"coder": 2.0, "fixer": 1.0})
    # both agents run on model m1 (idle): distance to m1 = min(2, 1) = 1 -> 1/2 + 1/1
    assert pol.score_view(view, {"m1": 0}, agent_model={"coder": "m1", "fixer": "m1"}) == pytest.approx(1.5)
    # flat custom_params carry the next agent only: distance 1 to it
    flat = CallView.from_custom_params({"known": True, "exp_remaining_calls": 3, "next_agent": "coder", "next_agent_p": 0.9})
    assert pol.score_view(flat, {"coder": 0}) == pytest.approx(0.25 + 1.0)


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


def test_capacity_largest_headroom_then_affinity_then_fallback():
    pol = CapacityPolicy(affinity_slack=0.05)
    reps = replicas_from_snapshot(
        {"w0": 1000, "w1": 1000, "w2": 1000},
        [("w1", _req(1, 10, 10)), ("w2", _req(2, 300, 300))],
    )
    # headrooms for 100 + 100: w0 800, w1 780, w2 200
    assert pol.choose(reps, 100, 100).replica == "w0"
    # w1 is within 5% of capacity (50 tokens) of the best: the session's last replica wins
    placed = pol.choose(reps, 100, 100, last_replica="w1")
    assert placed.replica == "w1" and placed.affinity
    # w2 is 600 tokens behind: affinity does not override
    assert pol.choose(reps, 100, 100, last_replica="w2").replica == "w0"
    # nothing fits 900 + 900: least loaded by headroom share, flagged as fallback
    placed = pol.choose(reps, 900, 900)
    assert placed.fallback and placed.replica == "w0" and pol.safe_names(placed) == []
    assert pol.choose([], 1, 1).replica is None
