"""Keep/drop with SAGA TTL, just-in-time host prefetch and autoscale advice (hand-computed)."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from scipy import stats

from predictors.contract import Annotation, ToolLatency, from_custom_params, to_sglang_custom_params
from policies import (
    HOST_TIER,
    AutoscalePolicy,
    KeepDropPolicy,
    PrefetchPolicy,
    RetentionRank,
    autoscale_advice,
    lognormal_quantile,
    revisit_probability,
)

#: the agent's most frequent tool, p95 5 s
_TOOL_P95_5S = {"bash": ToolLatency(p95_s=5.0)}


def test_ttl_is_p95_of_a_fitted_lognormal_bounded_by_max():
    rng = np.random.default_rng(7)
    samples = rng.lognormal(mean=0.5, sigma=0.8, size=4000)
    shape, loc, scale = stats.lognorm.fit(samples, floc=0)
    mu, sigma = math.log(scale), shape
    by_hand = math.exp(mu + 1.6448536269514722 * sigma)  # exp(mu + z_0.95 sigma)
    pol = KeepDropPolicy(max_ttl_s=120.0)
    assert pol.ttl_s(mu=mu, sigma=sigma) == pytest.approx(by_hand, rel=1e-9)
    # and it is close to the true p95 exp(0.5 + 1.645 * 0.8) = 6.15 s
    assert pol.ttl_s(mu=mu, sigma=sigma) == pytest.approx(math.exp(0.5 + 1.6448536 * 0.8), rel=0.1)
    assert lognormal_quantile(mu, sigma, 0.5) == pytest.approx(scale)
    assert KeepDropPolicy(max_ttl_s=5.0).ttl_s(mu=mu, sigma=sigma) == 5.0
    assert KeepDropPolicy(min_ttl_s=0.5).ttl_s(tool_p95_s=0.1) == 0.5
    assert KeepDropPolicy(default_ttl_s=7.0).ttl_s() == 7.0


def test_keep_drop_decisions_and_expiry():
    pol = KeepDropPolicy(max_ttl_s=60.0, keep_idle=True)
    keep = pol.decide(now=100.0, known=True, remaining_calls=3.0, revisit_p=1.0, tool_p95_s=12.0)
    assert keep.rank == RetentionRank.KEEP and keep.retain_until == 112.0 and keep.ttl_s == 12.0
    assert keep.rank_at(111.9) == RetentionRank.KEEP
    assert keep.rank_at(112.0) == RetentionRank.NEUTRAL  # TTL ran out: plain LRU again
    dead = pol.decide(now=100.0, known=True, remaining_calls=0.1, revisit_p=1.0)
    assert dead.rank == RetentionRank.DROP and dead.rank_at(1e9) == RetentionRank.DROP
    no_revisit = pol.decide(now=100.0, known=True, remaining_calls=4.0, revisit_p=0.1)
    assert no_revisit.rank == RetentionRank.DROP and "revisit" in no_revisit.reason
    unknown = pol.decide(now=100.0, known=False, remaining_calls=4.0, revisit_p=1.0)
    assert unknown.rank == RetentionRank.NEUTRAL


def test_keeping_is_off_by_default_and_dropping_is_not():
    """The default never pins a prefix for its idle gap (keep_drop.py: keeping lost where queues
    form); what it would have kept is plain LRU, and a predicted end is still dropped."""
    default, keeping = KeepDropPolicy(), KeepDropPolicy(keep_idle=True)
    going_on = dict(now=100.0, known=True, remaining_calls=3.0, revisit_p=1.0, tool_p95_s=12.0)
    off = default.decide(**going_on)
    assert off.rank == RetentionRank.NEUTRAL and off.ttl_s == 0.0 and "would retain 12.00s" in off.reason
    assert keeping.decide(**going_on).rank == RetentionRank.KEEP
    ends = dict(going_on, remaining_calls=0.1)
    assert default.decide(**ends).rank == keeping.decide(**ends).rank == RetentionRank.DROP
    assert default.decide(**going_on, session_end=True).rank == RetentionRank.DROP


def test_keep_drop_from_the_gateway_custom_params():
    pol = KeepDropPolicy(keep_idle=True)
    cp = {"known": True, "wf_id": "s1", "agent": "coder", "exp_remaining_calls": 2.5,
          "next_agent": "tester", "next_agent_p": 0.8, "tool_p95_s": 4.0}
    ret = pol.decide_annotation(from_custom_params(cp), now=10.0)
    assert ret.rank == RetentionRank.KEEP and ret.retain_until == 14.0
    # a retain_s computed upstream wins over the p95, and is still bounded
    assert pol.decide_annotation(from_custom_params(dict(cp, retain_s=6.5)), now=10.0).retain_until == 16.5
    assert pol.decide_annotation(from_custom_params(dict(cp, retain_s=1e6)), now=0.0).retain_until == pol.max_ttl_s
    # agent lineage: the next agent is a different one and no distance is known -> drop
    agent_pol = KeepDropPolicy(lineage="agent")
    assert agent_pol.decide_annotation(from_custom_params(cp), now=10.0).rank == RetentionRank.DROP
    same = dict(cp, next_agent="coder", next_agent_p=0.9)
    assert revisit_probability(from_custom_params(same), "agent") == 0.9
    with pytest.raises(ValueError):
        revisit_probability(Annotation(), "nope")


def test_annotation_from_custom_params_tolerates_bad_fields():
    v = from_custom_params({"known": "yes", "exp_remaining_calls": "x", "tool_p95_s": float("nan"),
                                     "pred_out_hi": True, "agent": 3})
    assert v.known is False and v.expected_remaining_calls is None and v.tool_p95_s is None
    assert v.output_hi is None and v.agent_id is None
    nested = Annotation.from_dict(
        {"known": True, "predicted_output_len": [10, 90], "next_agents": [{"agent_id": "r", "p": 0.3},
         {"agent_id": "v", "p": 0.7}], "expected_remaining_calls": 2,
         "tool_latency": {"bash": {"p95_s": 1.4}, "edit": {"p95_s": 3.0}}},
        {"workflow_id": "w", "agent_id": "a"},
    )
    # tool_p95_s is the most frequent (first-listed) tool's p95 in every form (the contract's one
    # definition)
    assert nested.next_agent_id == "v" and nested.output_hi == 90 and nested.tool_p95_s == 1.4
    flat = to_sglang_custom_params({"known": True, "tool_latency": {"bash": {"p95_s": 1.4},
                                                                    "edit": {"p95_s": 3.0}}})
    assert from_custom_params(flat).tool_p95_s == nested.tool_p95_s == flat["tool_p95_s"]


def test_prefetch_is_just_in_time_and_host_only():
    pol = PrefetchPolicy(min_p=0.5, transfer_tok_s=200_000, prefill_tok_s=8_000, decode_tok_s=40, lead_s=0.05)
    finish = pol.predicted_finish(now=0.0, input_tokens=1000, output_lo=200)
    assert finish == pytest.approx(1000 / 8000 + 200 / 40)  # 5.125 s
    plan = pol.plan("r1", now=0.0, next_agent="tester", next_agent_p=0.8, finish_at=finish, prefix_tokens=20_000)
    # copy takes 20000 / 200000 = 0.1 s, plus 0.05 s lead: start at 5.125 - 0.15 = 4.975
    assert plan.start_at == pytest.approx(4.975) and plan.tier == HOST_TIER
    assert pol.due(4.9) == []
    assert [p.key for p in pol.due(4.98)] == ["r1"]
    assert pol.due(100.0) == []  # popped once
    assert pol.plan("r2", 0.0, "tester", 0.3, finish, 100) is None  # p below min_p
    # a re-plan replaces; a cancel forgets
    pol.plan("r3", 0.0, "x", 0.9, 10.0, 100)
    pol.plan("r3", 0.0, "x", 0.9, 20.0, 100)
    pol.plan("r4", 0.0, "x", 0.9, 10.0, 100)
    pol.cancel("r4")
    assert [p.ready_by for p in pol.due(1e9)] == [20.0]
    # a late plan starts now, never in the past
    assert pol.plan("r5", now=50.0, next_agent="x", next_agent_p=1.0, finish_at=40.0, prefix_tokens=10).start_at == 50.0


def test_autoscale_worked_example_and_profile_advice():
    pol = AutoscalePolicy(target_utilization=0.75, concurrency=8)
    rows = pol.suggest({"coder": 120, "tester": 600, "idle": 0}, {"coder": 2.0, "tester": 2.0}, window_s=60)
    # 120 * 2 / (60 * 8 * 0.75) = 0.667 -> 1;  600 * 2 / 360 = 3.33 -> 4; 0 calls -> min 1
    assert rows["coder"]["suggested_replicas"] == 1
    assert rows["tester"]["suggested_replicas"] == 4 and rows["tester"]["load_replicas"] == pytest.approx(3.3333, abs=1e-3)
    assert rows["idle"]["suggested_replicas"] == 1 and rows["idle"]["assumed_service_s_for"] == ["idle"]
    merged = pol.suggest({"coder": 120, "tester": 600}, {"coder": 2.0, "tester": 2.0}, 60,
                         current={"m": 2}, agent_model={"coder": "m", "tester": "m"})
    # one model serves both: (120 + 600) * 2 / 360 = 4.0 exactly -> 4 replicas, 2 more than now
    assert merged["m"]["suggested_replicas"] == 4 and merged["m"]["delta"] == 2
    with pytest.raises(ValueError):
        pol.suggest({}, {}, 0)

    profile = {"agents": {"ca": {"coder": {"calls": 10, "mean_latency_s": 3.0, "mean_gap_after_s": 1.0},
                                 "tester": {"calls": 30, "mean_latency_s": 1.0, "mean_gap_after_s": 1.0}}}}
    body = autoscale_advice(profile, {"ca": {"coder": 40.0, "tester": 90.0}}, horizon_calls=5)
    # mean cycle = (10*4 + 30*2) / 40 = 2.5 s -> window 12.5 s
    assert body["window_s"] == 12.5
    # coder: 40*3 / (12.5*8*0.75) = 1.6 -> 2; tester: 90*1 / 75 = 1.2 -> 2
    assert body["models"]["ca/coder"]["suggested_replicas"] == 2
    assert body["models"]["ca/tester"]["suggested_replicas"] == 2
    assert body["total_suggested_replicas"] == 4


def test_drop_only_when_the_path_predicts_the_end():
    pol = KeepDropPolicy(drop_end_p=0.7, keep_idle=True)
    # a SWE-agent-like loop: every state may go on (p_end 0.1, ~20 calls expected): kept
    loop = Annotation(known=True, expected_remaining_calls=20.0, p_end=0.1, tool_latency=_TOOL_P95_5S)
    assert revisit_probability(loop) == pytest.approx(0.9)
    assert pol.decide_annotation(loop, now=0.0).rank == RetentionRank.KEEP
    # the automaton says the workflow ends here (p_end 1): dropped at once
    last = Annotation(known=True, expected_remaining_calls=0.0, p_end=1.0)
    assert pol.decide_annotation(last, now=0.0).rank == RetentionRank.DROP
    # p_end 0.5: the end is not predicted (a return is as likely): kept, even with E[rem] < 0.5
    maybe = Annotation(known=True, expected_remaining_calls=0.45, p_end=0.5, tool_latency=_TOOL_P95_5S)
    assert pol.decide_annotation(maybe, now=0.0).rank == RetentionRank.KEEP
    # without p_end the expected remaining calls decide, as before
    assert pol.decide(0.0, True, 0.2, 1.0).rank == RetentionRank.DROP


def test_prefetch_stages_only_into_free_or_dropped_host_memory():
    assert PrefetchPolicy.may_stage(100, free_tokens=100)
    assert not PrefetchPolicy.may_stage(101, free_tokens=100)
    assert PrefetchPolicy.may_stage(150, free_tokens=100, dropped_tokens=50)
    assert not PrefetchPolicy.may_stage(10, free_tokens=-5, dropped_tokens=0)


def test_session_end_drops_the_prefix_whatever_else_is_predicted():
    pol = KeepDropPolicy(keep_idle=True)
    going_on = Annotation(known=True, expected_remaining_calls=20.0, p_end=0.05, tool_latency=_TOOL_P95_5S)
    assert pol.decide_annotation(going_on, 10.0).rank == RetentionRank.KEEP
    ended = replace(going_on, session_end=True)               # the client said: last call
    ret = pol.decide_annotation(ended, 10.0)
    assert ret.rank == RetentionRank.DROP and ret.reason == "session ends" and ret.ttl_s == 0.0
    unknown_last = Annotation(known=False, session_end=True)     # no prediction, but the last call
    assert pol.decide_annotation(unknown_last, 10.0).rank == RetentionRank.DROP
    assert pol.decide_annotation(Annotation(known=False), 10.0).rank == RetentionRank.NEUTRAL


def test_session_end_plans_no_prefetch_and_cancels_the_sessions_pending_ones():
    pol = PrefetchPolicy()
    a = pol.plan("r1", 0.0, "coder", 0.9, finish_at=5.0, prefix_tokens=1000, session="s")
    b = pol.plan("r2", 0.0, "coder", 0.9, finish_at=5.0, prefix_tokens=1000, session="other")
    assert a is not None and b is not None and pol.pending() == 2
    assert pol.plan("r3", 1.0, "coder", 0.9, finish_at=6.0, prefix_tokens=1000, session="s",
                    session_end=True) is None
    assert pol.pending() == 1 and [p.key for p in pol.due(100.0)] == ["r2"]   # s's plan is gone
    pol.plan("r4", 0.0, "coder", 0.9, finish_at=5.0, prefix_tokens=1000, session="s")
    assert pol.cancel_session("s") == 1 and pol.cancel_session("s") == 0 and pol.due(100.0) == []
