"""Tail figures of a simulation run: P50/P95/P99 JCT overall and per application, TTFT percentiles."""
from __future__ import annotations

import numpy as np

from simulator.baselines import BASELINES
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.metrics import by_app, summarize, workflow_apps
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def cfg() -> ClusterConfig:
    return ClusterConfig(replicas=1, kv_capacity_tokens=6000, host_ratio=1.0, step=STEP,
                         new_token_ratio=0.0, max_running_requests=2)


def _mix():
    """Two applications (a mix tags ids ``app:``): short ``chat`` sessions, long ``coder`` ones."""
    recs = []
    for w in range(6):
        recs += [rec(f"chat:W{w}", 1, 0.0, 0.5, 400, 20, workflow_type_id="chat_t")]
    for w in range(3):
        recs += [rec(f"coder:L{w}", k, 2.0 * k, 2.0 * k + 0.5, 800 + 100 * k, 40, tool="bash",
                     workflow_type_id="coder_t") for k in range(1, 5)]
    return workload_from_records(recs, name="mix(chat, coder)")


def test_every_run_reports_tail_percentiles_overall_and_per_app():
    wl = _mix()
    res = Simulator(wl, BASELINES["sglang-default"](), cfg(), [0.1 * i for i in range(9)]).run()
    row = summarize(res)
    jct = res.wf_finish - res.wf_arrival
    assert row["p99_jct_s"] == float(np.percentile(jct, 99))
    assert row["p50_jct_s"] <= row["p95_jct_s"] <= row["p99_jct_s"] <= jct.max()
    assert set(row["by_app"]) == {"chat", "coder"}
    coder = row["by_app"]["coder"]
    assert coder["workflows"] == 3 and row["by_app"]["chat"]["workflows"] == 6
    # the long sessions' tail is their own, not the pooled one
    assert coder["avg"] > row["by_app"]["chat"]["avg"]
    assert coder["p99"] == float(np.percentile(jct[6:], 99))
    assert row["p50_ttft_s"] <= row["p95_ttft_s"] <= row["p99_ttft_s"]


def test_by_app_is_restricted_to_the_measured_window():
    wl = _mix()
    res = Simulator(wl, BASELINES["sglang-default"](), cfg(), [0.1 * i for i in range(9)]).run()
    mask = np.array([True] * 6 + [False] * 3)
    row = summarize(res, mask)
    assert set(row["by_app"]) == {"chat"} and row["by_app"]["chat"]["workflows"] == 6


def test_apps_are_workflow_types_outside_a_mix():
    wl = workload_from_records([rec("A", 1, 0.0, 0.5, 100, 5, workflow_type_id="x"),
                                rec("B", 1, 0.0, 0.5, 100, 5, workflow_type_id="y")])
    assert workflow_apps(wl) == ["x", "y"]
    out = by_app(np.array([1.0, 3.0]), ["x", "y"])
    assert out["y"]["avg"] == 3.0 and out["x"]["p99"] == 1.0


def _interactive_prep():
    """Four interactive sessions (a person's turn after each first call) and four batch jobs of
    long prompts on one small replica: the batch load delays the interactive first tokens."""
    from simulator.runner import Prepared
    from simulator.sources import Source

    recs = []
    for w in range(4):
        recs += [rec(f"C{w}", 1, 0.0, 0.5, 300, 10, workflow_type_id="chat", wait_after="human"),
                 rec(f"C{w}", 2, 5.0, 5.5, 400, 10, workflow_type_id="chat")]
    for w in range(4):
        recs += [rec(f"J{w}", k, 2.0 * k, 2.0 * k + 1, 2500, 200, tool="bash", workflow_type_id="job")
                 for k in range(1, 4)]
    wl = workload_from_records(recs)
    return Prepared("t", Source("t", [], recs), wl, None, 0), recs


def test_interactive_figures_split_interactive_calls_from_batch_jobs():
    from simulator.metrics import interactive_figures, interactive_types

    prep, recs = _interactive_prep()
    assert interactive_types(recs) == {"chat"}
    res = Simulator(prep.workload, BASELINES["sglang-default"](), cfg(), [0.0] * 8).run()
    ttft = np.array([r.t_first - r.t_issue for r in res.requests if r.wf < 4])
    slo = float(np.median(ttft))
    out = interactive_figures(res, {"chat"}, slo)
    assert out["calls"] == 8 and out["sessions"] == 4
    assert out["slo_attainment"] == float((ttft <= slo).mean())
    assert out["ttft_p99_s"] == float(np.percentile(ttft, 99))
    jct = res.wf_finish - res.wf_arrival
    assert out["batch_avg_jct_s"] == float(jct[4:].mean())
    assert out["concurrent_sessions"] > 1


def test_max_sessions_in_slo_searches_arrival_rates():
    from simulator.runner import max_sessions_in_slo

    prep, _ = _interactive_prep()
    arr = np.linspace(0.0, 20.0, 8)
    loose_trail: list[dict] = []
    tight_trail: list[dict] = []
    loose = max_sessions_in_slo(prep, "sglang-default", cfg(), arr, None, None, (0.0, 0.0),
                                "poisson", None, ({"chat"}, 1e6), trail=loose_trail)
    tight = max_sessions_in_slo(prep, "sglang-default", cfg(), arr, None, None, (0.0, 0.0),
                                "poisson", None, ({"chat"}, 1e-6), trail=tight_trail)
    # every rate meets a loose target: the fastest factor's concurrency; none meets an impossible one
    assert loose > 0 and tight == 0.0
    # the trail holds each run in order: doubling from 1x to 8x, or halving from 1x to 1/16x
    assert [t["rate_factor"] for t in loose_trail] == [1.0, 2.0, 4.0, 8.0]
    assert loose == max(t["concurrent_sessions"] for t in loose_trail)
    assert all(t["slo_attainment"] == 1.0 for t in loose_trail)
    assert [t["rate_factor"] for t in tight_trail] == [1.0, 0.5, 0.25, 0.125, 0.0625]
    assert all(t["slo_attainment"] < 0.99 for t in tight_trail)


def _kv_policy(kv: bool):
    from simulator.baselines.caches import LRU
    from simulator.baselines.routers import RoundRobin
    from simulator.policy import Policy, Scheduler

    class ByWorkflow(Scheduler):
        """The later workflow first: a stand-in for an interactive call that outranks running
        batch work by more than the threshold."""
        slot_preemption = True
        kv_preemption = kv

        def queue_key(self, req):
            return (-req.wf, req.t_issue, req.idx)

    return Policy("t", RoundRobin(), ByWorkflow(), LRU(), "test")


def test_kv_preemption_admits_a_call_that_outranks_running_work():
    """Two long batch calls fill the KV; a higher-ranked call arrives. With KV preemption (SGLang's
    ``preempt_to_schedule`` frees tokens) it runs at once; without, it waits for a finish."""
    recs = [rec("A", 1, 0.0, 1.0, 2500, 400), rec("B", 1, 0.0, 1.0, 2500, 400),
            rec("C", 1, 0.0, 0.5, 1000, 5)]
    wl = workload_from_records(recs)
    c = ClusterConfig(replicas=1, kv_capacity_tokens=6000, host_ratio=1.0, step=STEP,
                      new_token_ratio=0.0, max_running_requests=8)
    arr = [0.0, 0.0, 0.5]
    slow = Simulator(wl, _kv_policy(False), c, arr).run()
    fast = Simulator(wl, _kv_policy(True), c, arr).run()
    ttft = lambda res: next(r.t_first - r.t_issue for r in res.requests if r.wf == 2)
    assert ttft(fast) < ttft(slow)
    assert fast.preemptions >= 1 and slow.preemptions == 0
    # every call still completes
    assert np.isfinite(fast.wf_finish).all()
