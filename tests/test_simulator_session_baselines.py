"""The session baselines (``sglang-sticky``, ``sglang-session-close``, ``thunderagent``) and the
job-level metrics, on tiny workflows whose outcome can be worked out by hand."""
from __future__ import annotations

import pytest

from simulator.baselines import BASELINES, FCFS, LRU
from simulator.baselines.sessions import (SessionRadixCache, StickyRouter, ThunderAgentCache, ThunderAgentControl,
                                          ThunderAgentRouter, ThunderAgentScheduler)
from simulator.config import ClusterConfig
from simulator.engine import DONE, Simulator
from simulator.metrics import summarize
from simulator.policy import Policy
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def cfg(**kw) -> ClusterConfig:
    base = dict(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP, new_token_ratio=0.0)
    base.update(kw)
    return ClusterConfig(**base)


def test_sticky_router_keeps_a_session_until_idle_then_gives_it_the_next_round_robin_worker():
    # A: call 2 five seconds after call 1 (idle 5 s < 10 s: sticks), call 3 a hundred seconds
    # later (the sweep at t = 100 s finds it idle > 10 s: dropped, the fallback's next worker).
    recs = [rec("A", 1, 0.0, 0.1, 100, 5), rec("A", 2, 5.1, 5.2, 110, 5), rec("A", 3, 105.2, 105.3, 120, 5),
            rec("B", 1, 0.0, 0.1, 100, 5)]
    wl = workload_from_records(recs)
    router = StickyRouter(idle_s=10.0, sweep_s=10.0)
    res = Simulator(wl, Policy("sticky", router, FCFS(), LRU()), cfg(replicas=3), [0.0, 0.0]).run()
    by_id = {r.call.request_id: r.replica for r in res.requests}
    assert by_id["A#1"] == by_id["A#2"] == 0 and by_id["B#1"] == 1
    assert by_id["A#3"] == 2                     # re-assigned: round robin's third pick
    assert router.counts == {"sticky_hit": 1, "assigned": 3, "expired": 1}
    assert res.requests[[r.call.request_id for r in res.requests].index("A#2")].gpu_hit > 0


def _three_sessions() -> tuple:
    # A's conversation (1,010 tokens) waits 50 s for a tool; B runs and closes; C then needs room
    # that only evicting A's or B's KV can give (3,000 tokens of GPU KV, no host tier).
    recs = [rec("A", 1, 0.0, 0.1, 1000, 10), rec("A", 2, 50.2, 50.3, 1020, 5),
            rec("B", 1, 1.0, 1.1, 1000, 10), rec("C", 1, 10.0, 10.1, 1500, 10)]
    return workload_from_records(recs), [0.0, 1.0, 10.0]


def test_session_radix_cache_evicts_closed_sessions_before_an_open_one_where_lru_does_not():
    wl, arrivals = _three_sessions()
    runs = {}
    for name, cache in (("lru", LRU()), ("session", SessionRadixCache())):
        res = Simulator(wl, Policy(name, StickyRouter(), FCFS(), cache), cfg(kv_capacity_tokens=3000),
                        arrivals).run()
        runs[name] = next(r for r in res.requests if r.call.request_id == "A#2")
    assert runs["lru"].recomputed > 0                  # LRU took A's older KV
    assert runs["session"].recomputed == 0             # the open session's KV outlived closed B's
    assert runs["session"].gpu_hit >= 1010


class RecordingControl(ThunderAgentControl):
    """The control loop, remembering what each pass paused and resumed."""

    def bind(self, sim) -> None:
        super().bind(sim)
        self.log: list[tuple[float, set, dict]] = []

    def control(self) -> None:
        before = set(self.paused)
        super().control()
        self.log.append((self.sim.now, set(self.paused) - before,
                         {wf: tok for wf, tok in self.tokens.items()}))


def _thunder(control: ThunderAgentControl) -> Policy:
    return Policy("thunderagent", ThunderAgentRouter(control), ThunderAgentScheduler(control),
                  ThunderAgentCache(control), extras=(control,))


def test_thunderagent_pauses_the_largest_tool_waiting_program_over_the_threshold_and_resumes_it():
    # budget 4,000 tokens (GPU only): after the first calls the working set is 2,010 + 1,910 =
    # 3,920 > 0.95 × 4,000, so the next pass pauses the larger ACTING program (A) down to 1,910
    # (< 0.80 × 4,000). A resumes once B is done (1,910 + 2,010 > 0.85 × 4,000 until then).
    recs = [rec("A", 1, 0.0, 0.1, 2000, 10), rec("A", 2, 40.1, 40.2, 2010, 5),
            rec("B", 1, 0.0, 0.1, 1900, 10), rec("B", 2, 20.1, 20.2, 1910, 5)]
    wl = workload_from_records(recs)
    control = RecordingControl()
    res = Simulator(wl, _thunder(control), cfg(kv_capacity_tokens=4000), [0.0, 0.0]).run()
    a = next(w.idx for w in wl.workflows if w.workflow_id == "A")
    paused_at = [(t, p) for t, p, _ in control.log if p]
    assert paused_at and paused_at[0][1] == {a}
    assert paused_at[0][0] == pytest.approx(5.0)          # the first 5 s pass
    assert control.counts["pauses"] == 1 and control.counts["resumes"] == 1
    assert not control.paused and not control.tokens      # every program resumed and left
    b2 = next(r for r in res.requests if r.call.request_id == "B#2")
    a2 = next(r for r in res.requests if r.call.request_id == "A#2")
    assert a2.t_issue > b2.t_finish                       # A came back after B closed


def test_thunderagent_holds_a_paused_programs_call_behind_active_ones():
    control = ThunderAgentControl()
    policy = _thunder(control)
    recs = [rec("A", 1, 0.0, 0.1, 10, 1), rec("B", 1, 0.0, 0.1, 10, 1)]
    wl = workload_from_records(recs)
    sim = Simulator(wl, policy, cfg(), [0.0, 0.0])
    a, b = (type("R", (), {"wf": i, "t_issue": t, "idx": i})() for i, t in ((0, 1.0), (1, 2.0)))
    assert policy.scheduler.queue_key(a) < policy.scheduler.queue_key(b)
    control.paused[0] = 0.0
    assert policy.scheduler.queue_key(a) > policy.scheduler.queue_key(b)
    assert sim.policy is policy


@pytest.mark.parametrize("name", ["sglang-sticky", "sglang-session-close", "thunderagent"])
def test_each_session_baseline_serves_every_call_and_reports_job_metrics(name):
    recs = [rec(f"W{i}", k, 10.0 * k + i, 10.0 * k + i + 0.5, 500 + 100 * k, 20, tool="bash")
            for i in range(6) for k in range(3)]
    wl = workload_from_records(recs)
    config = cfg(replicas=2, kv_capacity_tokens=2500, gpus_per_replica=2)
    res = Simulator(wl, BASELINES[name](), config, [float(i) for i in range(6)]).run()
    row = summarize(res)
    assert all(r.state == DONE for r in res.requests)
    assert row["calls"] == 18 and row["workflows"] == 6
    assert row["jobs_per_hour_per_gpu"] == pytest.approx(6 / res.makespan_s * 3600 / 4)
    assert row["jobs_per_hour_per_user"] == pytest.approx(3600 / row["avg_jct_s"])


def test_runner_rows_carry_the_baselines_counters():
    from simulator.runner import simulate as run_one
    from types import SimpleNamespace

    recs = [rec(f"W{i}", k, 10.0 * k + i, 10.0 * k + i + 0.5, 500 + 100 * k, 20, tool="bash")
            for i in range(4) for k in range(2)]
    wl = workload_from_records(recs)
    prep = SimpleNamespace(workload=wl, pools=None, scenario=None)
    for name, key in (("thunderagent", "thunderagent_pauses"), ("sglang-sticky", "sticky_hit")):
        _, row = run_one(prep, name, cfg(replicas=2, kv_capacity_tokens=2500), [float(i) for i in range(4)])
        assert key in row
