"""Plugin decisions every TP rank shares, untagged traffic, priority precedence, observability.

Two :class:`PluginState` objects stand for two TP ranks: they see the same requests at the same
scheduler steps (``Scheduler.forward_ct``, identical on every rank) but their own clocks
disagree; with the step clock (``auto`` under TP > 1) their priorities and deadlines agree.
"""
from __future__ import annotations

import importlib.util

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin is None:  # a namespace match is this folder, not sglang
    pytest.skip("sglang is not installed (see tests/sglang/conftest.py)", allow_module_level=True)

import logging
from array import array
from dataclasses import replace
from types import SimpleNamespace

from policies import PriorityPolicy
from serving_hooks.sglang_plugin import observe
from serving_hooks.sglang_plugin.priority_hooks import admission_of, admit_request, age_queue
from serving_hooks.sglang_plugin.retention import stamp_finished_request
from serving_hooks.sglang_plugin.state import PluginState, get_state, reset_state
from tests.sglang.test_sglang_plugin import gateway_custom_params


def _req(rid: str, custom_params: dict | None, priority: int | None, created: float = 0.0):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", [7, 8, len(rid)]), SamplingParams(max_new_tokens=8, custom_params=custom_params),
              priority=priority)
    req.time_stats.created_time = created
    return req


def _rank(local_clock_offset: float, **settings) -> PluginState:
    base = replace(get_state().settings, priority=PriorityPolicy(aging_per_s=0.05, aging_per_duration=None),
                   keep_drop=replace(get_state().settings.keep_drop, keep_idle=True),   # a TTL to agree on
                   decision_clock="auto",
                   step_s=0.025, **settings)
    return reset_state(PluginState(base, clock=lambda: 5000.0 + local_clock_offset))


def _at_step(step: int, tp: int = 2) -> None:
    get_state().sync(SimpleNamespace(tp_size=tp, forward_ct=step))


def _decide(offset: float) -> tuple[list[int], list[float]]:
    """One rank: admit the same three requests at the same steps, age the queue, decide retention."""
    _rank(offset)
    reqs = [_req("a", gateway_custom_params("wa", "planner", 3.0, 1250), 1250),
            _req("b", gateway_custom_params("wb", "coder", 2.0, 333), 333),
            _req("u", None, None)]
    for step, r in zip((3200, 2400, 4000), reqs):   # b first (step 2400 = 60 s), then a, then u
        _at_step(step)
        assert admit_request(r)
    _at_step(4400)                                 # 4400 steps x 25 ms = 110 s
    age_queue(reqs)
    until = []
    for r in reqs[:2]:
        r.finished = lambda: True
        until.append(stamp_finished_request(r, tree_cache=None).retain_until)
    return [r.priority for r in reqs], until


def test_ranks_with_different_clocks_decide_the_same():
    try:
        prio0, until0 = _decide(0.0)
        prio1, until1 = _decide(0.377)     # a rank whose clock is 377 ms off
    finally:
        reset_state()
    assert prio0 == prio1 and until0 == until1
    # now = 110 s: a waited 30 s -> 1.25 + 1.5; b waited 50 s -> 0.333 + 2.5 = 2.833
    assert prio0[:2] == [2750, 2833]
    assert until0[0] > 110.0
    # one rank (auto): the process clock, as before
    state = _rank(0.0)
    state.sync(SimpleNamespace(tp_size=1, forward_ct=10))
    assert state.clock_mode() == "local" and state.now() == 5000.0
    reset_state()


def test_untagged_requests_get_a_default_and_age():
    try:
        _rank(0.0)
        pol = get_state().settings.priority
        _at_step(400)                                   # 10 s
        old = _req("old", None, None)                   # untagged, no --default-priority-value
        neutral = pol.to_sglang(pol.unknown_score)      # as if 3 calls remained: 1/(1 + 3) in the calls unit
        assert admit_request(old) and old.priority == neutral == 250
        _at_step(1600)                                  # 40 s
        new = _req("new", gateway_custom_params("w", "coder", 0.0, 1000), 1000)
        admit_request(new)
        age_queue([old, new])
        # 30 s of waiting at 0.05/s lifts the untagged request by 1.5
        assert old.priority == neutral + 1500 + 0 and new.priority == 1000
        _rank(0.0, age_untagged=False)
        plain = _req("plain", None, None)
        assert not admit_request(plain) and plain.priority is None
    finally:
        reset_state()


def test_precedence_of_explicit_priority_and_default_value():
    try:
        _rank(0.0)
        cp = gateway_custom_params("w", "coder", 1.0, 700)
        # SGLang wrote --default-priority-value (100) into a request without priority: the
        # gateway's custom_params win
        r1 = _req("r1", cp, 100)
        admit_request(r1, default_priority=100)
        assert r1.priority == 700 and get_state().counters["priority_from_gateway"] == 1
        # a client's own value (not the default) wins over custom_params, and is the aging base
        r2 = _req("r2", cp, 42)
        admit_request(r2, default_priority=100)
        assert r2.priority == 42 and admission_of(r2).base == pytest.approx(0.042)
        # untagged with the server default: the default is the base
        r3 = _req("r3", None, 100)
        admit_request(r3, default_priority=100)
        assert r3.priority == 100 and get_state().counters["priority_from_default"] == 1
        assert get_state().counters["priority_from_client"] == 1
    finally:
        reset_state()


def test_activation_counters_and_decision_lines(caplog):
    state = reset_state(PluginState(replace(get_state().settings, log_every_s=10.0, debug=True)))
    observe.set_debug(None)
    try:
        with caplog.at_level(logging.INFO, logger="serving_hooks.sglang_plugin"):
            assert observe.tick(state, now=0.0)              # activation line
            assert not observe.tick(state, now=5.0)
            admit_request(_req("x", gateway_custom_params("wx", "coder", 1.0, 900), None))
            assert observe.tick(state, now=10.0)             # counters line
        text = caplog.text
        assert "agent-workflow plugin active" in text and "clock=local" in text
        assert "awp-decision priority rid=x priority=900 source=gateway session=wx" in text
        assert "agent-workflow plugin counters:" in text and "priority_from_gateway=1" in text
    finally:
        observe.set_debug(None)
        reset_state()
