"""Model pools: calls stay in their agent's pool, queue depths per pool reach the priority rule."""
from __future__ import annotations

import pytest

from simulator.baselines import BASELINES
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.pools import build_pools
from simulator.scenarios import PYTHIA_LIKE, get_scenario
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def workload():
    recs = []
    for w in range(6):
        recs += [rec(f"W{w}", 1, 0.0, 0.5, 500, 10, agent_id="plan"),
                 rec(f"W{w}", 2, 1.5, 2.0, 800, 20, agent_id="code"),
                 rec(f"W{w}", 3, 3.0, 3.5, 900, 5, agent_id="plan")]
    return workload_from_records(recs)


@pytest.mark.parametrize("policy", ["sglang-default", "sglang-rr", "least-load", "autellix-plas",
                                    "continuum-ttl"])
def test_calls_are_served_by_their_agents_pool(policy):
    wl = workload()
    pools = build_pools(wl, {"p": 1, "c": 2}, {"plan": "p", "code": "c"})
    cfg = ClusterConfig(replicas=3, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                        new_token_ratio=0.0)
    res = Simulator(wl, BASELINES[policy](), cfg, [0.1 * i for i in range(6)], pools=pools).run()
    for r in res.requests:
        assert r.replica in ({0} if r.call.agent == "plan" else {1, 2})


def test_pool_queue_depths_and_bad_pools():
    wl = workload()
    pools = build_pools(wl, {"p": 1, "c": 2}, {"plan": "p", "code": "c"})
    cfg = ClusterConfig(replicas=3, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP)
    sim = Simulator(wl, BASELINES["sglang-default"](), cfg, [0.0] * 6, pools=pools)
    assert sim.pool_queue_depths() == {"p": 0, "c": 0}
    with pytest.raises(ValueError, match="in no pool"):
        build_pools(wl, {"p": 1}, {"plan": "p"})
    with pytest.raises(ValueError, match="exactly once"):
        Simulator(wl, BASELINES["sglang-default"](), ClusterConfig(replicas=4, step=STEP),
                  [0.0] * 6, pools=pools)


def test_pythia_like_scenario_is_documented_and_consistent():
    sc = get_scenario("pythia-like")
    assert sc is PYTHIA_LIKE and sc.replicas == 8 and sc.kv_capacity_tokens == 150_000
    assert set(sc.agent_pool.values()) == set(sc.pool_replicas)
    with pytest.raises(ValueError, match="--scenario"):
        get_scenario("nope")
