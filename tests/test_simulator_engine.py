"""Hand-checked cases of the simulator engine (one replica, tiny workflows, exact times).

The step model is made simple enough to do by hand: a prefill iteration costs 1 ms per prompt
token, a decode iteration 10 ms, nothing else (t0 = 0.01, a = 0.001, a_ctx = c = 0).
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.baselines import BASELINES, FCFS, LRU, RoundRobin
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.policy import Policy
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def cfg(**kw) -> ClusterConfig:
    base = dict(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                new_token_ratio=0.0)
    base.update(kw)
    return ClusterConfig(**base)


def sglang_default() -> Policy:
    return BASELINES["sglang-default"]()


def test_two_workflows_share_one_replica_exact_completion_times():
    # A: 100-token prompt, 10 output tokens; B: 50-token prompt, 5 output tokens; both at t=0.
    # iteration 1: prefill 150 tokens = 0.150 s, both emit their first token at 0.150;
    # then 4 decode iterations with both (0.040 s): B has its 5 tokens at 0.190;
    # then A alone for 5 more iterations (0.050 s): A finishes at 0.240.
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 50, 5)])
    res = Simulator(wl, sglang_default(), cfg(), [0.0, 0.0]).run()
    a, b = res.requests
    assert a.t_first == pytest.approx(0.150)
    assert b.t_first == pytest.approx(0.150)
    assert b.t_finish == pytest.approx(0.190)
    assert a.t_finish == pytest.approx(0.240)
    jct = res.wf_finish - res.wf_arrival
    assert jct.tolist() == pytest.approx([0.240, 0.190])
    assert res.replica_busy_s[0] == pytest.approx(0.240)
    assert res.preemptions == 0


def test_closed_loop_next_call_after_gap_hits_the_cached_conversation():
    # call 1: 100 prompt + 10 out (prefill 0.100, 9 more decode iterations: done at 0.190);
    # recorded tool gap 1.0 s → call 2 issued at 1.190; its prompt (120 tokens) extends call 1's
    # conversation (110 tokens cached on the GPU), so only 10 tokens are prefilled (0.010):
    # first token at 1.200, 4 more iterations, done at 1.240.
    wl = workload_from_records([
        rec("W", 1, 0.0, 0.5, 100, 10),
        rec("W", 2, 1.5, 2.0, 120, 5),          # arrives 1.0 s after call 1 finished
    ])
    res = Simulator(wl, sglang_default(), cfg(), [0.0]).run()
    c1, c2 = res.requests
    assert c1.t_finish == pytest.approx(0.190)
    assert c2.t_issue == pytest.approx(1.190)
    assert c2.t_first == pytest.approx(1.200)
    assert c2.t_finish == pytest.approx(1.240)
    assert c2.gpu_hit == 110
    assert c2.computed == 10 and c2.recomputed == 0
    assert (res.wf_finish - res.wf_arrival)[0] == pytest.approx(1.240)


def test_fan_out_siblings_are_issued_together_and_join():
    # root → two children (same parents) → a join call with both as parents
    recs = [
        rec("F", 1, 0.0, 1.0, 10, 2),
        rec("F", 2, 1.0, 2.0, 10, 2, parent_request_ids=["F#1"]),
        rec("F", 3, 1.0, 3.0, 10, 4, parent_request_ids=["F#1"]),
        rec("F", 4, 3.5, 4.0, 10, 1, parent_request_ids=["F#2", "F#3"]),
    ]
    res = Simulator(workload_from_records(recs), sglang_default(), cfg(), [0.0]).run()
    r1, r2, r3, r4 = res.requests
    assert r2.t_issue == pytest.approx(r1.t_finish) and r3.t_issue == pytest.approx(r1.t_finish)
    assert r4.t_issue == pytest.approx(max(r2.t_finish, r3.t_finish) + 0.5)


def test_kv_exhaustion_preempts_the_newest_call_and_recomputes_it():
    # capacity 230 tokens: two 100-token prompts fit, but their decode growth does not
    recs = [rec("A", 1, 0.0, 1.0, 100, 40), rec("B", 1, 0.0, 1.0, 100, 40)]
    res = Simulator(workload_from_records(recs), sglang_default(),
                    cfg(kv_capacity_tokens=230), [0.0, 0.0]).run()
    a, b = res.requests
    assert res.preemptions >= 1
    assert b.preempts >= 1 and a.preempts == 0          # FCFS: the newest call is the victim
    assert b.recomputed > 0
    assert a.t_finish < b.t_finish


def test_unfit_call_is_a_clear_error():
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 500, 10)])
    with pytest.raises(ValueError, match="KV capacity"):
        Simulator(wl, sglang_default(), cfg(kv_capacity_tokens=100), [0.0])


def test_round_robin_spreads_a_session_so_it_misses_its_prefix():
    recs = [rec("W", 1, 0.0, 0.5, 1000, 10), rec("W", 2, 1.5, 2.0, 1020, 5)]
    wl = workload_from_records(recs)
    rr = Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()), cfg(replicas=2), [0.0]).run()
    sticky = Simulator(wl, BASELINES["belady"](), cfg(replicas=2), [0.0]).run()
    assert rr.requests[1].replica != rr.requests[0].replica
    assert rr.requests[1].recomputed == 1010             # the conversation computed again elsewhere
    assert sticky.requests[1].recomputed == 0 and sticky.requests[1].gpu_hit == 1010


def test_closed_population_lets_the_next_workflow_in_when_one_finishes():
    recs = [rec(f"W{i}", 1, float(i), float(i) + 1, 10, 3) for i in range(3)]
    res = Simulator(workload_from_records(recs), sglang_default(), cfg(), [0.0, 0.0, 0.0],
                    concurrency=1).run()
    assert res.wf_arrival[1] == pytest.approx(res.wf_finish[0])
    assert res.wf_arrival[2] == pytest.approx(res.wf_finish[1])
    assert not np.isnan(res.wf_finish).any() and math.isfinite(res.makespan_s)


def test_fixed_length_requests_reserve_their_real_output_not_the_clip():
    # One replica, a 600-token pool, two 100-token prompts with 10-token outputs, at t=0.
    # SGLang's estimate without a known length reserves new_token_ratio x clip = 0.1 x 4096
    # = 409 tokens for the first call's decode, so the second (101 + 409 + 100 > 600) waits
    # until the first has finished; requests sent with max_tokens = their output and
    # ignore_eos (profiler replay) reserve those 10 tokens, and both run together.
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 100, 10)])
    estimated = Simulator(wl, sglang_default(), cfg(kv_capacity_tokens=600, new_token_ratio=0.1), [0.0, 0.0]).run()
    fixed = Simulator(wl, sglang_default(), cfg(kv_capacity_tokens=600, new_token_ratio=0.1,
                                                fixed_length_requests=True), [0.0, 0.0]).run()
    a, b = estimated.requests
    assert b.t_first >= a.t_finish          # serialized by the clip-sized reserve
    a, b = fixed.requests
    assert b.t_first == pytest.approx(a.t_first)    # one prefill batch for both
    assert fixed.wf_finish.max() < estimated.wf_finish.max()   # 0.29 s together vs 0.38 s one after the other


def test_replicas_sharing_one_device_slow_each_other_down():
    # Two replicas, one call each at t=0 (100-token prompt, 10 outputs: 0.190 s alone). Sharing
    # one device (the CPU bench), an iteration that starts while the other replica is mid-
    # iteration takes twice its step time: the calls finish later, but never past twice alone.
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 100, 10)])
    alone = Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()), cfg(replicas=2), [0.0, 0.0]).run()
    shared = Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()), cfg(replicas=2, shared_compute=True),
                       [0.0, 0.0]).run()
    assert alone.wf_finish.tolist() == pytest.approx([0.190, 0.190])
    assert {r.replica for r in shared.requests} == {0, 1}
    assert all(0.190 < f <= 2 * 0.190 + 1e-9 for f in shared.wf_finish)
    assert sum(shared.replica_busy_s) > sum(alone.replica_busy_s)


def test_compute_share_sets_how_much_the_other_replica_slows_a_step():
    # The same two calls as above, each replica with one call: with ``compute_share`` s an
    # iteration that starts while the other replica is mid-iteration takes 1 + s times its step.
    # Both replicas step in lockstep here, so every iteration after the first pays the full
    # factor: the finish times order as the shares do, 0 gives the unshared time exactly, and
    # 0.5 lies strictly between none and full sharing.
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 100, 10)])

    def finish(share: float) -> float:
        res = Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()),
                        cfg(replicas=2, shared_compute=True, compute_share=share), [0.0, 0.0]).run()
        assert {r.replica for r in res.requests} == {0, 1}
        return float(res.wf_finish.max())

    none, half, full = finish(0.0), finish(0.5), finish(1.0)
    assert none == pytest.approx(0.190)
    assert none < half < full <= 2 * 0.190 + 1e-9
    assert half == pytest.approx(none + 0.5 * (full - none), rel=0.25)
