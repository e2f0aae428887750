"""Baseline policy rules and our policy's use of the policies objects."""
from __future__ import annotations

import math

import duckdb
import pytest

from policies import ActiveRequest, CapacityPolicy, KeepDropPolicy, PriorityPolicy
from simulator.baselines import BASELINES, FCFS, PLAS, ContinuumTTL
from simulator.config import ClusterConfig
from simulator.engine import Request, Simulator
from simulator.ours import CapacityRouter, HostPrefetch, KeepDropCache, PriorityScheduler, build_ours
from simulator.runner import prepare, simulate, arrival_times
from simulator.report import markdown
from simulator.sources import make_predictor
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


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


@pytest.mark.slow
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
    # keeping is opt-in: what would be kept is neutral; the last call of each workflow: path ends
    assert kd["keep"] == 0 and kd["neutral"] > 0 and kd["drop"] > 0
    _, keeping = simulate(coding, "ours-keep-idle", cfg, arr)
    assert keeping["retention_decisions"]["keep"] > 0
    assert all(r.pred.ann.known for r in res.requests)
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
    router.ledger.start(10_000, "0", ActiveRequest("big", 55_000, 4_000, 0.001), 0.0)  # replica 0 nearly full
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
    from policies import Retention, RetentionRank
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


def test_priority_is_the_sessions_and_ages_from_the_workflow_start(coding):
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=60_000)
    policy = build_ours(make_predictor(coding.profile), "ours-aging-1e-3")   # one rate for all
    wl = coding.workload
    sim = Simulator(wl, policy, cfg, [0.0, 300.0] + [1e9] * (len(wl.workflows) - 2))
    sched: PriorityScheduler = policy.scheduler
    pol = sched.policy
    a1, a2 = (Request(wl.calls[i], 0.0) for i in wl.workflows[0].calls[:2])
    b1 = Request(wl.calls[wl.workflows[1].calls[0]], 300.0)
    sim.now = 0.0
    policy.hook("on_issue", a1)
    sim.now = 300.0
    policy.hook("on_issue", b1)
    # both start their workflow: same base; A is 300 s older -> 0.3 more score (300 integer units)
    assert sched.priority(a1) - sched.priority(b1) == 300
    sim.now = 320.0
    a2.t_issue = a2.t_enqueue = 320.0
    policy.hook("on_issue", a2)       # A's next call: A's score now comes from its latest state
    base_a = pol.score_annotation(a2.pred.ann, queue_depth={})
    assert sched.priority(a1) == sched.priority(a2) == pol.to_sglang(base_a + pol.aging_per_s * 320.0)
    base_b = pol.score_annotation(b1.pred.ann, queue_depth={})
    for now in (320.0, 5000.0):       # waiting never reorders workflows: all age alike
        sim.now = now
        # the difference is the bases' plus the 300 s between the workflows' starts (±1 rounding)
        assert abs(sched.priority(a1) - sched.priority(b1) - pol.to_sglang(base_a - base_b + 0.3)) <= 1
    assert sched.queue_key(a2) < sched.queue_key(b1)


def test_duration_aging_ages_each_session_on_its_expected_duration(coding):
    """``ours-duration-aging`` (``aging_per_duration``): a session's rate is ``PriorityPolicy.aging_rate`` of its
    latest call's annotation — ``k / (age + expected remaining s)``, a power of two times
    ``aging_per_s`` — and its priority grows at that rate while it waits."""
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=60_000)
    policy = build_ours(make_predictor(coding.profile), "ours-duration-aging")
    wl = coding.workload
    Simulator(wl, policy, cfg, [0.0] + [1e9] * (len(wl.workflows) - 1))
    sched: PriorityScheduler = policy.scheduler
    pol = sched.policy
    assert pol.aging_per_duration is not None
    a1 = Request(wl.calls[wl.workflows[0].calls[0]], 0.0)
    sched.sim.now = 0.0
    policy.hook("on_issue", a1)
    ann = a1.pred.ann
    assert ann.known and ann.expected_remaining_s
    rate = sched.book.rate(0)
    tau = float(ann.expected_remaining_s) + float(ann.session_age_s or 0.0)
    assert rate == pol.aging_rate(ann, 0.0)
    assert math.log2(rate / pol.aging_per_s) == round(math.log2(rate / pol.aging_per_s))
    assert rate / 2 ** 0.5 <= pol.aging_per_duration / tau <= rate * 2 ** 0.5
    p0 = sched.priority(a1)
    sched.sim.now = 1000.0
    assert sched.priority(a1) - p0 == pytest.approx(pol.scale * rate * 1000.0, abs=1)


class _ByWorkflow(FCFS):
    """Test scheduler: priority = workflow index (bigger first), SGLang-style slot preemption."""

    slot_preemption = True

    def queue_key(self, req):
        return (-req.wf, req.t_enqueue, req.idx)

    def may_preempt(self, waiting, running) -> bool:
        return waiting.wf > running.wf


def test_slot_preemption_when_the_running_set_is_full():
    # One slot. A (100-token prompt = its task segment, 50 out) starts at 0: prefill 0.100 s,
    # first token at 0.100, then one token per 10 ms. B (higher priority, 50-token prompt, 5 out)
    # arrives at 0.205: the running set is full, so B preempts A (recompute), as SGLang's
    # priority scheduling does. The decode iteration in progress ends first (0.210; A has 12
    # tokens); B prefills 50 tokens -> first token 0.260, 4 more iterations -> done 0.300. A is
    # readmitted: its prompt is still cached, only its 12 generated tokens are recomputed
    # (0.012 s) -> 13 tokens at 0.312, 37 more iterations -> done 0.682.
    recs = [rec("A", 1, 0.0, 1.0, 100, 50), rec("B", 1, 0.205, 1.0, 50, 5)]
    wl = workload_from_records(recs)
    pol = BASELINES["sglang-default"]()
    sched = _ByWorkflow()
    pol.scheduler, pol.parts[1] = sched, sched
    cfg = ClusterConfig(replicas=1, step=STEP, host_ratio=0.0, new_token_ratio=0.0, max_running_requests=1)
    res = Simulator(wl, pol, cfg, [0.0, 0.205]).run()
    a, b = res.requests
    assert res.counters["slot_preemptions"] == 1 and a.preempts == 1 and b.preempts == 0
    assert b.t_first == pytest.approx(0.260) and b.t_finish == pytest.approx(0.300)
    assert a.recomputed == 12 and a.t_finish == pytest.approx(0.682)
    # FCFS has no priority preemption: B waits for A
    res = Simulator(wl, BASELINES["sglang-default"](), cfg, [0.0, 0.205]).run()
    assert res.preemptions == 0 and res.requests[1].t_first > res.requests[0].t_finish


def test_oracle_srpt_serves_the_workflow_with_less_work_left_first():
    # one slot; A needs 40 output tokens, B 5; both arrive together: B (less work) goes first
    recs = [rec("A", 1, 0.0, 1.0, 10, 40), rec("B", 1, 0.0, 1.0, 10, 5)]
    cfg = ClusterConfig(replicas=1, step=STEP, host_ratio=0.0, new_token_ratio=0.0, max_running_requests=1)
    res = Simulator(workload_from_records(recs), BASELINES["oracle-srpt"](), cfg, [0.0, 0.0]).run()
    a, b = res.requests
    assert b.t_finish < a.t_first
    fcfs = Simulator(workload_from_records(recs), BASELINES["belady"](), cfg, [0.0, 0.0]).run()
    assert fcfs.requests[0].t_finish < fcfs.requests[1].t_first


def test_capacity_router_keeps_a_session_home_and_measures_drain(coding):
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=60_000)
    arr = arrival_times(coding.workload, 0.05, 0)
    res, row = simulate(coding, "ours", cfg, arr)
    assert row["capacity_affinity"] + row["capacity_moved_sessions"] <= row["capacity_decisions"]
    assert row["capacity_moved_sessions"] < 0.1 * row["capacity_decisions"]
    homes = {}
    moved = 0
    for r in sorted(res.requests, key=lambda r: r.t_issue):
        moved += r.wf in homes and homes[r.wf] != r.replica
        homes[r.wf] = r.replica
    assert moved == row["capacity_moved_sessions"]
    # each move is counted with the prefix it recomputes; the figures reach the table
    assert (row["capacity_move_recompute_tokens"] > 0) == (moved > 0)
    assert row["routing_recompute_share"] == row["routing_recomputed_tokens"] / row["prefill_tokens"]
    result = {"workload": "coding", "workload_summary": {"workflows": row["workflows"]},
              "arrivals": "poisson",
              "loads": {"peak": {"load_share": 1.0, "rate_wf_per_s": 0.05, "policies": {"ours": row}}}}
    table = markdown(result)
    assert "| routing rc | moved | fallbacks |" in table
    assert (f"| {row['routing_recompute_share']:.1%} | {row['capacity_moved_sessions']:,} | "
            f"{row['capacity_fallbacks']:,} |") in table
    policy = build_ours(make_predictor(coding.profile))
    sim = Simulator(coding.workload, policy, cfg, arr)
    router: CapacityRouter = policy.router
    assert router.policy.prefill_s_per_token == cfg.step.a      # the simulated hardware's
    assert router.drain(0) is None
    sim.now = 30.0
    router.ledger.start("r", "0", ActiveRequest("r", 1000, 4000, 0.01, expected_out=2000.0), 5.0)
    router.ledger.finish("r", 10.0)                              # releases 1000 + 2000 tokens
    assert router.drain(0) == pytest.approx(100.0)               # 3000 tokens over 30 s
    sim.now = 100.0
    assert router.drain(0) is None                               # older than the 60 s window


def test_host_prefetch_never_displaces_retained_host_copies(coding):
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=60_000, host_ratio=0.1)
    policy = build_ours(make_predictor(coding.profile))
    wl = coding.workload
    sim = Simulator(wl, policy, cfg, arrival_times(wl, 0.05, 0))
    cache = sim.replicas[0].cache
    prefetch = next(p for p in policy.parts if isinstance(p, HostPrefetch))
    call = wl.calls[wl.workflows[0].calls[-1]]
    req = Request(call, 0.0)
    req.replica = 0
    for s in (*call.path, call.own_seg):
        cache.insert_gpu(s, 0.0)
    need = sum(wl.seg_tokens[s] for s in (*call.path, call.own_seg))
    # fill the host tier with another session's (neutral) segments
    other = [c for c in wl.calls if c.wf != call.wf]
    filler = []
    for c in other:
        if cache.host_capacity - cache.host_used < need // 2:
            break
        if c.own_seg not in cache.host and cache.insert_host(c.own_seg, 0.0):
            filler.append(c.own_seg)
    plan = prefetch.policy.plan(str(call.wf), 0.0, "x", 1.0, 0.0, need, payload=req)
    sim.now = plan.start_at
    prefetch.on_timer()
    assert prefetch.skipped == 1 and all(s in cache.host for s in filler)
    # once the filler's session is dropped, the staging may use its space
    from policies import Retention, RetentionRank
    for s in filler:
        policy.cache.retention[wl.seg_wf[s]] = Retention(RetentionRank.DROP, 0.0, 0.0, "path ends")
    prefetch.policy.plan(str(call.wf), 0.0, "x", 1.0, 0.0, need, payload=req)
    prefetch.on_timer()
    assert prefetch.staged_tokens > 0 and call.own_seg in cache.host


@pytest.mark.slow
def test_profile_folder_is_reused_only_for_the_same_train_split(tmp_path):
    """``--profile DIR`` twice on one split loads the saved profile; another seed's split refits."""
    cfg = ClusterConfig(replicas=2, kv_capacity_tokens=60_000)
    first = prepare("coding-assistant", 12, seed=3, n_train=60, profile_dir=tmp_path, cfg=cfg)
    again = prepare("coding-assistant", 12, seed=3, n_train=60, profile_dir=tmp_path, cfg=cfg)
    assert not any("reused" in n for n in first.notes)
    assert any("profile reused" in n for n in again.notes)
    assert again.profile.version == first.profile.version
    other = prepare("coding-assistant", 12, seed=4, n_train=60, profile_dir=tmp_path, cfg=cfg)
    assert other.profile.version != first.profile.version and not any("reused" in n for n in other.notes)
    back = prepare("coding-assistant", 12, seed=3, n_train=60, profile_dir=tmp_path, cfg=cfg)
    assert any("profile reused" in n for n in back.notes) and back.profile.version == first.profile.version
    # one store per split: seed 4's profile was fit on seed 4's train calls only
    fit_on = {r["request_id"] for r in other.source.train}
    con = duckdb.connect(str(other.profile.path.parents[1] / "store.duckdb"), read_only=True)
    stored = {row[0] for row in con.execute("SELECT request_id FROM calls").fetchall()}
    con.close()
    assert stored == fit_on
