"""The plugin inside the real sglang package: registration, request fields, priority order."""
from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin is None:  # a namespace match is this folder, not sglang
    pytest.skip("sglang is not installed (see tests/sglang/conftest.py)", allow_module_level=True)

from array import array


from serving_hooks.annotations import flatten_for_sglang
from policies import Annotation, PriorityPolicy, from_custom_params
from serving_hooks.sglang_plugin import HOOKS
from serving_hooks.sglang_plugin.priority_hooks import admission_of, admit_request
from serving_hooks.sglang_plugin.retention import BACKEND_NAME, retention_cache_factory
from serving_hooks.sglang_plugin.state import PluginState, get_state, reset_state

pytestmark = pytest.mark.usefixtures("sglang_runtime")


#: Plugin clock start for this module (the ``clock`` fixture of conftest.py reads it).
CLOCK_START = 1000.0


def gateway_custom_params(wf_id: str, agent: str, remaining: float, priority: int | None) -> dict:
    """What the gateway forwards as custom_params: issue 4's flattening of sys_annotations."""
    ann = {"profile_version": "v1", "known": True, "predicted_output_len": [20, 200],
           "next_agents": [{"agent_id": "coder", "p": 0.9}], "expected_remaining_calls": remaining,
           "expected_remaining_s": 10.0 * remaining, "priority": priority,
           "tool_latency": {"bash": {"mu": 0.0, "sigma": 0.5, "p50_s": 1.0, "p95_s": 2.3}}}
    return flatten_for_sglang(ann, {"workflow_type_id": "ca", "workflow_id": wf_id, "agent_id": agent})


def test_plugin_registers_through_its_entry_point():
    from importlib.metadata import entry_points

    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.mem_cache.registry import get_radix_cache_factory
    from sglang.srt.plugins.hook_registry import HookRegistry

    eps = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "agent_workflow"]
    assert eps and eps[0].value == "serving_hooks.sglang_plugin:register"
    for target in (h.target for h in HOOKS):
        sources = [src for _, _, src in HookRegistry._hooks[target]]
        assert any(s is not None and s.plugin_name == "agent_workflow" for s in sources), target
        assert target in HookRegistry._patched, f"{target} was not patched"
    # the patched methods wrap the originals
    assert hasattr(Scheduler._add_request_to_queue, "__wrapped__")
    assert hasattr(SchedulePolicy.calc_priority, "__wrapped__")
    assert get_radix_cache_factory(BACKEND_NAME) is retention_cache_factory


def test_chat_completion_request_keeps_priority_and_custom_params(clock):
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    flat = gateway_custom_params("wf-1", "planner", 3.0, 1250)
    body = {  # what the gateway forwards upstream
        "model": "default", "messages": [{"role": "user", "content": "plan the fix"}],
        "max_tokens": 64, "priority": 1250, "custom_params": flat,
        "app_metadata": {"workflow_type_id": "ca", "workflow_id": "wf-1", "agent_id": "planner"},
        "sys_annotations": {"known": True},
    }
    request = ChatCompletionRequest.model_validate(body)
    assert request.priority == 1250 and request.custom_params == flat
    assert "app_metadata" not in request.model_dump()  # undeclared keys are dropped
    # the same path the server takes into the scheduler
    sp = SamplingParams(**request.to_sampling_params(stop=[], model_generation_config={}))
    req = Req("rid-1", "", array("q", [1, 2, 3]), sp, priority=request.priority)
    assert req.sampling_params.custom_params == flat
    assert admit_request(req)
    assert req.priority == 1250 and admission_of(req).base == pytest.approx(1.25)
    ann = from_custom_params(req.sampling_params.custom_params)
    assert (ann.workflow_id, ann.agent_id, ann.next_agent_id, ann.tool_p95_s) == ("wf-1", "planner", "coder", 2.3)


def _req(rid: str, custom_params: dict | None, priority: int | None):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=16, custom_params=custom_params)
    req = Req(rid, "", array("q", [7, 8, 9, len(rid)]), sp, priority=priority)
    req.time_stats.set_wait_queue_entry_time()
    return req


def test_calc_priority_orders_real_reqs_as_our_priority_says(clock):
    from dataclasses import replace

    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.radix_cache import RadixCache

    # a fast aging rate (0.05 /s) so that 20 s of waiting visibly reorders the queue
    # untagged traffic left to SGLang here (AWP_UNTAGGED=off); the default is tested below
    reset_state(PluginState(replace(get_state().settings, priority=PriorityPolicy(aging_per_s=0.05, remaining_unit="calls",
                                                                                  aging_per_duration=None),
                                    decision_clock="local", age_untagged=False), clock=clock))
    pol = get_state().settings.priority
    # Same small graph as tests/test_policies_priority_capacity.py, computed by the gateway:
    # a = planner (3 left, idle coder 1 call away) 1.25; b = coder (2 left) 1/3; c = tester (0 left) 1.0
    depth = {"planner": 5, "coder": 0, "tester": 3}
    graph = {"a": (3.0, {"coder": 1.0, "tester": 3.0}), "b": (2.0, {"tester": 2.0}), "c": (0.0, {})}
    gateway_priority = {
        rid: pol.to_sglang(pol.score_annotation(Annotation(known=True, expected_remaining_calls=rem, expected_distance=dist), depth))
        for rid, (rem, dist) in graph.items()
    }
    assert gateway_priority == {"a": 1250, "b": 333, "c": 1000}
    # b arrives 20 s before the others; d carries custom_params but no priority (plugin computes
    # 1/(1+1) = 0.5 from exp_remaining_calls); e is plain traffic without annotations.
    clock.t = 1000.0
    reqs = {"b": _req("b", gateway_custom_params("wb", "coder", 2.0, 333), 333)}
    clock.t = 1020.0
    reqs["a"] = _req("a", gateway_custom_params("wa", "planner", 3.0, 1250), 1250)
    reqs["c"] = _req("c", gateway_custom_params("wc", "tester", 0.0, 1000), 1000)
    reqs["d"] = _req("d", gateway_custom_params("wd", "coder", 1.0, None), None)
    reqs["e"] = _req("e", None, None)
    for r in reqs.values():
        r_admitted = admit_request(r, now=clock.t if r.rid != "b" else 1000.0)
        assert r_admitted == (r.rid != "e")
    assert reqs["d"].priority == 500
    reqs["e"].priority = -(2**63)  # what Scheduler._set_or_validate_priority gives a request without one

    policy = SchedulePolicy("fcfs", RadixCache.create_simulated(), False, True, False)
    queue = [reqs[k] for k in "edcba"]
    policy.calc_priority(queue)  # the patched method: ages, then SGLang sorts
    got = [r.rid for r in queue]
    # b: 1/3 + 0.05 * 20 s = 1.333 > a 1.25 > c 1.0 > d 0.5 > e (no annotations)
    expected = pol.order(
        [("a", 1.25, 1020.0), ("b", 1 / 3, 1000.0), ("c", 1.0, 1020.0), ("d", 0.5, 1020.0)], now=1020.0
    )
    assert got == expected + ["e"] == ["b", "a", "c", "d", "e"]
    assert reqs["b"].priority == 1333

    # running requests are re-aged too (preemption compares them with the waiting ones)
    running = SimpleNamespace(reqs=[reqs["c"]])
    clock.t = 1040.0
    policy.calc_priority([reqs["a"]], running)
    assert reqs["c"].priority == 1000 + 1000 and reqs["a"].priority == 1250 + 1000  # +0.05 * 20 s each

    # Without waiting time, plain alg. 3 order: a 1.25, c 1.0, d 0.5, b 0.333
    clock.t = 1000.0
    for r in queue:
        if r.rid != "e":          # e was left to SGLang: no admission record
            admission_of(r).enqueued_at = 1000.0
    policy.calc_priority(queue)
    assert [r.rid for r in queue] == ["a", "c", "d", "b", "e"]


def test_calls_of_one_session_share_the_workflow_priority(clock):
    """Workflow-level aging: a queued call of a session is re-scored from its session's latest
    call (the gateway's ``base + aging · session age``), not from its own arrival."""
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.mem_cache.radix_cache import RadixCache

    from dataclasses import replace

    # one fixed rate for every session (aging per session duration is off here; that rule's
    # plugin/gateway/simulator parity is in tests/test_policy_parity.py)
    reset_state(PluginState(replace(get_state().settings,
                                    priority=PriorityPolicy(aging_per_s=0.001, aging_per_duration=None)),
                            clock=clock))
    pol = get_state().settings.priority
    assert pol.aging_per_s == 0.001
    # session X started 600 s before its call x1 (base 0.2): 0.2 + 0.001 · 600 = 0.8 -> 800;
    # session Y is new (base 0.5, age 0): 500.
    x1 = _req("x1", gateway_custom_params("wX", "coder", 4.0, pol.to_sglang(pol.session_score(0.2, 600))), None)
    y1 = _req("y1", gateway_custom_params("wY", "coder", 1.0, pol.to_sglang(pol.session_score(0.5, 0))), None)
    x1.priority, y1.priority = 800, 500
    admit_request(x1, now=1000.0)
    admit_request(y1, now=1000.0)
    # 20 s later X's next call (base 0.25, the session now 620 s old): 0.25 + 0.62 = 0.87
    clock.t = 1020.0
    x2 = _req("x2", gateway_custom_params("wX", "coder", 3.0, 870), 870)
    admit_request(x2, now=1020.0)
    assert get_state().sessions.reference("wX") == (pytest.approx(0.87), 1020.0)
    policy = SchedulePolicy("fcfs", RadixCache.create_simulated(), False, True, False)
    queue = [y1, x2, x1]
    policy.calc_priority(queue)
    # x1 carries its session's latest score (870), y1 its own aged by 20 s: 500 + 20 = 520
    assert (x1.priority, x2.priority, y1.priority) == (870, 870, 520)
    assert [r.rid for r in queue] == ["x1", "x2", "y1"]     # equal priority: earlier arrival first
    clock.t = 1520.0                                         # every session ages at the same rate
    policy.calc_priority(queue)
    assert (x1.priority, y1.priority) == (870 + 500, 520 + 500)


@pytest.mark.parametrize("value, on", [(None, False), ("", False), ("0", False), ("1", True),
                                       ("true", True), ("yes", True), ("off", False)])
def test_plugin_is_opt_in(monkeypatch, value, on):
    from serving_hooks.sglang_plugin.settings import PluginSettings

    if value is None:
        monkeypatch.delenv("AWP_SGLANG_PLUGIN", raising=False)
    else:
        monkeypatch.setenv("AWP_SGLANG_PLUGIN", value)
    assert PluginSettings.from_env().enabled is on


@pytest.mark.parametrize("value, keep", [(None, False), ("0", False), ("1", True)])
def test_keeping_is_opt_in_and_its_default_is_the_simulators(monkeypatch, value, keep):
    """``AWP_KEEP_IDLE`` unset: the plugin keeps what the simulator's ``ours`` keeps (nothing)."""
    from policies import KeepDropPolicy
    from serving_hooks.sglang_plugin.settings import PluginSettings

    if value is None:
        monkeypatch.delenv("AWP_KEEP_IDLE", raising=False)
    else:
        monkeypatch.setenv("AWP_KEEP_IDLE", value)
    assert PluginSettings.from_env().keep_drop.keep_idle is keep
    if value is None:
        assert keep is KeepDropPolicy().keep_idle


def test_plugin_off_says_so_on_stderr_and_registers_nothing(monkeypatch, capsys):
    """SGLang configures logging after loading plugins: the off line goes to stderr, printed."""
    import serving_hooks.sglang_plugin as plugin

    monkeypatch.delenv("AWP_SGLANG_PLUGIN", raising=False)
    monkeypatch.setattr(plugin, "_registered", False)
    monkeypatch.setattr(plugin, "_announced", False)
    reset_state()
    try:
        plugin.register()
        plugin.register()                  # SGLang loads plugins more than once per process
        assert not plugin._registered
        err = capsys.readouterr().err
        assert err.count("agent-workflow plugin off: AWP_SGLANG_PLUGIN is not 1") == 1
    finally:
        reset_state()


def test_requeued_requests_are_counted_as_preempted_or_retracted(clock):
    """A request admitted before that enters the queue again will be prefilled again."""
    from serving_hooks.sglang_plugin.priority_hooks import before_add_request_to_queue

    sched = SimpleNamespace(tp_size=1, forward_ct=0, server_args=SimpleNamespace(default_priority_value=250))
    req = _req("p", gateway_custom_params("wf-p", "coder", 2.0, 900), 900)
    before_add_request_to_queue(sched, req)                      # first arrival
    admit_request(req)
    before_add_request_to_queue(sched, req)                      # preempted, re-queued
    before_add_request_to_queue(sched, req, is_retracted=True)   # KV pool full, retracted
    counters = get_state().counters
    assert (counters["requeued_preempted"], counters["requeued_retracted"]) == (1, 1)
