"""Pre-prefill on a 1-replica toy: the next call's known prefix is computed while the replica idles.

Step model of ``tests/simulator_helpers.py``: 1 ms per prefill token, 10 ms per decode iteration.
Workflow: call 1 (agent ``a``, 300-token prompt = the workflow's task, 10 output tokens), then a
tool gap, then call 2 (agent ``b``: its 2,000-token system prompt, the 300-token task, 1,700
tokens of parent context). Before call 2 exists, ``b``'s system prompt and the task are known:
2,300 tokens an idle replica can prefill.
"""
from __future__ import annotations

import pytest

from policies import Annotation, NextAgent
from simulator.baselines import FCFS, LRU, RoundRobin
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.policy import Policy
from simulator.preprefill import PrePrefill
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


class NextIsB:
    """A prediction feed stub: after an ``a`` call, ``b`` comes next (p = 1)."""

    def served(self, req) -> Annotation:
        if req.call.agent == "a":
            return Annotation(known=True, next_agents=(NextAgent("b", 1.0),))
        return Annotation()


def toy(gap: float):
    recs = [rec("W", 1, 0.0, 0.39, 300, 10, agent_id="a"),
            rec("W", 2, 0.39 + gap, 9.0, 4000, 5, agent_id="b")]
    return workload_from_records(recs, system_tokens={"b": 2000}, conversation_lineage=False)


def run(gap: float, pre: bool, chunk: int = 8192):
    wl = toy(gap)
    part = PrePrefill(NextIsB())
    pol = Policy("t", RoundRobin(), FCFS(), LRU(), extras=(part,) if pre else ())
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                        new_token_ratio=0.0, chunked_prefill_size=chunk)
    res = Simulator(wl, pol, cfg, [0.0]).run()
    return res, part


def test_known_prefix_is_the_next_agents_system_prompt_and_task():
    res, part = run(5.0, True)
    wl = res.workload
    c2 = wl.calls[1]
    assert part.known_prefix(0, "b") == list(c2.path[:2])
    assert [wl.seg_tokens[s] for s in c2.path] == [2000, 300, 1700]


def test_preprefill_turns_the_next_prefill_into_a_hit():
    # call 1: prefill 300 → first token 0.300, done 0.390. The replica idles: it prefills b's
    # system prompt + task (2,300 tokens, 2.3 s: 0.39 → 2.69). Call 2 is issued at 5.39 and
    # finds them on the GPU: it prefills 1,700 tokens (first token 7.09), 4 decodes → 7.13.
    # Without pre-prefill it prefills all 4,000 (first token 9.39, done 9.43).
    res, part = run(5.0, True)
    base, _ = run(5.0, False)
    c2, b2 = res.requests[1], base.requests[1]
    assert c2.t_issue == pytest.approx(5.39) and b2.t_issue == pytest.approx(5.39)
    assert c2.gpu_hit == 2300 and b2.gpu_hit == 0
    assert c2.computed == 1700 and b2.computed == 4000
    assert c2.t_first == pytest.approx(7.09) and b2.t_first == pytest.approx(9.39)
    assert c2.t_finish == pytest.approx(7.13) and b2.t_finish == pytest.approx(9.43)
    st = part.stats()
    assert st == {"preprefill_jobs": 1, "preprefill_tokens": 2300, "preprefill_used_tokens": 2300,
                  "preprefill_wasted_tokens": 0, "preprefill_calls_hit": 1}
    # the background prefill is GPU work: same tokens computed in all, same busy time
    assert res.replica_busy_s[0] == pytest.approx(base.replica_busy_s[0])


def test_a_call_arriving_mid_job_waits_one_chunk_and_the_rest_is_dropped():
    # chunks of 1,000 tokens: 0.39 → 1.39 (sys 0..1000), 1.39 → 2.39 (sys complete: inserted).
    # Call 2 is issued at 1.59, waits for the chunk to end (2.39), hits the 2,000-token system
    # prompt; the job's remaining 300 task tokens are dropped (nothing partial was computed).
    # Call 2 prefills 2,000 tokens in two chunks: first token at 4.39.
    res, part = run(1.2, True, chunk=1000)
    c2 = res.requests[1]
    assert c2.t_issue == pytest.approx(1.59)
    assert c2.t_admit == pytest.approx(2.39)
    assert c2.gpu_hit == 2000 and c2.computed == 2000
    assert c2.t_first == pytest.approx(4.39)
    st = part.stats()
    assert st["preprefill_tokens"] == 2000 and st["preprefill_used_tokens"] == 2000
    assert st["preprefill_wasted_tokens"] == 0
    base, _ = run(1.2, False, chunk=1000)
    assert base.requests[1].t_first == pytest.approx(1.59 + 4.0)


def test_a_busy_replica_does_no_preprefill():
    # another workflow's call (1,000 prompt, 700 output: ≈ 8 s) arrives at 0.2 and keeps the
    # replica busy through the gap: nothing is pre-prefilled, call 2 computes its whole prompt
    recs = [rec("W", 1, 0.0, 0.39, 300, 10, agent_id="a"),
            rec("W", 2, 5.39, 9.0, 4000, 5, agent_id="b"),
            rec("V", 1, 0.2, 9.0, 1000, 700, agent_id="v")]
    wl = workload_from_records(recs, system_tokens={"b": 2000}, conversation_lineage=False)
    part = PrePrefill(NextIsB())
    pol = Policy("t", RoundRobin(), FCFS(), LRU(), extras=(part,))
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP,
                        new_token_ratio=0.0)
    res = Simulator(wl, pol, cfg, [0.0, 0.2]).run()
    v = next(r for r in res.requests if r.call.agent == "v")
    c2 = next(r for r in res.requests if r.call.agent == "b")
    assert v.t_finish > c2.t_issue
    assert part.stats()["preprefill_tokens"] == 0 and c2.gpu_hit == 0


def test_preprefill_policy_rule():
    from policies import PrePrefillPolicy

    pol = PrePrefillPolicy(min_p=0.5, min_tokens=64)
    assert pol.wants(True, "b", 0.5) and not pol.wants(True, "b", 0.49)
    assert not pol.wants(False, "b", 1.0) and not pol.wants(True, None, 1.0)
    assert pol.worth(64, 64, idle=True)
    assert not pol.worth(63, 1000, idle=True)       # too small to be worth an iteration
    assert not pol.worth(500, 499, idle=True)       # would need an eviction
    assert not pol.worth(500, 10_000, idle=False)   # the replica has work
