"""Latency classes: interactive when the profile saw a person's turn in the workflow type (or the
client says so), batch otherwise; ranked above batch by the one priority policy; rendered in
every dialect; the interactive generator marks the person's turns."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from predictors.contract import Annotation
from predictors.predictor import Predictor
from serving_hooks.dialects import hint_values, render
from policies.priority import PriorityPolicy
from simulator.sources import fit_train_profile
from store.workloads import generate, load_spec


def _records(spec: str, n: int, seed: int) -> list[dict]:
    return list(generate(load_spec(spec), n, seed=seed, arrival_rate=1.0))


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    """A real profile fit on interactive coding sessions (person's turns marked) and a batch
    workload without any."""
    recs = _records("codex_interactive", 30, 1) + _records("agent_user", 30, 2)
    profile, _ = fit_train_profile(recs, tmp_path_factory.mktemp("prof"))
    assert set(profile.data["human_wait"]) == {"codex"}
    return Predictor(profile)


def _meta(wt: str, wf: str, agent: str, **extra) -> dict:
    return {"workflow_type_id": wt, "workflow_id": wf, "agent_id": agent, **extra}


def test_generator_marks_each_turn_but_the_last_as_a_human_wait():
    recs = _records("claude_code_interactive", 40, 3)
    by_wf: dict[str, list[dict]] = {}
    for r in recs:
        by_wf.setdefault(r["workflow_id"], []).append(r)
    waits = []
    for calls in by_wf.values():
        assert "wait_after" not in calls[-1]                 # the session's end is no turn
        for a, b in zip(calls, calls[1:]):
            gap = b["t_arrival"] - a["t_finish"]
            if a.get("wait_after") == "human":
                waits.append(gap)
            else:
                assert a["tool_calls"] and gap < 60
        assert [c["input_tokens"] for c in calls] == sorted(c["input_tokens"] for c in calls)
    assert len(waits) > 20
    assert 2.0 <= min(waits) and max(waits) <= 600.0
    assert 20 < np.median(waits) < 150                      # around the fixtures' 57.4 s


def test_class_from_the_profile_and_from_the_client(predictor):
    inter = predictor.annotate_call(_meta("codex", "s1", "main"), request_id="r1")
    batch = predictor.annotate_call(_meta("airline_support", "s2", "user"), request_id="r2")
    assert inter.known and inter.latency_class == "interactive"
    assert batch.known and batch.latency_class == "batch"
    declared = predictor.annotate_call(_meta("airline_support", "s3", "user", latency_class="Interactive"),
                                       request_id="r3")
    assert declared.latency_class == "interactive"
    down = predictor.annotate_call(_meta("codex", "s4", "main", latency_class="batch"), request_id="r4")
    assert down.latency_class == "batch"
    unknown = predictor.annotate_call(_meta("never_seen", "s5", "a"), request_id="r5")
    assert not unknown.known and unknown.latency_class is None
    # a client's unknown word is ignored: the profile decides
    odd = predictor.annotate_call(_meta("codex", "s6", "main", latency_class="urgent"), request_id="r6")
    assert odd.latency_class == "interactive"


def test_interactive_outranks_batch_by_the_boost(predictor):
    a = predictor.annotate_call(_meta("airline_support", "s7", "user"), request_id="r7")
    b = predictor.annotate_call(_meta("airline_support", "s8", "user", latency_class="interactive"),
                                request_id="r8")
    pol = PriorityPolicy()
    assert pol.call_priority(b) - pol.call_priority(a) == pytest.approx(pol.interactive_boost)
    assert pol.class_term("batch") == pol.class_term(None) == 0.0
    flat = PriorityPolicy(interactive_boost=0.0)
    assert flat.call_priority(b) == flat.call_priority(a)


def test_class_is_rendered_in_each_dialect(predictor):
    ann = predictor.annotate_call(_meta("codex", "s9", "main"), request_id="r9")
    ann = replace(ann, priority=PriorityPolicy().call_priority(ann))
    v = hint_values(ann)
    sg, _ = render("sglang", v, {})
    prio = ann.sglang_priority()
    assert sg["custom_params"]["latency_class"] == "interactive" and sg["priority"] == prio
    vl, _ = render("vllm", v, {})
    assert vl["vllm_xargs"]["latency_class"] == "interactive" and vl["priority"] == -prio
    _, headers = render("headers", v, {})
    assert headers["X-Agentprof-Latency-Class"] == "interactive"
    assert Annotation.from_dict(ann.to_dict()).latency_class == "interactive"


def test_overtake_window_bounds_who_may_pass_a_session():
    """The stated guarantee: under the calls key, a session is never ranked below one of its class
    that started more than ``overtake_window_s`` later, at any time both wait."""
    pol = PriorityPolicy()
    window = pol.overtake_window_s()
    assert window == pytest.approx(1.0 / pol.aging_per_s)
    rng = np.random.default_rng(0)
    for _ in range(2000):
        r_old, r_new = rng.uniform(0, 200, 2)              # expected remaining calls
        t_old = rng.uniform(0, 1e4)
        t_new = t_old + window * (1 + rng.uniform(1e-6, 2))
        now = t_new + rng.uniform(0, 1e4)
        old = pol.aged(pol.base_score(r_old), t_old, now)
        new = pol.aged(pol.base_score(r_new), t_new, now)
        assert pol.to_sglang(old) >= pol.to_sglang(new)
    # inside the window a session closer to done may pass: the remaining-work order
    assert pol.aged(pol.base_score(0), 10.0, 20.0) > pol.aged(pol.base_score(50), 0.0, 20.0)


def test_class_rule_is_the_same_in_gateway_plugin_and_simulator():
    """Parity over the class rule: an interactive and a batch session with the same remaining work
    get the gateway's priority (``call_priority``, rendered by the SGLang dialect), the simulator's
    scheduler priority and the plugin's admitted priority alike; the interactive one is ahead by
    the boost."""
    from types import SimpleNamespace

    from serving_hooks.sglang_plugin.priority_hooks import admit_request
    from serving_hooks.sglang_plugin.settings import PluginSettings
    from serving_hooks.sglang_plugin.state import PluginState, reset_state
    from simulator.ours import PriorityScheduler

    policy = PriorityPolicy()
    sched = PriorityScheduler(SimpleNamespace(served=lambda req: req.ann), policy)
    sched.sim = SimpleNamespace(now=5.0, wf_arrival=[0.0, 0.0], pool_queue_depths=lambda: None, pools=None)
    settings = replace(PluginSettings.from_env(), priority=policy, decision_clock="local",
                       prefetch_enabled=False, age_untagged=True)
    reset_state(PluginState(settings, clock=lambda: 5.0))
    got = {}
    for wf, cls in enumerate(("interactive", "batch")):
        ann = Annotation(known=True, workflow_id=f"w{wf}", expected_remaining_calls=3.0,
                         session_age_s=5.0, latency_class=cls)
        req = SimpleNamespace(idx=wf, wf=wf, t_enqueue=5.0, ann=ann)
        sched.on_issue(req)
        sent = replace(ann, priority=policy.call_priority(ann))          # the gateway's
        patch, _ = render("sglang", hint_values(sent), {})
        assert sched.priority(req) == patch["priority"]
        plugin_req = SimpleNamespace(rid=f"r{wf}", priority=patch["priority"],
                                     sampling_params=SimpleNamespace(custom_params=patch["custom_params"]))
        admit_request(plugin_req, now=5.0)
        assert plugin_req.priority == patch["priority"]
        # a request whose custom_params carry no priority: the plugin computes the same one
        bare = {k: v for k, v in patch["custom_params"].items() if k != "priority"}
        own = SimpleNamespace(rid=f"o{wf}", priority=None, sampling_params=SimpleNamespace(custom_params=bare))
        admit_request(own, now=5.0)
        assert own.priority == patch["priority"]
        got[cls] = patch["priority"]
    assert got["interactive"] - got["batch"] == policy.to_sglang(policy.interactive_boost)
    reset_state()
