"""SGLang's default cache-aware router in the simulator (hand-checked routing decisions)."""
from __future__ import annotations

from simulator.baselines import BASELINES, CacheAware
from simulator.config import ClusterConfig
from simulator.engine import Request, Simulator
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def cfg(**kw) -> ClusterConfig:
    base = dict(replicas=2, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                new_token_ratio=0.0)
    base.update(kw)
    return ClusterConfig(**base)


def two_sessions():
    # two workflows of two calls; each second call extends its first call's conversation
    return workload_from_records([
        rec("A", 1, 0.0, 0.5, 1000, 10), rec("A", 2, 1.5, 2.0, 1100, 5),
        rec("B", 1, 0.0, 0.5, 1000, 10), rec("B", 2, 1.5, 2.0, 1100, 5),
    ])


def test_sglang_default_is_cache_aware_with_the_router_defaults():
    pol = BASELINES["sglang-default"]()
    r = pol.router
    assert isinstance(r, CacheAware)
    assert (r.cache_threshold, r.balance_abs_threshold, r.balance_rel_threshold,
            r.eviction_interval_s) == (0.3, 64, 1.5, 120.0)
    assert r.max_tree_tokens == 2 ** 26 / 4
    assert "sglang-rr" in BASELINES


def test_cache_aware_keeps_each_session_on_its_replica():
    wl = two_sessions()
    res = Simulator(wl, BASELINES["sglang-default"](), cfg(), [0.0, 0.0]).run()
    by_id = {r.call.request_id: r.replica for r in res.requests}
    # first calls: no match → the smallest tree: A on 0, then B on 1 (A's prompt made 0 bigger)
    assert by_id["A#1"] != by_id["B#1"]
    assert by_id["A#2"] == by_id["A#1"] and by_id["B#2"] == by_id["B#1"]
    # the second calls found their conversation: only the new tokens were prefilled
    seconds = [r for r in res.requests if r.call.request_id.endswith("#2")]
    assert all(r.gpu_hit >= 1000 for r in seconds)


def test_round_robin_row_moves_sessions():
    wl = two_sessions()
    res = Simulator(wl, BASELINES["sglang-rr"](), cfg(), [0.0, 0.0]).run()
    by_id = {r.call.request_id: r.replica for r in res.requests}
    assert [by_id[k] for k in ("A#1", "B#1", "A#2", "B#2")] == [0, 1, 0, 1]   # in turn


def test_imbalance_overrides_the_prefix_match():
    wl = two_sessions()
    sim = Simulator(wl, BASELINES["sglang-default"](), cfg(), [0.0, 0.0])
    router = sim.policy.router
    first = Request(wl.calls[0], 0.0)
    assert router.route(first) == 0
    # 65 requests in flight on replica 0, none on 1: 65 − 0 > 64 and 65 > 1.5 × 0 → shortest queue
    sim.replicas[0].waiting.extend(Request(wl.calls[2], 0.0) for _ in range(65))
    again = Request(wl.calls[1], 0.0)
    assert router.route(again) == 1
    # 64 in flight is not imbalanced (abs threshold is strict): the prefix match wins
    del sim.replicas[0].waiting[:1]
    router.tree[1].clear()
    router.size[1] = 0.0
    assert router.route(Request(wl.calls[1], 0.0)) == 0


def test_recompute_is_split_by_cause():
    from simulator.metrics import summarize

    # routing-caused: round robin sends the second call of a session to the other replica
    wl = workload_from_records([rec("A", 1, 0.0, 0.5, 1000, 10), rec("A", 2, 1.5, 2.0, 1100, 5)])
    row = summarize(Simulator(wl, BASELINES["sglang-rr"](), cfg(), [0.0]).run())
    assert row["routing_recomputed_tokens"] > 0
    assert row["eviction_recomputed_tokens"] == 0
    assert row["routing_recompute_share"] == row["routing_recomputed_tokens"] / row["prefill_tokens"]
    assert 0 < row["routing_recompute_share"] < 1
    # eviction-caused: one small replica; B's prompt evicts A's conversation during A's tool gap
    wl = workload_from_records([
        rec("A", 1, 0.0, 0.5, 1000, 10), rec("A", 2, 10.5, 11.0, 1100, 5),
        rec("B", 1, 0.0, 0.5, 2500, 10),
    ])
    res = Simulator(wl, BASELINES["sglang-default"](), cfg(replicas=1, kv_capacity_tokens=3000),
                    [0.0, 2.0]).run()
    row = summarize(res)
    assert row["eviction_recomputed_tokens"] > 0
    assert row["routing_recomputed_tokens"] == 0 and row["routing_recompute_share"] == 0.0
    assert row["eviction_recomputed_tokens"] + row["preemption_recomputed_tokens"] \
        == row["recomputed_prefill_tokens"]
