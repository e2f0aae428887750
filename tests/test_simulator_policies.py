"""Baseline policy rules and our policy's use of the serving_hooks.policies objects."""
from __future__ import annotations

import pytest

from serving_hooks.policies import ActiveRequest, CapacityPolicy, KeepDropPolicy, PriorityPolicy
from simulator.baselines import BASELINES, PLAS, ContinuumTTL
from simulator.calibration import StepTimeModel
from simulator.config import ClusterConfig
from simulator.engine import Request, Simulator
from simulator.ours import CapacityRouter, HostPrefetch, KeepDropCache, PriorityScheduler, build_ours
from simulator.runner import prepare, simulate, arrival_times
from simulator.sources import make_predictor
from simulator.workload import workload_from_records

STEP = StepTimeModel(t0=0.01, a=0.001, a_ctx=0.0, c=0.0, source="test")


def rec(wf, n, t_arr, t_fin, inp, out, tool=None, **extra):
    r = {"request_id": f"{wf}#{n}", "workflow_type_id": "t", "workflow_id": wf, "agent_id": "a",
         "t_arrival": t_arr, "t_finish": t_fin, "input_tokens": inp, "output_tokens": out, **extra}
    if tool:
        r["tool_calls"] = [{"name": tool, "t_start": t_fin, "t_end": t_fin + 1}]
    return r


@pytest.fixture(scope="module")
def coding(tmp_path_factory):
    """A small generated coding-assistant replay with its train-split profile."""
    return prepare("coding-assistant", 12, seed=3, n_train=60,
                   profile_dir=tmp_path_factory.mktemp("prof"),
                   cfg=ClusterConfig(replicas=2, kv_capacity_tokens=60_000))


def test_generated_replay_never_uses_training_workflows(coding):
    train_ids = {r["workflow_id"] for r in coding.source.train}
    test_ids = {w.workflow_id for w in coding.workload.workflows}
    assert test_ids and not (train_ids & test_ids)


def test_log_split_is_by_workflow(tmp_path):
    from pathlib import Path
    src = Path(__file__).resolve().parents[1] / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"
    prep = prepare(str(src), None, seed=0, profile_dir=tmp_path / "p",
                   cfg=ClusterConfig(replicas=1))
    train_ids = {r["workflow_id"] for r in prep.source.train}
    test_ids = {r["workflow_id"] for r in prep.source.test}
    assert train_ids and test_ids and not (train_ids & test_ids)
    replayed = {w.workflow_id.split("~")[0] for w in prep.workload.workflows}
    assert replayed <= test_ids


def test_ours_drives_the_serving_hooks_policy_objects(coding):
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=60_000)
    arr = arrival_times(coding.workload, 0.05, 0)
    res, row = simulate(coding, "ours", cfg, arr)
    assert row["capacity_decisions"] == coding.workload.n_calls
    kd = row["retention_decisions"]
    assert kd["keep"] > 0 and kd["drop"] > 0          # the last call of each workflow: path ends
    assert all(r.pred["view"].known for r in res.requests)
    policy = build_ours(make_predictor(coding.profile))
    kinds = {type(p) for p in policy.parts}
    assert {CapacityRouter, PriorityScheduler, KeepDropCache, HostPrefetch} <= kinds
    assert isinstance(policy.router.policy, CapacityPolicy)
    assert isinstance(policy.scheduler.policy, PriorityPolicy)
    assert isinstance(policy.cache.policy, KeepDropPolicy)


def test_capacity_router_does_not_send_a_request_where_its_bound_overflows(coding):
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=60_000)
    policy = build_ours(make_predictor(coding.profile))
    Simulator(coding.workload, policy, cfg, arrival_times(coding.workload, 0.05, 0))  # binds
    router = policy.router
    router.active[0][10_000] = ActiveRequest("big", 55_000, 4_000, 0.001)   # replica 0 nearly full
    call = coding.workload.calls[0]
    req = Request(call, 0.0)
    policy.hook("on_issue", req)
    assert router.route(req) == 1


def test_ablation_switches_parts_back_to_sglang_default(coding):
    names = {n: {type(p).__name__ for p in build_ours(make_predictor(coding.profile), n).parts}
             for n in ("ours-no-priority", "ours-no-capacity", "ours-no-keepdrop", "ours-no-prefetch",
                       "ours-sticky", "ours-belady")}
    assert "FCFS" in names["ours-no-priority"] and "PriorityScheduler" not in names["ours-no-priority"]
    assert "RoundRobin" in names["ours-no-capacity"]
    assert "LRU" in names["ours-no-keepdrop"]
    assert "HostPrefetch" not in names["ours-no-prefetch"]
    assert "StickyLeastLoad" in names["ours-sticky"]
    assert "Belady" in names["ours-belady"]


def test_keep_drop_orders_dropped_sessions_first_and_keeps_them_off_the_host(coding):
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=60_000)
    policy = build_ours(make_predictor(coding.profile))
    sim = Simulator(coding.workload, policy, cfg, arrival_times(coding.workload, 0.05, 0))
    from serving_hooks.policies import Retention, RetentionRank
    cache = policy.cache
    wl = coding.workload
    seg_a = wl.calls[wl.workflows[0].calls[0]].own_seg
    seg_b = wl.calls[wl.workflows[1].calls[0]].own_seg
    rep = sim.replicas[0].cache
    rep.insert_gpu(seg_a, 5.0)      # more recent, but its session is dead
    rep.insert_gpu(seg_b, 1.0)
    cache.retention[0] = Retention(RetentionRank.DROP, 5.0, 5.0, "path ends")
    cache.retention[1] = Retention(RetentionRank.KEEP, 100.0, 1.0, "retain")
    assert cache.evict_key(0, seg_a, 6.0) < cache.evict_key(0, seg_b, 6.0)
    assert cache.to_host(0, seg_a) is False and cache.to_host(0, seg_b) is True


def test_plas_levels_demote_with_attained_service_and_starving_programs_are_promoted():
    wl = workload_from_records([rec("A", 1, 0, 1, 10, 400), rec("B", 1, 0, 1, 10, 5)])
    plas = PLAS(quantum_s=1.0, levels=4, beta=2.0)
    pol = BASELINES["sglang-default"]()
    pol.scheduler = plas
    pol.parts[1] = plas
    sim = Simulator(wl, pol, ClusterConfig(replicas=1, step=STEP, host_ratio=0.0), [0.0, 0.0])
    plas.bind(sim)
    a, b = Request(wl.calls[0], 0.0), Request(wl.calls[1], 0.0)
    plas.on_issue(a), plas.on_issue(b)
    a.state = 2
    plas.on_step(0, 1.5, [a])                       # A used its queue-0 quantum (1 s)
    assert plas.level(a) == 1 and plas.level(b) == 0
    assert plas.preempt_rank(b) < plas.preempt_rank(a)
    c = Request(wl.calls[0], 10.0)                  # A's next call, issued at t = 10
    plas.on_issue(c)
    assert plas.level_of[c.idx] == 1                # placed by its program's 1.5 s of service
    sim.now = 10.0 + 2.0 * 1.5 + 0.1                # waited more than β·T: promoted
    assert plas.level(c) == 0


def test_continuum_pins_the_session_for_the_tool_running_mean_and_unpins_on_return():
    recs = [rec("W", 1, 0.0, 0.5, 100, 10, tool="bash"), rec("W", 2, 2.5, 3.0, 120, 5, tool="bash"),
            rec("W", 3, 6.0, 6.5, 140, 5)]
    wl = workload_from_records(recs)
    policy = BASELINES["continuum-ttl"]()
    cfg = ClusterConfig(replicas=1, step=STEP, host_ratio=0.0, new_token_ratio=0.0)
    Simulator(wl, policy, cfg, [0.0]).run()
    ttl: ContinuumTTL = policy.cache
    # first return after call 1: the tool took its recorded gap of 2.0 s
    assert ttl.n["bash"] == 2 and ttl.sum["bash"] / ttl.n["bash"] == pytest.approx(2.5)
    assert not policy.cache.pins                    # every pin was released on return


def test_arrival_modes_and_sampled_tool_gaps(coding):
    from simulator.runner import gap_function

    wl = coding.workload
    poisson = arrival_times(wl, 0.5, 1)
    assert poisson[0] == 0.0 and (poisson[1:] >= poisson[:-1]).all()
    assert (poisson[-1] / (len(poisson) - 1)) == pytest.approx(2.0, rel=0.6)   # mean gap 1/rate
    trace = arrival_times(wl, 0.5, 1, "trace", recorded_starts=[0.0, 10.0, 30.0])
    gaps = trace[1:] - trace[:-1]               # recorded spacing 10, 20 (cycled), rescaled
    assert gaps[1] == pytest.approx(2 * gaps[0]) and gaps.mean() == pytest.approx(2.0)
    closed = arrival_times(wl, 0.5, 1, "closed", concurrency=3, span_s=100.0)
    assert closed[0] == 0.0 and closed[2] <= 100.0
    with pytest.raises(ValueError, match="--arrivals"):
        arrival_times(wl, 0.5, 1, "bursty")
    sampled = gap_function(wl, coding.profile, "sampled", seed=0)
    with_tools = [c for c in wl.calls if c.parents and any(wl.calls[p].tools for p in c.parents)]
    assert with_tools
    gaps = [sampled(c) for c in with_tools]
    assert all(g > 0 for g in gaps) and gaps == [sampled(c) for c in with_tools]   # seeded, stable
    assert gaps != [c.gap_s for c in with_tools]
    assert gap_function(wl, coding.profile, "recorded", 0) is None
