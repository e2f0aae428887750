"""Autoscaling in the simulator: start-up delay, drains, the HPA rule, alg. 4 as the sidecar computes it.

Hand-checked on toy pools with the simple step model of ``tests/simulator_helpers.py`` (a
prefill iteration costs 1 ms per prompt token, a decode iteration 10 ms).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from serving_hooks.policies import AutoscalePolicy
from simulator.autoscale import (ACTIVE, DRAINING, FREE, AutoscaleOptions, Autoscaler,
                                 ProjectedCalls, QueueDepth, fit_to_cap)
from simulator.baselines import BASELINES
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.pools import build_pools
from simulator.runner import make_policy, parse_policies, prepare, run_pools, split_policy
from tests.simulator_helpers import STEP, rec


class Scripted:
    """A recommender that answers from a list (the last answer repeats)."""

    name = "scripted"

    def __init__(self, *plan: dict[str, int]) -> None:
        self.plan = list(plan)
        self.i = 0

    def recommend(self, scaler):
        d = self.plan[min(self.i, len(self.plan) - 1)]
        self.i += 1
        return dict(d), {k: float(v) for k, v in d.items()}, {}


def cfg(replicas: int) -> ClusterConfig:
    return ClusterConfig(replicas=replicas, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                         new_token_ratio=0.0)


def one_call_workflows(times, agent, inp=200, out=50):
    recs = [rec(f"{agent}{i}", 1, 0.0, 1.0, inp, out, agent_id=agent) for i in range(len(times))]
    return recs, list(times)


def run(recs, arrivals, pools_spec, scaler, policy="sglang-default"):
    from simulator.workload import workload_from_records

    wl = workload_from_records(recs)
    pools = build_pools(wl, pools_spec, {"a": "a", "b": "b"})
    pol = BASELINES[policy]()
    pol.add_part(scaler)
    res = Simulator(wl, pol, cfg(sum(pools_spec.values())), arrivals, pools=pools).run()
    return res, scaler


def test_fit_to_cap_by_hand():
    # fits: unchanged (each at least 1)
    assert fit_to_cap({"a": 2, "b": 0}, {"a": 2.0, "b": 0.0}, 4) == {"a": 2, "b": 1}
    # 5 + 3 + 1 > 4: one replica each, the 1 left by weight: quotas 5/8, 2.5/8, 0.5/8 → a
    assert fit_to_cap({"a": 5, "b": 3, "c": 1}, {"a": 5.0, "b": 2.5, "c": 0.5}, 4) == {"a": 2, "b": 1, "c": 1}
    # 7 + 3 > 6: 4 seats after one each, quotas 4·6.5/9 = 2.89 and 4·2.5/9 = 1.11 → floors
    # 2 and 1, the seat left to the larger remainder (a): a = 1 + 3, b = 1 + 1
    assert fit_to_cap({"a": 7, "b": 3}, {"a": 6.5, "b": 2.5}, 6) == {"a": 4, "b": 2}
    with pytest.raises(ValueError):
        fit_to_cap({"a": 1, "b": 1, "c": 1}, {}, 2)


def test_started_replica_serves_nothing_before_the_startup_delay():
    # pool a: replicas 0, 1 (no calls); pool b: replica 2, one b call every 5 s.
    # First decision at t = 10: {a: 1, b: 2} → replica 0 (empty, lowest index) is drained and
    # freed at once, loads b's model for 30 s: it joins pool b at exactly t = 40.
    recs, arr = one_call_workflows([5.0 * i for i in range(30)], "b")
    scaler = Autoscaler(Scripted({"a": 1, "b": 2}),
                        AutoscaleOptions(interval_s=10.0, startup_delay_s=30.0, scale_down_window_s=0.0))
    res, scaler = run(recs, arr, {"a": 2, "b": 1}, scaler)
    joined = [t for t, sizes in scaler.timeline if sizes == {"a": 1, "b": 2}]
    assert joined[0] == pytest.approx(40.0)
    on0 = [r for r in res.requests if r.replica == 0]
    assert on0, "the new replica serves b calls once it is up"
    assert min(r.t_issue for r in on0) >= 40.0 - 1e-9
    assert min(r.t_admit for r in on0) >= 40.0 - 1e-9
    # before t = 40 every b call ran on replica 2
    assert all(r.replica == 2 for r in res.requests if r.t_issue < 40.0)
    assert scaler.counts["started"] == 1 and scaler.counts["drained"] == 1
    st = scaler.stats(float(np.nanmax(res.wf_finish)))
    assert st["startup_s"] == pytest.approx(30.0)
    assert scaler.state[0] == ACTIVE and scaler.pool[0] == 1


def test_draining_replica_takes_no_new_calls_and_finishes_its_own():
    # pool a: replicas 0, 1 under round robin; at t = 0 four long a calls (2,000 output tokens
    # ≈ 20 s each) go 0, 1, 0, 1; more a calls every 2 s. At t = 10 the script asks {a: 1, b: 2}:
    # one a replica drains — it keeps its two calls to the end, takes none issued after t = 10,
    # and only then its GPU loads b's model.
    recs = [rec(f"L{i}", 1, 0.0, 1.0, 300, 2000, agent_id="a") for i in range(4)]
    arr = [0.0] * 4
    short, sarr = one_call_workflows([1.0 + 2.0 * i for i in range(30)], "a", inp=100, out=20)
    bcalls, barr = one_call_workflows([3.0 * i for i in range(20)], "b")
    scaler = Autoscaler(Scripted({"a": 1, "b": 2}),
                        AutoscaleOptions(interval_s=10.0, startup_delay_s=5.0, scale_down_window_s=0.0))
    res, scaler = run(recs + short + bcalls, arr + sarr + barr, {"a": 2, "b": 1}, scaler,
                      policy="sglang-rr")
    drained = next(r for r in (0, 1) if scaler.pool.get(r) != 0)
    kept = 1 - drained
    mine = [q for q in res.requests if q.replica == drained and q.call.agent == "a"]
    assert mine and all(q.t_issue < 10.0 for q in mine)
    assert all(q.replica == kept for q in res.requests if q.call.agent == "a" and q.t_issue > 10.0)
    last = max(q.t_finish for q in mine)
    assert last > 10.0                      # it finished its running calls after the drain began
    # freed when its last call finished, then loaded b for 5 s
    b_there = [q for q in res.requests if q.replica == drained and q.call.agent == "b"]
    assert b_there and min(q.t_admit for q in b_there) >= last + 5.0 - 1e-9
    joined = [t for t, s in scaler.timeline if s == {"a": 1, "b": 2}]
    assert joined[0] == pytest.approx(last + 5.0)


def test_queue_depth_rule_is_hpa():
    # HPA: desired = ceil(current · (metric / target)) with metric = waiting per replica,
    # i.e. ceil(Σ waiting / target); unchanged within ±10 %.
    from simulator.workload import workload_from_records

    wl = workload_from_records([rec("x", 1, 0, 1, 10, 1, agent_id="a"),
                                rec("y", 1, 0, 1, 10, 1, agent_id="b")])
    pools = build_pools(wl, {"a": 2, "b": 1}, {"a": "a", "b": "b"})
    opt = AutoscaleOptions(queue_target=4.0)
    scaler = Autoscaler(QueueDepth(opt), opt)
    pol = BASELINES["sglang-default"]()
    pol.add_part(scaler)
    sim = Simulator(wl, pol, cfg(3), [0.0, 0.0], pools=pools)

    class Q:          # a waiting call
        pass

    sim.replicas[0].waiting = [Q()] * 9          # pool a: 9 waiting over 2 replicas
    sim.replicas[2].waiting = [Q()] * 4          # pool b: 4 waiting on 1 replica = target
    desired, _, info = scaler.recommender.recommend(scaler)
    assert info["waiting"] == {"a": 9, "b": 4}
    assert desired == {"a": math.ceil(9 / 4), "b": 1}
    sim.replicas[0].waiting = [Q()] * 8          # 8 / (4 · 2) = 1.0 → within tolerance: stays 2
    sim.replicas[2].waiting = []                 # no queue → 1 (the minimum)
    assert scaler.recommender.recommend(scaler)[0] == {"a": 2, "b": 1}


def test_policy_names_with_an_autoscaler():
    assert split_policy("ours+predictive") == ("ours", "predictive")
    assert split_policy("sglang-default") == ("sglang-default", "off")
    assert parse_policies("sglang-default,ours", autoscale="off,reactive") == [
        "sglang-default", "sglang-default+reactive", "ours", "ours+reactive"]
    assert parse_policies("ours+predictive,ours-no-preprefill") == ["ours+predictive", "ours-no-preprefill"]
    with pytest.raises(ValueError, match="autoscale"):
        parse_policies("ours", autoscale="sometimes")
    with pytest.raises(ValueError, match="reactive or predictive"):
        parse_policies("ours+sometimes")


@pytest.mark.slow
def test_predictive_decision_equals_autoscale_policy(tmp_path):
    """Every decision of ``ours+predictive`` equals AutoscalePolicy.suggest on the live
    sessions' projections (recomputed here from the predictor's states, the profile's service
    times and the agent → pool map)."""
    prep = prepare("coding-assistant", n_workflows=24, seed=3, n_train=40,
                   profile_dir=tmp_path / "prof")
    agent_pool = {"engineer": "code", "explorer": "explore", "chronicler": "explore",
                  "planner": "review", "architect": "review", "reviewer": "review", "verifier": "review"}
    prep.pools = build_pools(prep.workload, {"code": 2, "explore": 1, "review": 1}, agent_pool)
    config = ClusterConfig(replicas=4, kv_capacity_tokens=200_000, host_ratio=0.0, step=STEP)
    opt = AutoscaleOptions(interval_s=5.0, startup_delay_s=10.0, horizon_calls=3, in_flight=True)
    policy = make_policy("ours+predictive", prep, autoscale=opt)
    scaler = next(p for p in policy.parts if isinstance(p, Autoscaler))
    inner = scaler.recommender
    assert isinstance(inner, ProjectedCalls)
    snaps = []

    class Recording:
        name = "predictive"

        def recommend(self, s):
            pred = inner.predictor
            states = {wt: list(pred.live_states(wt)) for wt in pred.profile.paths}
            flight = {wt: pred.in_flight(wt) for wt in pred.profile.paths}
            current = {n: s.count(p) for p, n in enumerate(s.names)}
            out = inner.recommend(s)
            snaps.append((states, flight, current, out))
            return out

    scaler.recommender = Recording()
    arrivals = np.linspace(0.0, 20.0, len(prep.workload.workflows))
    Simulator(prep.workload, policy, config, arrivals, pools=run_pools(prep, config, "ours+predictive")).run()
    assert len(snaps) >= 3
    model = inner.predictor.profile
    agents = model.data["agents"]
    pol = AutoscalePolicy(max_replicas=4)
    cycle_n = cycle_d = 0.0
    for per in agents.values():
        for a in per.values():
            if a.get("calls") and (a.get("mean_latency_s") or 0) + (a.get("mean_gap_after_s") or 0) > 0:
                cycle_n += a["calls"] * (a["mean_latency_s"] + (a.get("mean_gap_after_s") or 0))
                cycle_d += a["calls"]
    window = 3 * cycle_n / cycle_d
    moved = 0
    for states, flight, current, (desired, weights, _info) in snaps:
        calls, service, mapping = {}, {}, {}
        for wt, sts in states.items():
            proj = model.paths[wt].project_calls(sts, 3) if sts else {}
            for agent in set(proj) | set(flight[wt]):
                key = f"{wt}/{agent}"
                calls[key] = proj.get(agent, 0.0) + flight[wt].get(agent, 0)
                service[key] = agents[wt][agent]["mean_latency_s"]
                mapping[key] = agent_pool[agent]
        rows = pol.suggest(calls, service, window, current=current, agent_model=mapping)
        for name in ("code", "explore", "review"):
            want = rows[name]["suggested_replicas"] if name in rows else 1
            assert desired[name] == want
            assert weights[name] == pytest.approx(rows[name]["load_replicas"] if name in rows else 0.0, abs=1e-4)
        moved += any(desired[n] != current[n] for n in desired)
    assert moved, "the projections moved the advice at least once"
    for d in scaler.decisions:
        assert sum(d["target"].values()) <= 4


@pytest.mark.slow
def test_cli_autoscale_rows(tmp_path):
    """``profiler simulate --autoscale off,reactive,predictive`` runs each policy once per mode;
    without a scenario every replica is one pool; each row reports the GPU-seconds held."""
    import json

    from typer.testing import CliRunner

    from profiler.cli import app

    res = CliRunner().invoke(app, [
        "simulate", "--workload", "coding-assistant", "--load", "peak", "--workflows", "16",
        "--replicas", "2", "--kv-capacity-tokens", "60000",
        "--policies", "sglang-default", "--autoscale", "off,reactive,predictive",
        "--json", "--profile", str(tmp_path / "prof")],
        env={"PROFILER_SIMULATE_STARTUP_DELAY": "30", "PROFILER_SIMULATE_AUTOSCALE_INTERVAL": "5",
             "PROFILER_SIMULATE_TRAIN_WORKFLOWS": "40"})
    assert res.exit_code == 0, res.output
    out = json.loads(res.output[res.output.index("{"):])
    rows = out["policies"]
    assert list(rows) == ["sglang-default", "sglang-default+reactive", "sglang-default+predictive"]
    assert out["autoscale"]["startup_delay_s"] == 30.0 and out["autoscale"]["interval_s"] == 5.0
    for name, row in rows.items():
        assert row["gpu_held_s"] > 0
        assert ("autoscale_decisions" in row) == (name != "sglang-default")
    bad = CliRunner().invoke(app, ["simulate", "--workload", "coding-assistant", "--autoscale", "maybe"])
    assert bad.exit_code != 0 and "--autoscale" in bad.output


def test_an_autoscaler_that_keeps_the_split_changes_nothing():
    # its decision timers wake replicas, but with the split unchanged every call runs where and
    # when it ran without an autoscaler
    from simulator.workload import workload_from_records

    recs, arr = one_call_workflows([0.7 * i for i in range(40)], "b", inp=900, out=300)
    more, marr = one_call_workflows([1.1 * i for i in range(30)], "a", inp=400, out=200)
    wl = workload_from_records(recs + more)
    runs = []
    for scaler in (None, Autoscaler(Scripted({"a": 2, "b": 1}), AutoscaleOptions(interval_s=3.0))):
        pol = BASELINES["sglang-default"]()
        if scaler is not None:
            pol.add_part(scaler)
        pools = build_pools(wl, {"a": 2, "b": 1}, {"a": "a", "b": "b"})
        runs.append(Simulator(wl, pol, cfg(3), arr + marr, pools=pools).run())
    plain, scaled = runs
    assert [r.replica for r in plain.requests] == [r.replica for r in scaled.requests]
    assert [r.t_finish for r in scaled.requests] == pytest.approx([r.t_finish for r in plain.requests])
    assert [r.t_admit for r in scaled.requests] == pytest.approx([r.t_admit for r in plain.requests])
