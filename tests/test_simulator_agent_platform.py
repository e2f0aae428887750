"""The agent-platform scenario (a mix of applications on one cluster) and the nat-hints baseline."""
from __future__ import annotations

import pytest

from simulator.baselines import TRAINED_BASELINES
from simulator.baselines.nat_hints import DynamoKVRouter, PredictionTrie, _sensitivities
from simulator.baselines.schedulers import FCFS
from simulator.baselines.caches import LRU
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.policy import Policy
from simulator.pools import build_pools
from simulator.config import hardware_config
from simulator.runner import compare, parse_policies, prepare_mix
from simulator.scenarios import AGENT_PLATFORM, AGENT_PLATFORM_BURSTY, REAL, Scenario, get_scenario
from simulator.sources import mixed, shares_to_counts
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def base_id(wf_id: str) -> str:
    """A replayed copy's workflow id without the copy suffix ``~k``."""
    return wf_id.rsplit("~", 1)[0]


def test_shares_to_counts_sum_and_floor():
    assert shares_to_counts([0.5, 0.3, 0.2], 10) == [5, 3, 2]
    assert sum(shares_to_counts([0.1, 0.1, 0.15, 0.25, 0.2, 0.2], 720)) == 720
    assert shares_to_counts([0.98, 0.01, 0.01], 10)[1:] == [1, 1]     # every part at least 1
    with pytest.raises(ValueError, match="positive shares"):
        shares_to_counts([1.0, 0.0], 10)


def test_mix_splits_each_application_and_never_replays_a_train_workflow():
    src = mixed([("pipe", str(REAL / "agentless_pr28.jsonl"), 0.6),
                 ("research", "deep-research", 0.4)], 20, seed=3, n_train_generated=12)
    apps = {r["workflow_id"].split(":", 1)[0] for r in src.test}
    assert apps == {"pipe", "research"}
    per_app = {p["app"]: p for p in src.parts}
    assert per_app["pipe"]["replayed_workflows"] == 12 and per_app["research"]["replayed_workflows"] == 8
    assert len({r["workflow_id"] for r in src.test}) == 20
    train_ids = {r["workflow_id"] for r in src.train}
    assert not {base_id(r["workflow_id"]) for r in src.test} & train_ids
    assert len({r["request_id"] for r in src.test}) == len(src.test)
    # logged applications keep their conversation lineage, generated ones do not
    assert src.lineage_types == {"agentless_localize", "agentless_repair"}
    assert any(k.startswith("deep_research/") for k in src.system_tokens)


def test_type_pool_and_lineage_per_workflow_type():
    recs = [rec("A", 1, 0.0, 1.0, 100, 10), rec("A", 2, 2.0, 3.0, 200, 10),
            rec("B", 1, 0.0, 1.0, 100, 10, workflow_type_id="u"),
            rec("B", 2, 2.0, 3.0, 200, 10, workflow_type_id="u")]
    wl = workload_from_records(recs, conversation_lineage={"t"})
    a2, b2 = wl.calls[1], wl.calls[3]
    assert a2.path == (wl.calls[0].path + (wl.calls[0].own_seg,))   # lineage on for type t
    assert wl.calls[2].own_seg not in b2.path                        # and off for type u
    pools = build_pools(wl, {"x": 1, "y": 1}, {}, type_pool={"t": "x", "u": "y"})
    assert [int(p) for p in pools.pool_of_call] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="unknown pool"):
        build_pools(wl, {"x": 1}, {}, type_pool={"t": "z"})


def test_agent_platform_scenarios_are_consistent():
    for sc in (AGENT_PLATFORM, AGENT_PLATFORM_BURSTY):
        assert get_scenario(sc.name) is sc
        assert abs(sum(m[2] for m in sc.mix) - 1.0) < 1e-9
        assert set(sc.type_pool.values()) == set(sc.pool_replicas)
        for _, workload, _ in sc.mix:
            assert workload in ("coding-assistant", "deep-research") or (REAL.parent.parent / workload).exists()
    assert AGENT_PLATFORM.arrivals == "burst"
    assert AGENT_PLATFORM_BURSTY.arrivals == "gamma" and AGENT_PLATFORM_BURSTY.cv == 4.0
    assert "nat-hints" in parse_policies("sglang-default,nat-hints")


def test_interactive_scenario_adds_person_driven_sessions_to_the_platform_mix():
    from simulator.scenarios import AGENT_PLATFORM_INTERACTIVE, PLATFORM_MIX
    from simulator.sources import BUILTIN

    sc = get_scenario("agent-platform-interactive")
    assert sc is AGENT_PLATFORM_INTERACTIVE and sc.arrivals == "burst"
    assert abs(sum(m[2] for m in sc.mix) - 1.0) < 1e-9
    interactive = [m for m in sc.mix if m[1] in ("claude-code-interactive", "codex-interactive")]
    assert len(interactive) == 2 and all(m[1] in BUILTIN for m in interactive)
    # the platform's own applications keep their relative shares
    platform = {app: share for app, _, share in sc.mix if app not in ("claude-code", "codex")}
    assert platform == pytest.approx({app: 0.8 * share for app, _, share in PLATFORM_MIX})
    assert set(sc.type_pool.values()) == set(sc.pool_replicas)
    assert sc.type_pool["claude_code"] == sc.type_pool["codex"] == "coder"


def chain(wf: str, agent: str, n: int, gap: float = 2.0, out: int = 10, wtype: str = "t") -> list[dict]:
    """``n`` sequential calls of ``agent``: each 1 s long, then ``gap`` s to the next."""
    return [rec(wf, k, k * (1 + gap), k * (1 + gap) + 1.0, 100, out + k, agent_id=agent,
                workflow_type_id=wtype) for k in range(n)]


def test_prediction_trie_is_nats_statistics_per_path_and_call_index():
    train = chain("W1", "a", 3, out=10) + chain("W2", "a", 3, out=30)
    trie = PredictionTrie().fit(train)
    p1 = trie.find("t", "a", 1)
    assert p1.remaining_calls.mean == 2.0 and p1.remaining_calls.sample_count == 2
    assert p1.interarrival_ms.mean == pytest.approx(2000.0)
    # first call outputs 10 and 30: p90 by linear interpolation = 10 + 0.9 × 20
    assert p1.output_tokens.p90 == pytest.approx(28.0)
    last = trie.find("t", "a", 3)
    assert last.remaining_calls.mean == 0.0 and last.interarrival_ms.sample_count == 0
    # an unseen call index falls back to the node's any-index prediction, an unseen agent to
    # its workflow type's node, an unseen type to the root
    assert trie.find("t", "a", 9).remaining_calls.mean == pytest.approx(1.0)
    assert trie.find("t", "zz", 1).remaining_calls.sample_count == 2
    assert trie.find("other", "a", 1).remaining_calls.sample_count == 2


def test_sensitivity_ranks_first_and_last_calls_above_parallel_middle_ones():
    recs = [rec("W", 0, 0.0, 1.0, 10, 5),
            rec("W", 1, 1.0, 2.0, 10, 5, parent_request_ids=["W#0"]),
            rec("W", 2, 1.0, 2.0, 10, 5, parent_request_ids=["W#0"]),
            rec("W", 3, 2.0, 4.0, 10, 5, parent_request_ids=["W#1", "W#2"])]
    s = _sensitivities(recs)
    assert all(1 <= x <= 5 for x in s)
    assert s[0] > s[1] == s[2] and s[3] > s[1]
    assert _sensitivities(recs[:1]) == [5]


def test_nat_hints_policy_keeps_sessions_on_their_prefix_and_pins_for_the_predicted_ttl():
    # train: a three-call conversation with 2 s between calls → TTL after call 1 = 2 × 2 s
    train = chain("T1", "a", 3) + chain("T2", "a", 3)
    replay = []
    for w in range(4):
        replay += [rec(f"R{w}", 0, 0.0, 1.0, 2000, 20), rec(f"R{w}", 1, 3.0, 4.0, 2050, 20),
                   rec(f"R{w}", 2, 6.0, 7.0, 2100, 20)]
    wl = workload_from_records(replay)
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP)
    policy = TRAINED_BASELINES["nat-hints"](train)
    pins: list[float] = []
    cache_part = policy.cache
    orig = cache_part.on_finish

    def spy(req):
        orig(req)
        if req.wf in cache_part.pins:
            rep, segs = cache_part.pins[req.wf]
            pins.append(max(policy.cache.sim.replicas[rep].cache.pinned.get(s, 0.0) for s in segs)
                        - policy.cache.sim.now)
    cache_part.on_finish = spy
    res = Simulator(wl, policy, cfg, [0.0, 0.0, 0.5, 0.5]).run()
    by_wf: dict[int, set[int]] = {}
    for r in res.requests:
        by_wf.setdefault(r.wf, set()).add(r.replica)
    assert all(len(v) == 1 for v in by_wf.values())        # the KV router kept every session home
    assert len({next(iter(v)) for v in by_wf.values()}) == 2  # and spread new sessions by load
    # after the first call: remaining 2 × 2 s inter-arrival; after the second: 1 × 2 s
    assert sorted(set(round(p, 6) for p in pins)) == [2.0, 4.0]
    assert not cache_part.pins                               # every pin released by the next call


def test_dynamo_kv_router_weighs_uncached_prefill_against_load():
    recs = [rec("A", 0, 0.0, 1.0, 4000, 10), rec("A", 1, 2.0, 3.0, 4050, 10)]
    wl = workload_from_records(recs)
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP)
    router = DynamoKVRouter()
    sim = Simulator(wl, Policy("x", router, FCFS(), LRU()), cfg, [0.0])
    rep0, rep1 = sim.replicas
    for s in wl.calls[1].path:
        rep1.cache.insert_gpu(s, 0.0)
    req = type("R", (), {"call": wl.calls[1], "idx": 1, "wf": 0})()
    assert router.route(req) == 1                   # the prefix is there: 50 tokens to prefill
    rep1.waiting_tokens = 10_000                    # but a long queue outweighs the hit
    assert router.route(req) == 0


@pytest.mark.slow   # a profile fit (≈ 10 s alone)
def test_a_small_platform_mix_replays_under_nat_hints_and_a_baseline(tmp_path):
    sc = Scenario(name="mini-platform", workload="mix", gpu="h100-sxm", model="llama-3.1-8b", tp=1,
                  kv_capacity_tokens=60_000, host_ratio=2.0, pool_replicas={"a": 1, "b": 1},
                  type_pool={"agentless_localize": "a", "agentless_repair": "a",
                             "deep_research": "b"},
                  burst_workflows=12, burst_s=5.0, n_train_generated=10,
                  mix=(("pipe", "datasets/real/agentless_pr28.jsonl", 0.5),
                       ("research", "deep-research", 0.5)))
    prep = prepare_mix(sc, seed=1, profile_dir=tmp_path)
    prep.pools = build_pools(prep.workload, sc.pool_replicas, {}, type_pool=sc.type_pool)
    prep.scenario = sc
    cfg = hardware_config(replicas=2, kv_capacity_tokens=60_000)
    out = compare(prep, ["sglang-default", "nat-hints"], ["burst"], cfg, arrivals_mode="burst")
    rows = out["loads"]["burst"]["policies"]
    assert set(rows) == {"sglang-default", "nat-hints"}
    assert all(r["calls"] == prep.workload.n_calls and r["avg_jct_s"] > 0 for r in rows.values())
    assert out["scenario"]["mix"][0][0] == "pipe"
