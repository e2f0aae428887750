"""The prediction sidecar on a real port: API, admin token, limits, hot reload, CLI with refit."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import httpx
import pytest
from prometheus_client import CollectorRegistry

from store.profile_artifact import current_version, load_profile, write_profile
from store.workloads import generate, write_jsonl
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.sidecar import create_sidecar_app
from tests.serving_helpers import fit_generated_profile, free_port, metric, swap_profiles_under_load

WT = "coding_assistant"


def meta(wf: str, agent: str, wt: str = WT) -> dict:
    return {"workflow_type_id": wt, "workflow_id": wf, "agent_id": agent}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("sidecar"), 60, seed=7, min_calls=20)


def start_sidecar(profile, **kwargs):
    registry = CollectorRegistry()
    service = prediction_service(profile, registry, "profiler_sidecar",
                                 reload_every_s=kwargs.pop("reload_every_s", 2.0))
    app = create_sidecar_app(service, registry=registry, **kwargs)
    return serve_in_thread(app), service


def test_annotate_observe_profile_health_metrics(profile_root):
    server, service = start_sidecar(profile_root)
    with server, httpx.Client(base_url=server.url) as c:
        r = c.post("/v1/annotate", json={"app_metadata": meta("w", "planner"), "request_id": "r1",
                                         "input_tokens": 300, "sglang": True})
        assert r.status_code == 200
        ann, flat = r.json()["sys_annotations"], r.json()["custom_params"]
        assert ann["known"] is True and ann["profile_version"] == current_version(profile_root)
        assert flat["pred_out_hi"] == ann["predicted_output_len"][1] and flat["agent"] == "planner"
        lo = ann["predicted_output_len"][0]
        r = c.post("/v1/observe", json={"app_metadata": meta("w", "planner"), "request_id": "r1",
                                        "output_tokens": lo})
        assert r.json() == {"in_band": True}
        batch = c.post("/v1/annotate:batch", json={"requests": [
            {"app_metadata": meta("w", "explorer")}, {"app_metadata": meta("w", "nobody")},
            {"app_metadata": meta("w", "planner", wt="unknown_app")}]}).json()["results"]
        # an agent the profile never saw is served its workflow type's entry (issue 22)
        assert [x["sys_annotations"]["known"] for x in batch] == [True, True, False]
        assert batch[1]["sys_annotations"]["output_len_level"] in ("workflow_type", "global", "conditional")
        assert batch[2]["sys_annotations"]["reason"] == "unknown_workflow_type"
        assert c.get(f"/v1/sessions/{WT}/w").json()["agents"] == ["planner", "explorer", "nobody"]
        assert c.post("/v1/annotate", json={"app_metadata": {"workflow_id": 3}}).status_code == 422
        prof = c.get("/v1/profile").json()
        assert prof["version"] == current_version(profile_root)
        assert prof["workflow_types"][WT]["has_automaton"] is True
        assert "planner" in prof["workflow_types"][WT]["agents"]
        health = c.get("/healthz").json()
        assert health["status"] == "ok" and health["sessions"] == 2  # (WT, w) and (unknown_app, w)
        assert metric(server.url, "profiler_sidecar_annotations_total", known="false",
                      reason="unknown_workflow_type") == 1
        assert metric(server.url, "profiler_sidecar_unknown_ratio") == pytest.approx(1 / 4)
        assert metric(server.url, "profiler_sidecar_profile_info", version=prof["version"]) == 1
        assert metric(server.url, "profiler_sidecar_request_seconds_count", route="/v1/annotate") == 2
        spec = c.get("/openapi.json").json()
        assert {"/v1/annotate", "/v1/annotate:batch", "/v1/observe", "/v1/profile", "/healthz",
                "/metrics"} <= set(spec["paths"])
        assert "AnnotateRequest" in spec["components"]["schemas"]


def test_admin_endpoints_need_the_bearer_token_and_bodies_are_limited(profile_root):
    server, _ = start_sidecar(profile_root, admin_token="s3cret", max_request_bytes=4096)
    with server, httpx.Client(base_url=server.url) as c:
        body = {"app_metadata": meta("w", "planner"), "output_tokens": 5}
        assert c.post("/v1/observe", json=body).status_code == 401
        assert c.post("/v1/observe", json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert c.post("/v1/observe", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert c.post("/v1/reload").status_code == 401
        r = c.post("/v1/reload", headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200 and r.json()["reloaded"] is True
        assert c.post("/v1/annotate", json={"app_metadata": meta("w" * 5000, "planner")}).status_code == 413
        assert c.post("/v1/annotate", json={"app_metadata": meta("w", "planner")}).status_code == 200


def test_new_version_swapped_in_during_a_stream_of_requests(profile_root, tmp_path):
    root = tmp_path / "root"
    base = load_profile(profile_root)
    write_profile(root, base.data, {"sources": []})
    server, service = start_sidecar(root, reload_every_s=0.02)
    seen: list[str] = []
    failures: list = []

    def send(c: httpx.Client, wf: str) -> None:
        r = c.post("/v1/annotate", json={"app_metadata": meta(wf, "planner")})
        if r.status_code != 200 or r.json()["sys_annotations"]["known"] is not True:
            failures.append(r.text)
        seen.append(r.json()["sys_annotations"]["profile_version"])

    with server:
        versions = swap_profiles_under_load(server.url, root, base, service.predictor, send)
    assert not failures
    assert len(seen) > 50
    assert versions[-1] in seen and base.version in seen
    reloads = service.metrics.registry.get_sample_value("profiler_sidecar_profile_reloads_total",
                                                        {"outcome": "ok"})
    assert reloads >= 4  # the first load and the three new versions


@pytest.mark.slow
def test_serve_command_refits_from_new_logs(profile_root, tmp_path):
    """`profiler serve --logs DIR --refit-every 1s` as users run it: a new log file → new version."""
    root = tmp_path / "root"
    write_profile(root, load_profile(profile_root).data, {"sources": [], "options": {"min_calls": 20}})
    shutil.copy(profile_root / "store.duckdb", root / "store.duckdb")
    logs = tmp_path / "logs"
    logs.mkdir()
    port = free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PROFILER_RELOAD_EVERY": "0.2s"}  # a config key
    proc = subprocess.Popen(
        [sys.executable, "-c", "from profiler.cli import main; main()", "serve", "--profile", str(root),
         "--port", str(port), "--logs", str(logs), "--refit-every", "1s",
         "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        first = None
        deadline = time.monotonic() + 120   # start-up: only a bound on a wait that would never end
        while time.monotonic() < deadline and first is None:
            try:
                first = httpx.get(url + "/v1/profile").json()
            except httpx.TransportError:
                time.sleep(0.1)
        assert first is not None and set(first["workflow_types"]) == {WT}
        write_jsonl(generate("deep_research", 12, seed=1), logs / "dr.jsonl")
        deadline = time.monotonic() + 300   # the refit child runs at low priority: under a CPU-heavy job it waits
        now = first
        while time.monotonic() < deadline and "deep_research" not in now["workflow_types"]:
            time.sleep(0.25)
            now = httpx.get(url + "/v1/profile").json()
        assert {"deep_research", WT} <= set(now["workflow_types"]), now
        assert now["version"] != first["version"] == load_profile(profile_root).version
        assert now["version"] == current_version(root)
        # the refit kept the fit options the profile was made with
        assert load_profile(root).manifest["options"]["min_calls"] == 20
    finally:
        proc.terminate()
        out = proc.communicate(timeout=10)[0]
    assert "sidecar" in out
