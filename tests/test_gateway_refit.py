"""Online learning through the gateway: refit from its own logs, shadow mode, live profile swaps."""
from __future__ import annotations

import threading

import httpx
import pytest

from store.profile_artifact import load_profile
from store.workloads import generate, write_jsonl
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.refit import RefitLoop, refit_once
from serving_hooks.settings import parse_duration
from serving_hooks.shadow import ShadowGate
from tests.serving_helpers import (fit_generated_profile, logged, running_gateway,
                                   swap_profiles_under_load, wait_for)

NEW = "triage_bot"
FLOW = ["intake", "classifier", "responder"]


def fit_root(tmp_path):
    return fit_generated_profile(tmp_path, 40, seed=11, coverage=0.8, min_calls=5)


def run_session(url: str, upstream: FakeOpenAI, wf: str, tokens: int = 8) -> list[dict]:
    """One triage_bot session through the gateway; the annotations the upstream received."""
    seen = []
    for agent in FLOW:
        r = httpx.post(url + "/v1/chat/completions", headers={"x-fake-tokens": str(tokens)},
                       json={"model": "m", "messages": [{"role": "user", "content": agent}],
                             "app_metadata": {"workflow_type_id": NEW, "workflow_id": wf, "agent_id": agent}})
        assert r.status_code == 200
        seen.append(upstream.received[-1].body["sys_annotations"])
    return seen


@pytest.mark.slow
def test_new_workflow_type_is_shadowed_until_promoted_then_drift_demotes(upstream, tmp_path):
    root = fit_root(tmp_path)
    logs = tmp_path / "gateway-logs"
    gate = ShadowGate(min_calls=20, window=12, min_window=12, drift_drop=0.2, recover_drop=0.05)
    with running_gateway([upstream.url], root, log_dir=logs, gate=gate) as gw:
        service = gw.service
        # 1. unknown to the profile: served reactively, logged, and marked for shadowing
        for i in range(10):
            assert {a["reason"] for a in run_session(gw.url, upstream, f"a{i}")} == {"unknown_workflow_type"}
        assert gate.reason(NEW) == "new_workflow_type"
        # 2. online refit from the gateway's own log (closed files only), atomic swap
        assert wait_for(lambda: logged(gw) == 30)
        gw.log.rotate()
        result = refit_once(root, [logs])
        assert result.ran and result.changed and result.loaded == 30, result
        assert service.reload() and service.predictor.version == result.version
        assert load_profile(root).data["workflow_types"][NEW]["calls"] == 30
        # 3. in the profile now, but still shadow: known false while its live coverage is judged
        first = run_session(gw.url, upstream, "b0")
        assert {a["reason"] for a in first} == {"shadow"} and first[0]["detail"] == "new_workflow_type"
        for i in range(1, 4):
            run_session(gw.url, upstream, f"b{i}")          # 12 observed calls, all inside the band
        assert wait_for(lambda: not gate.is_shadowed(NEW))
        promoted = run_session(gw.url, upstream, "c0")
        assert all(a["known"] for a in promoted), promoted
        assert promoted[0]["next_agents"][0]["agent_id"] == "classifier"
        assert promoted[0]["predicted_output_len"] == [8, 8]
        # 4. outputs drift far outside the band: back to shadow
        for i in range(4):
            run_session(gw.url, upstream, f"d{i}", tokens=400)
        assert wait_for(lambda: gate.reason(NEW) == "drift")
        assert run_session(gw.url, upstream, "e0")[0]["reason"] == "shadow"
        summary = httpx.get(gw.url + "/admin/profile").json()["shadow"][NEW]
        assert summary["shadowed"] and summary["promotions"] == 1 and summary["live_coverage"] < 0.8


@pytest.mark.slow
def test_profile_swapped_during_a_stream_of_gateway_requests(upstream, tmp_path):
    root = fit_root(tmp_path)
    base = load_profile(root)
    statuses: list[int] = []
    versions: list[str] = []

    def send(c: httpx.Client, wf: str) -> None:
        r = c.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "x"}],
            "app_metadata": {"workflow_type_id": "coding_assistant", "workflow_id": wf,
                             "agent_id": "planner"}})
        statuses.append(r.status_code)
        versions.append(upstream.received[-1].body.get("sys_annotations", {}).get("profile_version"))

    with running_gateway([upstream.url], root, gate=ShadowGate(), reload_every_s=0.02) as gw:
        written = swap_profiles_under_load(gw.url, root, base, gw.service.predictor, send)
    assert len(statuses) > 30 and set(statuses) == {200}
    assert base.version in versions and written[-1] in versions and None not in versions


@pytest.mark.slow
def test_refit_loop_and_durations(tmp_path):
    assert parse_duration("10m") == 600 and parse_duration("250ms") == 0.25 and parse_duration(3) == 3
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("ten minutes")
    root = fit_root(tmp_path)
    logs = tmp_path / "more"
    logs.mkdir()
    results = []
    changed_event = threading.Event()

    def on_result(r):
        results.append(r)
        if r.changed:
            changed_event.set()

    loop = RefitLoop(profile_root=root, logs=[logs], every_s=0.1, subprocess=False, on_result=on_result)
    assert loop.run_once().ran is False                         # nothing new: no fit at all
    write_jsonl(generate("deep_research", 10, seed=2), logs / "dr.jsonl")
    (logs / "half.jsonl.open").write_text('{"request_id": "half')   # an open gateway file: ignored
    loop.start()
    assert changed_event.wait(300)   # an event, not a deadline race: a slow fit only takes longer
    loop.stop()
    changed = [r for r in results if r.changed]
    assert changed and changed[0].quarantined == 0 and changed[0].error is None
    assert "deep_research" in load_profile(root).data["workflow_types"]
