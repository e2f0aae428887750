"""Parity: the benchmarked router and priority book are the deployed ones.

A real simulation (``ours`` on a generated coding-assistant replay, profile fit on its train
split) records every routing event — each call's arrival with its annotation contract and every
completion, at simulated time — and the same sequence is fed to the gateway's
:class:`serving_hooks.routing.CapacityRouter` (injected clock, workers that report zero tokens
of their own: the simulator has no load reports, it counts only what it sent) — once with fresh
reports and once with every report stale (the gateway then judges on its own record, as the
simulator does, and keeps affinity: never round robin). Every decision must be the same replica,
and the routing counters (fallbacks, moved sessions, the recompute they cost and the other
agents' prefixes they leave behind: the per-agent prefix ledger) the same. Likewise the SGLang plugin's priority book (``admit_request`` on
requests carrying the gateway's ``custom_params``) must hold, for every session, the reference
the simulator's ``PriorityScheduler`` holds, and give the same integer priority up to SGLang's
integer transport (±1). The end-of-session signal: the simulator's feed marks calls by the
gateway's rule, and the plugin's keep/drop decision and prefetch cancellation on the gateway's
``custom_params`` are the simulator's.
"""
from __future__ import annotations

import zlib
from dataclasses import replace
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from predictors.contract import Annotation, NextAgent, to_sglang_custom_params
from serving_hooks.dialects import hint_values, render
from policies import (KeepDropPolicy, PrefetchPolicy, PriorityPolicy,
                                    SessionEndRule)
from policies.bookkeeping import CapacityLedger, capacity_request
from policies.capacity import ActiveRequest, CapacityPolicy
from serving_hooks.routing import CapacityRouter, WorkerLoad
from serving_hooks.metrics import prediction_metrics
from serving_hooks.service import PredictionService
from serving_hooks.sglang_plugin.finish import decide_finished
from serving_hooks.sglang_plugin.priority_hooks import admission_of, admit_request, age_queue
from serving_hooks.sglang_plugin.settings import PluginSettings
from serving_hooks.sglang_plugin.state import PluginState, reset_state
from simulator.config import ClusterConfig
from simulator.ours import OursOptions, PriorityScheduler, build_ours
from simulator.runner import arrival_times, prepare
from simulator.engine import Simulator
from simulator.sources import make_predictor

CFG = ClusterConfig(replicas=3, kv_capacity_tokens=40_000)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One simulated run of ``ours`` with its routing and priority events recorded."""
    prep = prepare("coding-assistant", 16, seed=5, n_train=60,
                   profile_dir=tmp_path_factory.mktemp("prof"), cfg=CFG)
    predictor = make_predictor(prep.profile)
    annotate = predictor.annotate_call

    def some_unknown(meta, **kwargs):
        """Every fourth call (by request id) comes back unpredicted, as for an agent the profile
        lacks: both sides then see calls without a prediction inside predicted sessions."""
        ann = annotate(meta, **kwargs)
        if zlib.crc32(str(kwargs.get("request_id")).encode()) % 4 == 0:
            return Annotation(ann.profile_version, False, ann.workflow_type_id, ann.workflow_id,
                              ann.agent_id, reason="unknown_agent")
        return ann

    predictor.annotate_call = some_unknown
    # per-session aging rates (an option; the default's one rate is the special case of a single
    # rate), so the parity below also covers each session's rate on both sides
    policy = build_ours(predictor, "ours-duration-aging")
    router, sched, feed = policy.router, policy.scheduler, policy.parts[0]
    events: list[tuple] = []
    route, finish, issue = router.route, router.on_finish, sched.on_issue

    def recording_route(req):
        r = route(req)
        events.append(("route", router.sim.now, req.idx, req.wf, req.call.input_tokens,
                       feed.annotation(req), str(r)))
        return r

    def recording_finish(req):
        events.append(("finish", router.sim.now, req.idx))
        finish(req)

    def recording_issue(req):
        issue(req)
        events.append(("issue", sched.sim.now, req.wf, feed.annotation(req), sched.priority(req),
                       sched.book.reference(req.wf), sched.book.rate(req.wf)))

    router.route, router.on_finish, sched.on_issue = recording_route, recording_finish, recording_issue
    sim = Simulator(prep.workload, policy, CFG, arrival_times(prep.workload, 0.6, 0))
    sim.run()
    return SimpleNamespace(events=events, router=router, sched=sched, feed=feed)


@pytest.mark.parametrize("reports", ["fresh", "stale"])
def test_gateway_router_decides_like_the_simulator(recorded, reports):
    sim_router = recorded.router
    now = [0.0]
    gateway = CapacityRouter([str(i) for i in range(CFG.replicas)], policy=sim_router.policy,
                             clock=lambda: now[0], drain_window_s=sim_router.drain_window_s,
                             unknown_output_tokens=recorded.feed.global_hi, max_sessions=10**9,
                             stale_after_s=1e-6)
    for w in gateway.workers:   # one report at t = 0: stale from the first decision on
        gateway.note_load(w, WorkerLoad(CFG.kv_capacity_tokens, 0, 0, -1.0, -1.0))
    routes = moved = fallbacks = 0
    for ev in recorded.events:
        if ev[0] == "issue":
            continue
        now[0] = ev[1]
        if reports == "fresh":  # a fresh poll right now: the worker counts nothing of its own
            for w in gateway.workers:
                gateway.note_load(w, WorkerLoad(CFG.kv_capacity_tokens, 0, 0, now[0], now[0]))
        if ev[0] == "finish":
            gateway.on_finish(str(ev[2]))
            continue
        _, t, idx, wf, input_tokens, ann, chosen = ev
        last = gateway.ledger.last_replica(str(wf))
        decision = gateway.decide_annotated(str(idx), str(wf), input_tokens, ann)
        assert decision.worker == chosen, (t, idx, decision)
        assert decision.mode in ("capacity", "fallback")
        routes += 1
        moved += last is not None and last != chosen
        fallbacks += decision.mode == "fallback"
    counts = sim_router.counts
    assert routes == counts["decisions"] > 100
    unknown = sum(1 for ev in recorded.events if ev[0] == "route" and not ev[5].known)
    assert 0 < unknown < routes
    assert moved == counts["moved_sessions"] and fallbacks == counts["fallbacks"]
    m = gateway.metrics()
    assert m["stale"] == (routes if reports == "stale" else 0)
    for key in ("decisions", "fallbacks", "affinity", "moved_sessions", "move_recompute_tokens",
                "move_left_behind_tokens"):
        assert m[key] == counts[key], key
    assert counts["fallbacks"] > 0                 # the replay is not trivially safe everywhere
    assert counts["moved_sessions"] > 0            # the move path is exercised on both sides
    assert counts["move_left_behind_tokens"] > 0   # with other agents' prefixes left behind
    assert counts["affinity"] > 0.5 * routes       # and sessions keep their KV
    assert len({ev[6] for ev in recorded.events if ev[0] == "route"}) == CFG.replicas


def test_one_rule_moves_a_session_only_off_a_replica_unsafe_by_a_margin():
    """The ledger's routing step (both routers call it) by hand: stay home when nothing is safe,
    stay when home overflows by less than the margin, move when it overflows by more, another
    replica is safe and the wait saved exceeds the rebuild; each move counted with its prefix."""
    pol = CapacityPolicy(prefill_s_per_token=1e-3, move_margin=0.1)
    ledger = CapacityLedger(["home", "other"], started_at=0.0)
    req = lambda rid, inp, hi: ActiveRequest(rid, inp, hi, 0.01, "s", (), hi / 2)   # noqa: E731
    first = ledger.place(pol, [ledger.state("home", 1000, 0.0), ledger.state("other", 1000, 0.0)],
                         req("a", 200, 100), 0.0, session="s", request_id="a")
    assert first.replica == "home" and not first.moved          # a tie: the first, a new session
    assert ledger.cached_prefix("s", 500) == 250                 # 200 in + 50 expected out
    ledger.start("busy", "other", ActiveRequest("busy", 600, 300, 0.01), 0.0)
    # home holds a (300 bound) + 700 + 100 > 1000 by 100 (10 %: within the margin); other is not
    # safe either (900 + 800): stays home, a fallback
    p = ledger.place(pol, [ledger.state("home", 1000, 0.0), ledger.state("other", 1000, 0.0)],
                     req("b", 700, 100), 0.0, session="s")
    assert p.replica == "home" and p.affinity and p.fallback
    ledger.finish("busy", 1.0)      # other is empty now (home has no drain rate yet)
    states = [ledger.state("home", 1000, 1.0), ledger.state("other", 1000, 1.0)]
    # overflow 300 + 750 + 50 − 1000 = 100: unsafe, not by more than the margin -> home
    p = ledger.place(pol, states, req("c", 750, 50), 1.0, session="s")
    assert p.replica == "home" and not p.fallback and not p.moved
    # a bigger call overflows by 300 + 900 + 300 − 1000 = 500 > 100; home has no drain rate:
    # expected headroom 1000 − 250 − 1050 < 0, other 1000 − 1050 < 0 -> no fit -> stays
    p = ledger.place(pol, states, req("d", 900, 300), 1.0, session="s")
    assert p.replica == "home"
    # 850 + 50: overflow 200 > 100; home expects 1000 − 250 − 875 < 0, other fits (125 >= 0),
    # gain 125 − (−125) = 250 > 5 % -> moves, its 250-token prefix counted
    p = ledger.place(pol, states, req("e", 850, 50), 1.0, session="s", request_id="e")
    assert p.replica == "other" and p.moved and p.recompute_tokens == 250
    st = ledger.stats.as_dict()
    assert st == {"decisions": 5, "fallbacks": 2, "affinity": 3, "moved_sessions": 1,
                  "move_recompute_tokens": 250, "move_left_behind_tokens": 0}
    assert ledger.last_replica("s") == "other"


def test_the_ledger_keeps_each_agents_prefix_and_costs_a_move_with_those_left_behind():
    """Per-agent prefix ledger: each agent's latest input + E[out] and its replica; a move off
    ``home`` costs the moving call's prefix plus the other agents' prefixes still there, so a
    multi-agent session stays where a one-agent session with the same call would move."""
    pol = CapacityPolicy(prefill_s_per_token=1e-3, move_margin=0.0)
    ledger = CapacityLedger(["home", "other"], started_at=0.0)

    def req(rid, inp, hi, agent):
        return ActiveRequest(rid, inp, hi, 0.01, "s", (), hi / 2, agent)

    for rid, agent, inp in (("p", "planner", 300), ("c", "coder", 200)):
        ledger.place(pol, [ledger.state("home", 10_000, 0.0), ledger.state("other", 10_000, 0.0)],
                     req(rid, inp, 100, agent), 0.0, session="s", request_id=rid)
        ledger.finish(rid, 0.0, released=False)
    assert ledger.last_replica("s") == "home"
    assert ledger.left_behind("s", "home", "coder") == 350          # the planner's 300 + 50
    assert ledger.left_behind("s", "home", "planner") == 250        # the coder's 200 + 50
    assert ledger.left_behind("s", "other", "coder") == 0 and ledger.left_behind("new", "home", None) == 0
    # home fills (a 900-token call elsewhere's bound) and drains at 100 tok/s; other is empty
    ledger.start("busy", "home", ActiveRequest("busy", 900, 300, 0.01), 0.0)
    ledger.start("gone", "home", ActiveRequest("gone", 100, 100, 0.01), 0.0)
    ledger.finish("gone", 2.0)                                      # 150 expected tokens in 2 s
    states = [ledger.state("home", 1000, 2.0), ledger.state("other", 1000, 2.0)]
    # the coder's next call (200 + 100): home expects 1050 + 250 > 1000: waits 300 / 75 = 4 s;
    # own prefix 200 (1 ms/token, 2x: 0.4 s) + the planner's 350 left behind -> 2 x 550 x 1 ms
    # = 1.1 s, x 2 = 2.2 s < 4 s: moves, both counted
    p = ledger.place(pol, states, req("c2", 200, 100, "coder"), 2.0, session="s", request_id="c2")
    assert p.moved and p.recompute_tokens == 200 and p.left_behind_tokens == 350
    assert ledger.stats.move_left_behind_tokens == 350
    assert ledger.left_behind("s", "other", "planner") == 250       # the coder's 200 + 50 now there
    assert ledger.left_behind("s", "home", "coder") == 350          # the planner's is still home
    # a session with 2,000 tokens of other agents at home stays (2 x 2200 ms > 4 s / 2)
    ledger.note_session("t", "home", 200, agent="coder")
    ledger.note_session("t", "home", 2000, agent="reviewer")
    ledger.note_session("t", "home", 200, agent="coder")
    p = ledger.place(pol, states, req("t1", 200, 100, "coder"), 2.0, session="t")
    assert p.replica == "home" and not p.moved
    light = ledger.place(replace(pol, left_behind_weight=0.0), states, req("t2", 200, 100, "coder"),
                         2.0, session="t")
    assert light.moved                                              # the rule before moved it


def _plugin(policy: PriorityPolicy, now: list[float]) -> PluginState:
    settings = replace(PluginSettings.from_env(), priority=policy, decision_clock="local",
                       prefetch_enabled=False, age_untagged=True)
    return reset_state(PluginState(settings, clock=lambda: now[0]))


def _sglang_req(rid: str, ann: Annotation, score: float | None) -> SimpleNamespace:
    """A scheduler request as the gateway sends it: the annotation with its priority ``score``
    (None: no prediction, no priority) rendered by the SGLang dialect — the integer ``priority``
    and the flat ``custom_params`` (which carry the same integer)."""
    return _rendered(f"{rid}", replace(ann, priority=score))


def _rendered(rid: str, ann: Annotation, meta: dict | None = None) -> SimpleNamespace:
    patch = render("sglang", hint_values(ann, meta), {})[0]
    return SimpleNamespace(rid=rid, priority=patch.get("priority"),
                           sampling_params=SimpleNamespace(custom_params=patch["custom_params"]))


def _gateway_service(policy: PriorityPolicy, answers: dict) -> PredictionService:
    """The gateway's in-process annotation path (``PredictionService.annotate_call``: the one
    place a known call's priority is computed) over a predictor that answers the recorded
    annotations with ``priority`` empty, as the facade leaves it."""
    predictor = SimpleNamespace(coverage_monitor=SimpleNamespace(),
                                annotate_call=lambda meta, **kw: replace(answers[kw["request_id"]],
                                                                         priority=None))
    metrics = prediction_metrics(CollectorRegistry(), "parity", lambda: 0.0, lambda: 0, lambda: 0)
    return PredictionService(predictor=predictor, gate=None, metrics=metrics, priority=policy)


def test_gateway_plugin_and_simulator_give_every_call_the_same_priority(recorded):
    """For every call of a real simulated run (annotations of the real predictor, per-session
    aging rates on): the gateway's priority (``PredictionService.annotate_call``) is the float the
    simulator's ``PriorityScheduler`` books for the session (``call_priority`` on the same
    annotation and the same session age); rendered by the SGLang dialect and admitted by the plugin
    (which only applies it), the request's integer priority is the simulator's queue priority, and
    the plugin's session reference is the simulator's up to the integer transport."""
    sched = recorded.sched
    pol = sched.policy
    now = [0.0]
    state = _plugin(pol, now)
    issues = [ev for ev in recorded.events if ev[0] == "issue"]
    assert len(issues) > 100
    service = _gateway_service(pol, {f"r{n}": ev[3] for n, ev in enumerate(issues)})
    rates, known = set(), 0
    for n, (_, t, wf, ann, sim_priority, sim_ref, sim_rate) in enumerate(issues):
        now[0] = t
        meta = {"workflow_type_id": ann.workflow_type_id, "workflow_id": str(wf),
                "agent_id": ann.agent_id}
        sent = service.annotate_call(meta, request_id=f"r{n}")
        assert (sent.priority is not None) == ann.known       # a priority exactly when predicted
        req = _rendered(f"r{n}", replace(sent, workflow_id=str(wf)), meta)
        assert admit_request(req, now=t)
        ref = state.sessions.reference(str(wf))
        assert ref[1] == sim_ref[1], (t, wf)                    # same reference time
        assert ref[0] == pytest.approx(sim_ref[0], abs=0.5 / pol.scale)
        # a predicted call: the same integer; an unpredicted one takes its session's score,
        # which crossed the wire as an integer: ±1
        assert abs(req.priority - sim_priority) <= (0 if ann.known else 1), (t, wf)
        assert state.sessions.rate(str(wf)) == sim_rate         # the same aging rate
        rates.add(sim_rate)
        if ann.known:          # the gateway's float is the simulator's, on the same session age
            known += 1
            sim_age = t - float(sched.sim.wf_arrival[wf])
            assert sent.priority == pytest.approx(pol.call_priority(ann, sim_age), abs=1e-9)
            assert sent.priority == pytest.approx(sim_ref[0], abs=1e-9)
            assert admission_of(req).base == pytest.approx(sent.priority, abs=0.5 / pol.scale)
    assert known > 100 and len(rates) > 1   # sessions of different expected lengths age differently
    reset_state()


def test_an_unknown_call_keeps_its_sessions_score_in_both():
    """Hand-made sequence: known call (2 calls left), unknown call, known call (0 left); in the
    calls unit so the scores are the hand-checkable 1/3 and 1 (the tokens unit is the default and
    falls back to the same remaining calls: covered by the other parity tests)."""
    policy = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001)
    sched = PriorityScheduler(SimpleNamespace(served=lambda req: req.ann), policy)
    sched.sim = SimpleNamespace(now=0.0, wf_arrival=[0.0], pool_queue_depths=lambda: None, pools=None)
    now = [0.0]
    state = _plugin(policy, now)
    known2 = Annotation(known=True, workflow_id="w", expected_remaining_calls=2.0, session_age_s=0.0)
    unknown = Annotation(known=False, workflow_id="w", session_age_s=30.0)
    known0 = Annotation(known=True, workflow_id="w", expected_remaining_calls=0.0, session_age_s=60.0)
    for i, (t, ann) in enumerate(((0.0, known2), (30.0, unknown), (60.0, known0))):
        sched.sim.now = now[0] = t
        req = SimpleNamespace(idx=i, wf=0, t_enqueue=t, ann=ann)
        sched.on_issue(req)
        sim_priority = sched.priority(req)
        plugin_req = _sglang_req(f"u{i}", ann, policy.call_priority(ann) if ann.known else None)
        admit_request(plugin_req, now=t)
        assert plugin_req.priority == sim_priority
        ref, sim_ref = state.sessions.reference("w"), sched.book.reference(0)
        assert ref[1] == sim_ref[1] and ref[0] == pytest.approx(sim_ref[0], abs=1e-3)
    # after the unknown call the session kept 1/3 (aged), it was not reset to unknown_score
    assert sched.book.reference(0) == (pytest.approx(1.0 + policy.aging_per_s * 60), 60.0)
    reset_state()


def test_aging_per_session_duration_is_the_same_in_gateway_plugin_and_simulator():
    """``aging_per_duration``: a short session (expected 125 s in all) ages 8× faster than a long
    one (1000 s) — rates 0.008 and 0.001 /s with k = 1 — and the gateway's priority, the
    plugin's book and re-aging of its queue, and the simulator's scheduler agree on every score."""
    policy = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, aging_per_duration=1.0)
    sched = PriorityScheduler(SimpleNamespace(served=lambda req: req.ann), policy)
    sched.sim = SimpleNamespace(now=0.0, wf_arrival=[0.0, 0.0], pool_queue_depths=lambda: None,
                                pools=None)
    now = [0.0]
    state = _plugin(policy, now)
    gateway = policy.call_priority          # what PredictionService.annotate_call sets
    calls = [(0, 0.0, Annotation(known=True, workflow_id="0", expected_remaining_calls=2.0,
                                 expected_remaining_s=125.0, session_age_s=0.0)),
             (1, 0.0, Annotation(known=True, workflow_id="1", expected_remaining_calls=2.0,
                                 expected_remaining_s=1000.0, session_age_s=0.0)),
             (0, 40.0, Annotation(known=True, workflow_id="0", expected_remaining_calls=1.0,
                                  expected_remaining_s=85.0, session_age_s=40.0))]
    plugin_reqs = []
    for i, (wf, t, ann) in enumerate(calls):
        sched.sim.now = now[0] = t
        req = SimpleNamespace(idx=i, wf=wf, t_enqueue=t, ann=ann)
        sched.on_issue(req)
        assert policy.to_sglang(gateway(ann)) == sched.priority(req)   # what the gateway sends
        assert gateway(ann) == sched.book.reference(wf)[0]      # the same float
        plugin_reqs.append(_sglang_req(f"d{i}", ann, gateway(ann)))
        assert admit_request(plugin_reqs[-1], now=t)
        assert state.sessions.rate(str(wf)) == sched.book.rate(wf)
    assert sched.book.rate(0) == pytest.approx(0.008) and sched.book.rate(1) == pytest.approx(0.001)
    # at t = 40 s session 0 scores 1/2 + 0.008·40 = 0.82, session 1 (1/3 at t = 0) 1/3 + 0.04
    assert sched.book.score(0, 40.0) == pytest.approx(0.82)
    assert sched.book.score(1, 40.0) == pytest.approx(1 / 3 + 0.04)
    for t in (40.0, 300.0, 1000.0):                              # the plugin re-ages its queue
        sched.sim.now = now[0] = t
        age_queue(plugin_reqs, now=t)
        for (wf, _, _), preq in zip(calls, plugin_reqs):
            assert preq.priority == sched.book.priority(wf, t)
    reset_state()


def test_ledger_bookkeeping_by_hand():
    """Drain over the time observed, prompt + bound for an unknown call, last replica, depths."""
    ledger = CapacityLedger(["a", "b"], drain_window_s=60.0, started_at=100.0)
    unknown = capacity_request("u", 108, Annotation(known=False), "s", default_alpha=0.01,
                               unknown_output_tokens=4096)
    assert (unknown.bound_tokens, unknown.alpha, unknown.expected_out) == (108 + 4096, 0.01, 3072.0)
    known = capacity_request("k", 100, Annotation(known=True, predicted_output_len=(10, 90),
                                                  output_len_coverage=0.98), "s", default_alpha=0.01)
    assert (known.bound_tokens, known.alpha, known.expected_out) == (190, pytest.approx(0.01), 50.0)
    ledger.start("u", "a", unknown, 100.0, session="s")
    ledger.start("k", "b", known, 101.0, session="s")
    assert ledger.last_replica("s") == "b" and ledger.bound_tokens() == {"a": 4204, "b": 190}
    assert ledger.unreported_tokens("a", 100.5) == 0 and ledger.unreported_tokens("b", 100.5) == 190
    ledger.finish("u", 110.0)
    assert ledger.drain("a", 120.0) == pytest.approx((108 + 3072) / 20.0)   # 20 s observed, not 60
    assert ledger.drain("a", 200.0) is None                                   # left the window
    ledger.note_queue_depths({"a": 3})
    assert ledger.queue_depths() == {"a": 3}


def test_plugin_gateway_and_simulator_end_sessions_alike(recorded):
    """End of session (issue 24 item 7): the simulator's feed marks each call by the gateway's
    rule (same default threshold), the gateway's SGLang rendering carries the mark to the plugin,
    and the plugin's keep/drop decision on the finished request (``decide_finished``, what
    ``stamp_finished_request`` stamps on the tree) is the simulator's (``KeepDropCache.on_finish``:
    the same ``KeepDropPolicy``)."""
    rule, sim_keep = SessionEndRule(), KeepDropPolicy()
    now = [0.0]
    state = _plugin(recorded.sched.policy, now)
    state.settings = replace(state.settings, keep_drop=sim_keep)
    issues = [ev for ev in recorded.events if ev[0] == "issue"]
    ended = dropped = 0
    for n, (_, t, wf, ann, *_) in enumerate(issues):
        meta = {"workflow_type_id": ann.workflow_type_id, "workflow_id": ann.workflow_id,
                "agent_id": ann.agent_id}
        assert rule.mark(replace(ann, session_end=None), meta) == ann      # gateway's mark = sim's
        ended += ann.session_end is True
        now[0] = t
        sim = sim_keep.decide_annotation(ann, t)
        params = render("sglang", hint_values(ann, meta), {})[0]["custom_params"]
        req = SimpleNamespace(rid=f"e{n}", sampling_params=SimpleNamespace(custom_params=params))
        plugin = decide_finished(state, req, now=t)
        assert plugin.rank == sim.rank and plugin.reason.split()[0] == sim.reason.split()[0], (t, wf)
        dropped += ann.session_end is True and plugin.reason == "session ends"
    assert ended > 0 and dropped == ended        # the rule fired, and every mark released the KV
    assert state.counters["retention_session_end"] == ended
    reset_state()


def test_a_last_call_cancels_its_sessions_prefetch_in_plugin_and_simulator():
    """A session's call plans a host copy for its next agent; the client's last call
    (``app_metadata.last_call``) then plans none and cancels it — in the simulator's
    ``PrefetchPolicy`` (keyed by session) and in the plugin (keyed by request, cancelled by
    session) alike."""
    now = [0.0]
    state = _plugin(PriorityPolicy(), now)
    state.settings = replace(state.settings, prefetch_enabled=True)
    sim = PrefetchPolicy()
    rule = SessionEndRule()
    first = Annotation(known=True, workflow_type_id="t", workflow_id="s", agent_id="planner",
                       next_agents=(NextAgent("coder", 0.9),), p_end=0.05)
    last = Annotation(known=True, workflow_type_id="t", workflow_id="s", agent_id="coder", p_end=0.3)
    for i, (ann, meta_extra) in enumerate(((first, {}), (last, {"last_call": True}))):
        meta = {"workflow_type_id": "t", "workflow_id": "s", "agent_id": ann.agent_id, **meta_extra}
        marked = rule.mark(ann, meta)
        sim.plan("s", float(i), marked.next_agent_id, marked.next_agent_p, float(i) + 5.0, 1000,
                 session="s", session_end=marked.session_end is True)
        params = render("sglang", hint_values(marked, meta), {})[0]["custom_params"]
        req = SimpleNamespace(rid=f"p{i}", priority=None, origin_input_ids=list(range(1000)),
                              sampling_params=SimpleNamespace(custom_params=params))
        admit_request(req, now=float(i))
        assert sim.pending() == state.prefetch.pending() == (1 if i == 0 else 0)
    assert state.counters["prefetch_cancelled_session_end"] == 1
    reset_state()


def _priorities_alike(policy: PriorityPolicy, wf_arrival: list[float],
                      calls: list[tuple]) -> tuple[list[int], list[int], list[Annotation]]:
    """Drive the simulator's queue and the plugin's admission with the same calls ``(wf, t,
    remaining calls[, remaining seconds])``, the plugin admitting what the gateway would send
    (``policy.call_priority``); each session's aging reference must agree. Returns (simulator
    priorities, plugin priorities, annotations)."""
    sched = PriorityScheduler(SimpleNamespace(served=lambda req: req.ann), policy)
    sched.sim = SimpleNamespace(now=0.0, wf_arrival=wf_arrival, pool_queue_depths=lambda: None, pools=None)
    now = [0.0]
    state = _plugin(policy, now)
    sim_prio, plugin_prio, anns = [], [], []
    for i, (wf, t, left, *left_s) in enumerate(calls):
        sched.sim.now = now[0] = t
        ann = Annotation(known=True, workflow_id=str(wf), expected_remaining_calls=left,
                         expected_remaining_s=left_s[0] if left_s else None, session_age_s=t - wf_arrival[wf])
        anns.append(ann)
        req = SimpleNamespace(idx=i, wf=wf, t_enqueue=t, ann=ann)
        sched.on_issue(req)
        sim_prio.append(sched.priority(req))
        preq = _sglang_req(f"c{i}", ann, policy.call_priority(ann))   # what the gateway sends
        assert admit_request(preq, now=t)
        plugin_prio.append(preq.priority)
        assert state.sessions.reference(str(wf))[0] == pytest.approx(sched.book.reference(wf)[0],
                                                                      abs=0.5 / policy.scale)
    return sim_prio, plugin_prio, anns


def test_remaining_cap_ranks_long_sessions_by_start_alike_in_gateway_plugin_and_simulator():
    """``remaining_cap``: two long sessions (10 and 50 expected calls left, cap 4) get the same
    base, 1/5, so the older one (started at 0 s) runs before the younger (started at 20 s) in the
    gateway's priority, the plugin's admitted integer and the simulator's queue alike; a session
    under the cap (1 call left, started last) still passes both."""
    policy = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, remaining_cap=4.0)
    assert policy.base_score(10.0) == policy.base_score(50.0) == pytest.approx(0.2)
    calls = [(0, 40.0, 50.0), (1, 40.0, 10.0), (2, 40.0, 1.0)]    # (wf, t, remaining calls)
    sim_prio, plugin_prio, _ = _priorities_alike(policy, [0.0, 20.0, 30.0], calls)
    assert sim_prio == plugin_prio
    assert sim_prio[2] > sim_prio[0] > sim_prio[1]    # short first, then the long ones by start
    uncapped = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001)
    assert uncapped.call_priority(Annotation(known=True, expected_remaining_calls=50.0,
                                             session_age_s=40.0)) \
        < uncapped.call_priority(Annotation(known=True, expected_remaining_calls=10.0,
                                            session_age_s=20.0))  # without the cap: longest last
    reset_state()


@pytest.mark.parametrize("by_start", [False, True])
def test_slowdown_bound_ranks_overdue_sessions_first_alike_in_gateway_plugin_and_simulator(by_start):
    """``slowdown_bound`` 2: at 300 s the session started at 0 s (100 s of expected work left,
    50 calls) and the one started at 50 s (60 s left, 5 calls) are older than twice what they
    still need: both overdue, lifted by ``w1 + overdue_boost`` = 2 above the two within their
    bound (which keep the calls key: 1 call left before 50). Among the overdue the key orders
    them (5 calls left first), or with ``overdue_by_start`` their start (the older first). The
    gateway's priority, the plugin's admitted integer and the simulator's queue agree; without
    the bound the oldest runs last."""
    policy = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, slowdown_bound=2.0,
                            overdue_by_start=by_start)
    # (wf, t, remaining calls, remaining seconds)
    calls = [(0, 300.0, 50.0, 100.0), (1, 300.0, 1.0, 30.0), (2, 300.0, 50.0, 150.0), (3, 300.0, 5.0, 60.0)]
    sim_prio, plugin_prio, anns = _priorities_alike(policy, [0.0, 250.0, 100.0, 50.0], calls)
    assert sim_prio == plugin_prio
    assert [policy.overdue(a, a.session_age_s) for a in anns] == [True, False, False, True]
    overdue = [0, 3] if by_start else [3, 0]
    assert sim_prio[overdue[0]] > sim_prio[overdue[1]] > sim_prio[1] > sim_prio[2]
    unbounded = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001)
    assert unbounded.call_priority(anns[0]) < unbounded.call_priority(anns[1])
    reset_state()


def _forward_section(c_loop: float, c_tree: float) -> dict:
    """A profile's ``remaining_tokens`` section by hand: type ``loop`` and type ``tree``, each
    with its served candidate's forward C-index, and ``flat`` with no forward evidence."""
    def entry(mean_r: float, mean_out: float) -> dict:
        return {"keys": {"": [100, mean_r, mean_r, 2 * mean_r]}, "mean_out": mean_out}
    return {"workflow_types": {"loop": entry(4000.0, 200.0), "tree": entry(900.0, 300.0),
                               "flat": entry(500.0, 100.0)},
            "selection": {"loop": {"forward": {"served": "fitted", "c_index": {"fitted": c_loop, "mrl": 0.6}}},
                          "tree": {"forward": {"served": "mrl", "c_index": {"fitted": 0.4, "mrl": c_tree}}},
                          "flat": {"reason": "8 workflows: too few to validate"}}}


def test_start_ranked_types_are_those_whose_served_order_has_no_forward_skill():
    """Only a type with forward evidence at or under the bound is ranked by start, with its
    type-level mean remaining work (``R̄`` tokens, ``R̄ / m̄ − 1`` calls); the served candidate's
    C-index is the one read (``tree`` serves ``mrl`` at 0.7 although its fitted table is at 0.4)."""
    from policies.priority import start_ranked_types
    section = _forward_section(0.48, 0.7)
    assert start_ranked_types(section, 0.5) == {"loop": (19.0, 4000.0)}
    assert start_ranked_types(section, 0.45) == {}
    assert set(start_ranked_types(section, 0.7)) == {"loop", "tree"}       # at the bound: no skill
    off = PriorityPolicy()
    assert off.for_profile({"remaining_tokens": section}) is off            # off by default
    bound = PriorityPolicy(rank_skill_min=0.5).for_profile({"remaining_tokens": section})
    assert bound.start_ranked == (("loop", 19.0, 4000.0),)
    assert bound.for_profile({}).start_ranked == ()                         # no section: none


def test_a_type_without_skill_is_ranked_by_start_alike_in_gateway_plugin_and_simulator():
    """``rank_skill_min`` 0.5 on a profile whose ``loop`` type reached forward C 0.48: the two
    ``loop`` sessions (2 and 30 expected calls left) get one base, so the older runs first, while
    the ``tree`` sessions keep the remaining-work order (1 call left before 10). The simulator's
    ``ours`` binds the policy to its predictor's profile as the gateway's service does for the
    version it serves; the gateway's float, the plugin's admitted integer and the simulator's queue
    agree, and the unbound policy ranks the younger ``loop`` session first."""
    profile = SimpleNamespace(data={"remaining_tokens": _forward_section(0.48, 0.7)})
    policy = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, rank_skill_min=0.5)
    calls = [(0, "loop", 30.0, 0.0), (1, "loop", 2.0, 10.0), (2, "tree", 10.0, 0.0), (3, "tree", 1.0, 10.0)]
    anns = {f"s{i}": Annotation(known=True, workflow_type_id=wt, workflow_id=str(wf),
                                expected_remaining_calls=left, session_age_s=50.0 - start)
            for i, (wf, wt, left, start) in enumerate(calls)}
    service = _gateway_service(policy, anns)
    service.predictor.version, service.predictor.profile = "v1", profile
    predictor = SimpleNamespace(profile=profile, clock=None, annotate_call=None, observe=None)
    sched = build_ours(predictor, "ours", OursOptions(priority_policy=policy)).scheduler
    assert sched.policy.start_ranked == service.bound_priority().start_ranked == (("loop", 19.0, 4000.0),)
    sched.sim = SimpleNamespace(now=50.0, wf_arrival=[c[3] for c in calls], pool_queue_depths=lambda: None,
                                pools=None)
    now = [50.0]
    state = _plugin(sched.policy, now)
    sim_prio, plugin_prio = [], []
    for i, (wf, wt, _, _) in enumerate(calls):
        sent = service.annotate_call({"workflow_type_id": wt, "workflow_id": str(wf)}, request_id=f"s{i}")
        req = SimpleNamespace(idx=i, wf=wf, t_enqueue=50.0, pred=SimpleNamespace(ann=anns[f"s{i}"]))
        sched.on_issue(req)
        assert sent.priority == pytest.approx(sched.book.reference(wf)[0], abs=1e-12)
        preq = _sglang_req(f"s{i}", anns[f"s{i}"], sent.priority)
        assert admit_request(preq, now=50.0)
        sim_prio.append(sched.priority(req))
        plugin_prio.append(preq.priority)
    assert sim_prio == plugin_prio
    assert sim_prio[0] > sim_prio[1]            # loop: the older first, whatever its remaining calls
    assert sim_prio[3] > sim_prio[2]            # tree: fewest remaining calls first
    unbound = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001)
    assert unbound.call_priority(anns["s1"]) > unbound.call_priority(anns["s0"])
    # a new profile version without the evidence: the service rebinds, nothing ranked by start
    service.predictor.version, service.predictor.profile = "v2", SimpleNamespace(data={})
    assert service.bound_priority().start_ranked == ()
    reset_state()


def test_monotone_keeps_a_sessions_rank_from_falling_alike_in_plugin_and_simulator():
    """``monotone``: session 0 (started at 0 s) expects 5 calls left at 10 s, then 20 at 40 s (it
    outlived the expectation: a heavy tail); session 1 (started at 20 s) expects 8 at 40 s. The
    simulator's queue and the plugin's book (both a ``SessionPriorityBook``) keep session 0 at
    its earlier 1/6, aged, so it stays ahead; without ``monotone`` its new 1/21 puts it behind."""
    calls = [(0, 10.0, 5.0), (0, 40.0, 20.0), (1, 40.0, 8.0)]
    mono = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001, monotone=True)
    sim_prio, plugin_prio, _ = _priorities_alike(mono, [0.0, 20.0], calls)
    assert sim_prio == plugin_prio
    assert sim_prio[1] == mono.to_sglang(1 / 6 + 0.001 * 40)        # the earlier score, aged
    assert sim_prio[1] > sim_prio[2]
    plain = PriorityPolicy(remaining_unit="calls", aging_per_s=0.001)
    sim_plain, plugin_plain, _ = _priorities_alike(plain, [0.0, 20.0], calls)
    assert sim_plain == plugin_plain and sim_plain[1] < sim_plain[2]
    reset_state()


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """One simulated run of ``ours`` with the relative guard on (``oldest_share`` 0.25, so a
    small replay lifts sessions), each call's issue and finish recorded with the simulator's
    book after it: every session's reference and which sessions it lifts."""
    prep = prepare("coding-assistant", 16, seed=5, n_train=60,
                   profile_dir=tmp_path_factory.mktemp("prof"), cfg=CFG)
    opts = OursOptions(priority_policy=PriorityPolicy(oldest_share=0.25, live_window_s=60.0))
    policy = build_ours(make_predictor(prep.profile), "ours", opts)
    sched, feed = policy.scheduler, policy.parts[0]
    events: list[tuple] = []
    issue, finish = sched.on_issue, sched.on_finish

    def snapshot():
        book = sched.book
        return dict(book.references()), {wf for wf in book.references() if book.lifted(wf)}

    def recording_issue(req):
        issue(req)
        ann = feed.annotation(req)
        events.append(("issue", sched.sim.now, req.wf, ann, sched.sim.now - float(sched.sim.wf_arrival[req.wf]),
                       sched.priority(req), *snapshot()))

    def recording_finish(req):
        finish(req)
        events.append(("finish", sched.sim.now, req.wf, feed.annotation(req), None, None, *snapshot()))

    sched.on_issue, sched.on_finish = recording_issue, recording_finish
    sim = Simulator(prep.workload, policy, CFG, arrival_times(prep.workload, 0.6, 0))
    sim.run()
    return SimpleNamespace(events=events, sched=sched)


def test_the_relative_guard_lifts_the_same_sessions_in_plugin_and_simulator(guarded):
    """``oldest_share``: the SGLang plugin, fed the simulated run's calls as the gateway renders
    them (``admit_request`` at issue, ``decide_finished`` at finish, the ``session_end`` mark in
    ``custom_params``), keeps the same live set as the simulator's ``PriorityScheduler``: after
    every event it lifts the same sessions, every session's reference is the simulator's (the
    lifted ones ``(lifted_score, start)``), and an admitted call's integer priority is the
    simulator's queue priority. The run lifts sessions, drops them again and ends sessions."""
    pol = guarded.sched.policy
    now = [0.0]
    state = _plugin(pol, now)
    lifted_ever, dropped, ends = set(), 0, 0
    before: set = set()
    for n, (kind, t, wf, ann, age, sim_priority, sim_refs, sim_lifted) in enumerate(guarded.events):
        now[0] = t
        meta = {"workflow_type_id": ann.workflow_type_id, "workflow_id": str(wf),
                "agent_id": ann.agent_id}
        if kind == "issue":
            sent = replace(ann, workflow_id=str(wf), session_age_s=age,
                           priority=pol.call_priority(ann, age) if ann.known else None)
            req = _rendered(f"g{n}", sent, meta)
            assert admit_request(req, now=t)
            assert req.priority == sim_priority, (t, wf)
        else:
            params = render("sglang", hint_values(replace(ann, workflow_id=str(wf)), meta), {})[0]["custom_params"]
            decide_finished(state, SimpleNamespace(rid=f"f{n}", sampling_params=SimpleNamespace(
                custom_params=params)), now=t)
            ends += ann.session_end is True
        plugin_lifted = {int(s) for s in state.sessions.references() if state.sessions.lifted(s)}
        assert plugin_lifted == sim_lifted, (kind, t, wf)
        for w in sim_lifted:
            assert state.sessions.reference(str(w)) == (pol.lifted_score(), pytest.approx(sim_refs[w][1]))
        ref = state.sessions.reference(str(wf))
        assert ref[0] == pytest.approx(sim_refs[wf][0], abs=0.5 / pol.scale) and ref[1] == pytest.approx(sim_refs[wf][1])
        lifted_ever |= sim_lifted
        dropped += len(before - sim_lifted)
        before = sim_lifted
    assert len(lifted_ever) >= 3 and dropped >= 3 and ends > 0
    reset_state()
