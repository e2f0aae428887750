"""The output-length drift alarm surfaced (issue 26 item 5): /metrics of a real sidecar, the
profile root's drift.json listed by `profiler show`, and a refit started by the alarm."""
from __future__ import annotations

import json
import shutil

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from profiler.cli import app
from profiler.commands.serve import refit_loop
from store.profile_artifact import current_version
from store.workloads import generate, write_jsonl
from serving_hooks.refit import RefitLoop
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import DRIFT_FILE, prediction_service
from serving_hooks.sidecar import create_sidecar_app
from tests.serving_helpers import fit_generated_profile, metric, running_gateway, wait_for

WT = "coding_assistant"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("drift"), 60, seed=7, min_calls=20)


@pytest.fixture
def root(fitted, tmp_path):
    """A private copy of the fitted root (the alarm writes into it)."""
    dst = tmp_path / "profile"
    shutil.copytree(fitted, dst)
    return dst


def send(client: httpx.Client, n: int, drift: bool, start: int = 0) -> None:
    """``n`` planner calls annotated and observed: in the middle of the served band, or (drift)
    far above any band (the shadow gate may then hold the type back: ``known: false``)."""
    for i in range(start, start + n):
        meta = {"workflow_type_id": WT, "workflow_id": f"w{i // 5}", "agent_id": "planner"}
        ann = client.post("/v1/annotate", json={"app_metadata": meta, "request_id": f"r{i}"}).json()
        lo, hi = ann["sys_annotations"].get("predicted_output_len") or (0, 0)
        out = 10**7 if drift else (lo + hi) // 2
        client.post("/v1/observe", json={"app_metadata": meta, "request_id": f"r{i}", "output_tokens": out})


def test_alarm_in_metrics_drift_file_and_show_and_quiet_when_in_band(root):
    registry = CollectorRegistry()
    service = prediction_service(root, registry, "profiler_sidecar")
    server = serve_in_thread(create_sidecar_app(service, registry=registry))
    with server, httpx.Client(base_url=server.url) as c:
        send(c, 150, False)                                       # stationary: every output in band
        assert metric(server.url, "profiler_sidecar_output_len_drift_alarm", workflow_type=WT) == 0
        assert metric(server.url, "profiler_sidecar_output_len_fitted_coverage", workflow_type=WT) == 1.0
        assert not (root / DRIFT_FILE).exists()
        send(c, 150, True, start=150)                           # drift: far above every band
        assert metric(server.url, "profiler_sidecar_output_len_drift_alarm", workflow_type=WT) == 1
        assert metric(server.url, "profiler_sidecar_output_len_fitted_coverage", workflow_type=WT) < 0.6
        level = metric(server.url, "profiler_sidecar_output_len_online_level", workflow_type=WT, agent="planner")
        assert 0 < level < 1 - service.predictor.profile.coverage      # calibration widened the band
        shown_profile = c.get("/v1/profile").json()
        assert shown_profile["drift"][WT]["alarm"] is True
        online = shown_profile["online"]                          # the same level, as JSON
        assert online["band"][WT]["planner"]["level"] == pytest.approx(level)
        assert online["band"][WT]["planner"]["outcomes"] == 300
        assert online["remaining_selection"] == {}                # on by default; no session ended
    alarm = json.loads((root / DRIFT_FILE).read_text())["alarms"][WT]
    assert alarm["profile_version"] == current_version(root) and alarm["coverage"] < 0.99
    shown = CliRunner().invoke(app, ["show", "--profile", str(root)])
    assert shown.exit_code == 0
    assert f"drift alarm {WT}: output-length coverage" in " ".join(shown.output.split())


def test_the_keep_alive_level_is_exported_per_type_and_agent(root):
    """Idle gaps scored through a real sidecar (the Predictor's clock injected) show up as
    ``…_keep_alive_online_level{workflow_type,agent}``: a gap inside the served TTL raises the
    planner's level above nominal, one far beyond it lowers it; an agent whose TTL has not yet
    been scored has no sample."""
    now = [0.0]
    registry = CollectorRegistry()
    service = prediction_service(root, registry, "profiler_sidecar", clock=lambda: now[0])
    name = "profiler_sidecar_keep_alive_online_level"
    server = serve_in_thread(create_sidecar_app(service, registry=registry))

    def call(session: str, agent: str, rid: str) -> float:
        meta = {"workflow_type_id": WT, "workflow_id": session, "agent_id": agent}
        ann = c.post("/v1/annotate", json={"app_metadata": meta, "request_id": rid}).json()
        now[0] += 1.0
        c.post("/v1/observe", json={"app_metadata": meta, "request_id": rid, "output_tokens": 100})
        return ann["sys_annotations"]["keep_alive_ttl_s"]

    def samples() -> dict:
        text = httpx.get(server.url + "/metrics").text
        return {(s.labels["workflow_type"], s.labels["agent"]): s.value
                for f in text_string_to_metric_families(text) for s in f.samples if s.name == name}

    with server, httpx.Client(base_url=server.url) as c:
        assert samples() == {}                                      # no idle gap scored yet
        ttl = call("s1", "planner", "a1")
        now[0] += 0.5 * ttl                                         # the next call within the TTL: a hit
        call("s1", "coder", "a2")
        hit = samples()
        assert list(hit) == [(WT, "planner")]                       # the coder's gap is still open
        nominal = 1 - service.predictor.profile.data["idle_gap"]["params"]["quantile"]
        assert hit[(WT, "planner")] == service.predictor.keep_alive_calibrator.status()[WT]["planner"]["level"]
        assert hit[(WT, "planner")] > nominal
        ttl = call("s2", "planner", "b1")
        now[0] += 20 * ttl                                          # far beyond the TTL: a miss
        call("s2", "coder", "b2")
        assert samples()[(WT, "planner")] < hit[(WT, "planner")]
        band = metric(server.url, "profiler_sidecar_output_len_online_level", workflow_type=WT, agent="planner")
        assert 0 < band != samples()[(WT, "planner")]               # the band's level is its own series


def test_a_triggered_refit_runs_at_once_and_at_most_once_per_gap(root, tmp_path):
    clock = [0.0]
    done = []
    loop = RefitLoop(profile_root=root, logs=[tmp_path / "none"], every_s=3600, subprocess=False,
                     on_result=done.append, min_trigger_gap_s=60, clock=lambda: clock[0])
    assert loop.trigger("not started") is False
    loop.start()
    try:
        assert loop.trigger("drift alarm in x") is True
        assert wait_for(lambda: len(done) == 1)
        assert loop.trigger("again too soon") is False
        clock[0] = 61.0
        assert loop.trigger("drift alarm in x") is True
        assert wait_for(lambda: len(done) == 2)
    finally:
        loop.stop()
    assert loop.triggers == ["drift alarm in x", "drift alarm in x"]
    assert all(not r.ran for r in done)                       # no new log file: nothing to refit


@pytest.mark.slow
def test_the_alarm_starts_a_refit_of_a_server_with_logs(root, tmp_path):
    """As `profiler serve --logs DIR` wires it: the alarm starts the refit before its tick."""
    logs = tmp_path / "logs"
    write_jsonl(generate("coding_assistant", 5, seed=99), logs / "new.jsonl")
    registry = CollectorRegistry()
    service = prediction_service(root, registry, "profiler_sidecar")
    loop = refit_loop(root, [logs], "1h", service)
    loop.start()
    server = serve_in_thread(create_sidecar_app(service, registry=registry))
    try:
        with server, httpx.Client(base_url=server.url) as c:
            send(c, 150, True)
            assert wait_for(lambda: service.refit.runs >= 1)
    finally:
        loop.stop()
    assert loop.triggers == [f"output-length drift alarm in {WT}"]
    assert service.refit.last_outcome in ("changed", "unchanged"), service.refit.as_dict()


@pytest.mark.slow
def test_the_gateway_exports_the_alarm_from_the_calls_it_proxies(root, upstream):
    """Calls proxied through the gateway feed the same alarm (their output tokens far above the
    fitted band), and the gateway's /metrics says so. (Each call's text differs: the gateway takes
    a repeated identical call of one session for a retry of the same request.)"""
    with running_gateway([upstream.url], root) as gw:
        for i in range(130):
            r = httpx.post(gw.url + "/v1/chat/completions", headers={"x-fake-tokens": "3000"},
                           json={"model": "m", "messages": [{"role": "user", "content": f"step {i}"}],
                                 "app_metadata": {"workflow_type_id": WT, "workflow_id": f"w{i // 5}",
                                                  "agent_id": "planner"}})
            assert r.status_code == 200
        assert wait_for(lambda: metric(gw.url, "profiler_gateway_output_len_drift_alarm", workflow_type=WT) == 1)
        assert metric(gw.url, "profiler_gateway_output_len_fitted_coverage", workflow_type=WT) < 0.5
