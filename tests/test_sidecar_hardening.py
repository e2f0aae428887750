"""The sidecar's limits on a real port: auth on data endpoints, batch cap, bounded memory,
visible refit failures."""
from __future__ import annotations

import sys

import httpx
import pytest
from prometheus_client import CollectorRegistry

from predictors.predictor import Predictor, SESSION_BASE_BYTES
from serving_hooks.refit import RefitLoop
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.shadow import ShadowGate
from serving_hooks.sidecar import MAX_BATCH, create_sidecar_app
from tests.serving_helpers import fit_generated_profile, metric

WT = "coding_assistant"
TOKEN = {"Authorization": "Bearer s3cret"}


def meta(wf: str, agent: str = "planner", wt: str = WT) -> dict:
    return {"workflow_type_id": wt, "workflow_id": wf, "agent_id": agent}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("sch"), 30, seed=7, min_calls=10)


def sidecar(profile, gate=None, **predictor_kwargs):
    registry = CollectorRegistry()
    service = prediction_service(profile, registry, "profiler_sidecar", gate=gate, reload_every_s=0,
                                 **predictor_kwargs)
    return service, registry


def test_session_contents_and_profile_need_the_token(profile_root):
    service, registry = sidecar(profile_root)
    app = create_sidecar_app(service, registry=registry, admin_token="s3cret")
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as c:
        assert c.post("/v1/annotate", json={"app_metadata": meta("w1"), "request_id": "r1"}).status_code == 200
        assert c.post("/v1/observe", headers=TOKEN, json={
            "app_metadata": meta("w1"), "request_id": "r1", "output_tokens": 5,
            "response_text": "the secret answer"}).status_code == 200
        for path in (f"/v1/sessions/{WT}/w1", "/v1/profile"):
            denied = c.get(path)
            assert denied.status_code == 401 and "secret answer" not in denied.text
            assert c.get(path, headers={"Authorization": "Bearer wrong"}).status_code == 401
        view = c.get(f"/v1/sessions/{WT}/w1", headers=TOKEN).json()
        assert view["recent"][0]["response_text"] == "the secret answer"
        assert c.get("/v1/profile", headers=TOKEN).json()["memory"]["sessions"] == 1
        health = c.get("/healthz").json()               # open, and holds no path
        assert health["sessions"] == 1 and "path" not in health


def test_batch_is_capped(profile_root):
    service, registry = sidecar(profile_root)
    app = create_sidecar_app(service, registry=registry)
    item = {"app_metadata": meta("b"), "advance": False}
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as c:
        ok = c.post("/v1/annotate:batch", json={"requests": [item] * MAX_BATCH})
        assert ok.status_code == 200 and len(ok.json()["results"]) == MAX_BATCH
        assert c.post("/v1/annotate:batch", json={"requests": [item] * (MAX_BATCH + 1)}).status_code == 422
        assert c.post("/v1/annotate:batch", json={"requests": [item] * 4096}).status_code == 422


def test_sessions_bounded_by_bytes_texts_first():
    text = "y" * 60_000
    limit = 10 * (SESSION_BASE_BYTES + 1000) + 4 * 60_500   # ten bare sessions, ~four texts
    p = Predictor(None, max_session_bytes=limit)
    for i in range(10):
        m = meta(f"w{i}", wt="free")
        p.annotate(m, request_id=f"r{i}")
        p.observe({"app_metadata": m, "request_id": f"r{i}", "output_tokens": 3,
                   "response_text": text + str(i)})
    st = p.memory_stats()
    assert st["sessions"] == 10 and st["evicted"]["bytes"] == 0    # state kept, texts dropped
    assert st["session_bytes"] <= limit and st["texts_dropped"] >= 6
    assert p.session_view("free", "w9")["recent"]          # the newest text survives
    assert not p.session_view("free", "w0")["recent"]
    small = Predictor(None, max_session_bytes=5 * SESSION_BASE_BYTES + 500)
    for i in range(20):
        small.annotate(meta(f"v{i}", wt="free"))
    st = small.memory_stats()
    assert st["sessions"] < 20 and st["evicted"]["bytes"] == 20 - st["sessions"]
    assert st["session_bytes"] <= small.max_session_bytes
    assert small.session_view("free", "v19") is not None and small.session_view("free", "v0") is None


def test_unknown_workflow_types_in_an_lru_and_memory_in_metrics(profile_root):
    gate = ShadowGate(max_unknown_types=3)
    service, registry = sidecar(profile_root, gate=gate, max_session_bytes=50 << 20)
    app = create_sidecar_app(service, registry=registry, admin_token="s3cret")
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as c:
        for i in range(10):
            r = c.post("/v1/annotate", json={"app_metadata": meta("w", wt=f"invented-{i}")})
            assert r.json()["sys_annotations"]["reason"] == "unknown_workflow_type"
        shadow = c.get("/v1/profile", headers=TOKEN).json()["shadow"]
        assert sorted(k for k in shadow if k.startswith("invented")) == ["invented-7", "invented-8", "invented-9"]
        assert metric(server.url, "profiler_sidecar_unknown_workflow_types") == 3
        assert metric(server.url, "profiler_sidecar_unknown_workflow_types_evicted_total") == 7
        assert metric(server.url, "profiler_sidecar_session_bytes_limit") == 50 << 20
        assert metric(server.url, "profiler_sidecar_session_bytes") >= 10 * SESSION_BASE_BYTES
        assert metric(server.url, "profiler_sidecar_sessions_limit") == 100_000


def test_refit_failures_are_visible_and_the_child_has_a_timeout(profile_root, tmp_path):
    service, registry = sidecar(profile_root)
    results = []

    def on_result(r):
        service.record_refit(r)
        results.append(r)

    failing = RefitLoop(profile_root=profile_root, logs=[tmp_path], every_s=0, nice=0,
                        on_result=on_result, command=[sys.executable, "-c", "import sys; "
                                                      "print('store locked', file=sys.stderr); sys.exit(3)"])
    assert failing.run_once().error == "exit 3: store locked"
    slow = RefitLoop(profile_root=profile_root, logs=[tmp_path], every_s=0, nice=0, timeout_s=0.5,
                     on_result=on_result, command=[sys.executable, "-c", "import time; time.sleep(60)"])
    result = slow.run_once()
    assert "killed after the 0.5s timeout" in result.error and result.seconds < 30
    app = create_sidecar_app(service, registry=registry)
    with serve_in_thread(app) as server:
        health = httpx.get(server.url + "/healthz").json()
        assert health["refit"]["failures"] == 2 and health["refit"]["consecutive_failures"] == 2
        assert "timeout" in health["refit"]["last_error"]
        assert metric(server.url, "profiler_sidecar_refits_total", outcome="error") == 2
        assert metric(server.url, "profiler_sidecar_refit_last_failure_timestamp_seconds") > 0
        assert httpx.get(server.url + "/v1/profile").json()["refit"]["failures"] == 2


def test_autoscale_needs_the_token_and_rejects_tiny_positive_window_and_utilization(profile_root):
    """Issue 24: ``/v1/autoscale`` was open and answered 500 for ``window_s=1e-320`` (the division
    underflowed to zero) or ``utilization=1e-300`` (``ceil(inf)``: OverflowError)."""
    service, registry = sidecar(profile_root)
    app = create_sidecar_app(service, registry=registry, admin_token="s3cret")
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url) as c:
        for i in range(5):  # live sessions, so the advice has rows to divide
            assert c.post("/v1/annotate", json={"app_metadata": meta(f"a{i}"), "request_id": f"a{i}"}
                          ).status_code == 200
        assert c.get("/v1/autoscale").status_code == 401
        assert c.get("/v1/autoscale", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.get("/v1/autoscale", headers=TOKEN, params={"horizon": 3, "window_s": 30})
        assert ok.status_code == 200 and ok.json()["live_sessions"] == 5
        for params in ({"window_s": "1e-320"}, {"window_s": "5e-324"}, {"window_s": "1e-9"},
                       {"utilization": "1e-300"}, {"utilization": "5e-324"}, {"window_s": "1e300"},
                       {"concurrency": str(10 ** 30)}):
            r = c.get("/v1/autoscale", headers=TOKEN, params={"horizon": 3, **params})
            assert r.status_code == 422, (params, r.status_code, r.text)
            assert next(iter(params)) in r.text


@pytest.mark.parametrize("bad, reason", [
    ({}, "section 'agents' must be a JSON object"),
    ({"agents": []}, "section 'agents' must be a JSON object, got a list"),
    ({"format": 999}, "profile format 999 is not supported"),
    ("good-but-no-agents", "profile holds no workflow type with agents"),
    ("good-but-agents-a-list", "agents of workflow type 'coding_assistant' must be an object"),
])
def test_a_reload_refuses_a_profile_of_the_wrong_shape_and_keeps_serving(profile_root, tmp_path, bad, reason):
    """Issue 24: a version whose profile.json parses but has not the fitted shape used to be
    swapped in (every prediction unknown; with a shadow gate the types stayed in shadow mode
    after the good version came back). Now the swap is refused with a one-line reason."""
    from store.profile_artifact import current_version, load_profile, write_profile

    good = load_profile(profile_root)
    root = tmp_path / "root"
    write_profile(root, good.data, {"sources": []})
    service, registry = sidecar(root, gate=ShadowGate(min_calls=10))
    app = create_sidecar_app(service, registry=registry, admin_token="s3cret")
    with serve_in_thread(app) as server, httpx.Client(base_url=server.url, headers=TOKEN) as c:
        before = c.post("/v1/annotate", json={"app_metadata": meta("w1"), "request_id": "r1"}).json()
        assert before["sys_annotations"]["known"] is True
        if bad == "good-but-no-agents":
            bad = {**good.data, "agents": {}}
        elif bad == "good-but-agents-a-list":
            bad = {**good.data, "agents": {WT: ["planner"]}}
        bad_version = write_profile(root, bad, {"sources": []}).version
        assert current_version(root) == bad_version
        r = c.post("/v1/reload").json()
        assert r["reloaded"] is False and r["profile_version"] == good.version
        assert reason in r["error"] and bad_version in r["error"] and "\n" not in r["error"]
        assert c.get("/healthz").json()["last_reload_error"] == r["error"]
        after = c.post("/v1/annotate", json={"app_metadata": meta("w2"), "request_id": "r2"}).json()
        assert after["sys_annotations"]["known"] is True
        assert c.get("/v1/profile").json()["shadow"].get(WT, {}).get("shadowed", False) is False
