"""Hot reload of a profile that is valid but lacks a workflow type the server is serving
(issue 35): refused with the reason in the reply's ``error`` field (sidecar and gateway), the
type stays served and out of shadow mode, and the "valid versions" hint of a broken ``CURRENT``
names only versions a server would load."""
from __future__ import annotations

import json

import httpx
import pytest
from prometheus_client import CollectorRegistry

from fitting.profile_fit import FitOptions, fit_profile
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.shadow import ShadowGate
from serving_hooks.sidecar import create_sidecar_app
from store.profile_artifact import ProfileError, current_version, load_profile, write_profile
from store.workloads import generate, write_jsonl
from tests.serving_helpers import running_gateway

SERVED, OTHER = "coding_assistant", "deep_research"


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """A profile of two workflow types, and a valid one of the other type alone."""
    tmp = tmp_path_factory.mktemp("reload-types")
    write_jsonl(generate("coding_assistant", 20, seed=3), tmp / "both" / "ca.jsonl")
    write_jsonl(generate("deep_research", 20, seed=3), tmp / "both" / "dr.jsonl")
    write_jsonl(generate("deep_research", 20, seed=4), tmp / "other" / "dr.jsonl")
    both, _ = fit_profile([tmp / "both"], tmp / "p-both", options=FitOptions(min_calls=10), progress=False)
    other, _ = fit_profile([tmp / "other"], tmp / "p-other", options=FitOptions(min_calls=10), progress=False)
    assert set(both.data["workflow_types"]) == {SERVED, OTHER} and set(other.data["workflow_types"]) == {OTHER}
    return both, other


def meta(wf: str, wt: str = SERVED) -> dict:
    return {"workflow_type_id": wt, "workflow_id": wf, "agent_id": "planner"}


def test_sidecar_refuses_a_version_without_a_served_type_and_says_why(profiles, tmp_path):
    both, other = profiles
    root = tmp_path / "root"
    write_profile(root, both.data, {"sources": []})
    registry = CollectorRegistry()
    service = prediction_service(root, registry, "profiler_sidecar", gate=ShadowGate(min_calls=10),
                                 reload_every_s=0)
    with serve_in_thread(create_sidecar_app(service, registry=registry)) as server, \
            httpx.Client(base_url=server.url) as c:
        assert c.post("/v1/annotate", json={"app_metadata": meta("w1"), "request_id": "r1"}
                      ).json()["sys_annotations"]["known"] is True
        bad = write_profile(root, other.data, {"sources": []}).version
        assert current_version(root) == bad
        r = c.post("/v1/reload").json()
        assert r["reloaded"] is False and r["profile_version"] == both.version
        assert bad in r["error"] and f"'{SERVED}' (1 live sessions)" in r["error"] and "\n" not in r["error"]
        # still served, never taken for a new type: not in shadow mode
        assert c.post("/v1/annotate", json={"app_metadata": meta("w2"), "request_id": "r2"}
                      ).json()["sys_annotations"]["known"] is True
        assert c.get("/v1/profile").json()["shadow"].get(SERVED, {}).get("shadowed", False) is False
        # the good version written again is taken (the refusal did not stick to it)
        good_again = write_profile(root, both.data, {"sources": []}).version
        assert good_again == both.version and c.post("/v1/reload").json()["error"] is None


def test_a_version_without_an_unserved_type_is_taken(profiles, tmp_path):
    """Only types with live sessions hold a version back: a server that has seen no call of the
    dropped type takes the new version."""
    both, other = profiles
    root = tmp_path / "root"
    write_profile(root, both.data, {"sources": []})
    service = prediction_service(root, CollectorRegistry(), "profiler_sidecar", reload_every_s=0)
    service.annotate(meta("w1", OTHER))
    write_profile(root, other.data, {"sources": []})
    assert service.reload() is True and service.predictor.version == other.version


def test_gateway_reload_reply_carries_the_reason(profiles, tmp_path):
    both, other = profiles
    root = tmp_path / "root"
    write_profile(root, both.data, {"sources": []})
    engine = FakeOpenAI()
    with serve_in_thread(engine.app) as up, running_gateway([up.url], root, reload_every_s=3600) as gw:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "app_metadata": meta("g1")}
        assert httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=30).status_code == 200
        bad = write_profile(root, other.data, {"sources": []}).version
        r = httpx.post(gw.url + "/admin/reload", timeout=30).json()
        assert r["reloaded"] is False and r["profile_version"] == both.version
        assert bad in r["error"] and SERVED in r["error"]


def test_the_valid_versions_hint_names_only_versions_a_server_would_load(profiles, tmp_path):
    both, _ = profiles
    root = tmp_path / "root"
    good = write_profile(root, both.data, {"sources": []}).version
    wrong_format = write_profile(root, {**both.data, "format": 999}, {"sources": []}).version
    (root / "CURRENT").write_text("0123456789ab\n")         # names a version that is not there
    with pytest.raises(ProfileError) as err:
        load_profile(root)
    assert f"valid versions here, newest first: {good} " in str(err.value)
    assert wrong_format not in str(err.value)
    json.loads((root / "versions" / wrong_format / "profile.json").read_text())  # it parses: refused on shape


def test_the_good_version_restored_brings_a_trusted_type_out_of_shadow():
    """A trusted type a later version lacked was shadowed as new when its calls came; the good
    version back with the type ends that at once. A type never trusted, or shadowed for drift,
    still waits for its live window."""
    gate = ShadowGate(min_calls=10, window=20, min_window=5)
    gate.on_profile({"a": 100, "b": 100}, 0.99, first=True)
    gate.on_profile({"b": 100}, 0.99, first=False)            # a version without "a"
    gate.note_unknown("a")
    gate.note_unknown("new")
    assert gate.reason("a") == gate.reason("new") == "new_workflow_type"
    gate.on_profile({"a": 100, "b": 100, "new": 100}, 0.99, first=False)
    assert not gate.is_shadowed("a") and gate.status()["a"]["promotions"] == 1
    assert gate.reason("new") == "new_workflow_type"            # never trusted: window first
    for hit in [False] * 5:
        gate.record("b", hit)
    assert gate.reason("b") == "drift"
    gate.on_profile({"a": 100, "b": 100, "new": 100}, 0.99, first=False)
    assert gate.reason("b") == "drift"                           # drift waits for its window


def test_served_again_after_a_version_without_it_was_taken(profiles, tmp_path):
    """No live session held the type back, so the version without it was taken; its next call
    was unknown (shadowed). Restoring the good version serves it known again, unshadowed."""
    both, other = profiles
    root = tmp_path / "root"
    write_profile(root, both.data, {"sources": []})
    service = prediction_service(root, CollectorRegistry(), "profiler_sidecar", reload_every_s=0,
                                 gate=ShadowGate(min_calls=10))
    write_profile(root, other.data, {"sources": []})
    assert service.reload() is True
    assert service.annotate(meta("w1"))["known"] is False
    assert service.predictor.gate.reason(SERVED) == "new_workflow_type"
    write_profile(root, both.data, {"sources": []})
    assert service.reload() is True and service.predictor.version == both.version
    assert service.annotate(meta("w2"))["known"] is True
    assert not service.predictor.gate.is_shadowed(SERVED)
