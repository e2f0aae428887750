"""The annotating gateway on real ports: what it forwards, streams, logs, and how it fails open."""
from __future__ import annotations

import json
import time

import duckdb
import httpx
import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry

from fitting import profile_fit as fitting
from predictors.contract import FLAT_KEYS as CUSTOM_PARAM_KEYS, Annotation
from serving_hooks.annotator import LocalAnnotator
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.gateway import Gateway, create_gateway_app
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.sidecar import create_sidecar_app
from tests.serving_helpers import fit_generated_profile, free_port, logged, metric, running_gateway, wait_for

WT = "coding_assistant"
META = {"workflow_type_id": WT, "workflow_id": "s-1", "agent_id": "planner"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "plan the fix, ünïcode kept"}],
        "temperature": 0.25}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("gw"), 60, seed=5, min_calls=20)


def test_forwarded_body_is_the_clients_bytes_plus_annotations(upstream, profile_root):
    raw = json.dumps({**CHAT, "app_metadata": META}, ensure_ascii=False, indent=2).encode()
    with running_gateway([upstream.url], profile_root) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
    assert r.status_code == 200
    got = upstream.received[-1]
    ann = got.body["sys_annotations"]
    assert ann["known"] is True and ann["predicted_output_len"][0] <= ann["predicted_output_len"][1]
    assert ann["next_agents"] and "expected_remaining_calls" in ann
    # every byte the client sent is forwarded unchanged: the annotations are one spliced prefix
    prefix = b'{"sys_annotations":' + json.dumps(ann, separators=(",", ":")).encode() + b","
    assert got.raw == prefix + raw[1:]
    assert {k: v for k, v in got.body.items() if k != "sys_annotations"} == json.loads(raw)
    assert "priority" not in got.body and "custom_params" not in got.body


def test_nested_extra_body_and_sglang_fields(upstream, profile_root):
    body = {**CHAT, "extra_body": {"app_metadata": META}, "custom_params": {"mine": 1}}
    with running_gateway([upstream.url], profile_root, sglang_fields=True) as gw:
        assert httpx.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
    got = upstream.received[-1].body
    ann = got["extra_body"]["sys_annotations"]
    assert got["extra_body"]["app_metadata"] == META
    assert got["priority"] == ann["priority"] and isinstance(got["priority"], int)
    params = got["custom_params"]
    # the client's own custom_params are scheduler input: dropped unless allowed
    assert set(CUSTOM_PARAM_KEYS) <= set(params) and "mine" not in params
    with running_gateway([upstream.url], profile_root, sglang_fields=True,
                         allow_client_scheduler_fields=True) as gw:
        assert httpx.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
    params = upstream.received[-1].body["custom_params"]
    assert set(CUSTOM_PARAM_KEYS) <= set(params) and params["mine"] == 1
    assert all(v is None or isinstance(v, (str, int, float, bool)) for v in params.values())
    assert (params["wf_type"], params["wf_id"], params["agent"]) == (WT, "s-1", "planner")
    assert [params["pred_out_lo"], params["pred_out_hi"]] == ann["predicted_output_len"]
    assert params["next_agent"] == ann["next_agents"][0]["agent_id"]
    assert {k: v for k, v in got.items() if k not in ("extra_body", "priority", "custom_params")} == CHAT


def test_strip_metadata_for_strict_upstreams(upstream, profile_root):
    with running_gateway([upstream.url], profile_root, sglang_fields=True, strip_metadata=True) as gw:
        httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
    got = upstream.received[-1].body
    assert "app_metadata" not in got and "sys_annotations" not in got
    assert got["custom_params"]["known"] is True


def test_request_without_metadata_is_forwarded_byte_for_byte(upstream, profile_root):
    raw = b'{"model":"m",  "messages":[{"role":"user","content":"x"}]}'
    with running_gateway([upstream.url], profile_root) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", content=raw)
        assert r.status_code == 200
        assert upstream.received[-1].raw == raw
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="no_metadata") == 1


def sse_events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e]


def test_sse_stream_passes_through_in_order_and_byte_identical(upstream, profile_root):
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    direct = httpx.post(upstream.url + "/v1/chat/completions", json=body, headers={"x-fake-tokens": "30"})
    with running_gateway([upstream.url], profile_root) as gw:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json={**body, "app_metadata": META},
                          headers={"x-fake-tokens": "30"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            got = b"".join(r.iter_raw())
    # same chunks in the same order; only the completion ids/timestamps differ between the calls
    strip = lambda e: json.dumps({k: v for k, v in json.loads(e[6:]).items() if k not in ("id", "created")}) \
        if e.startswith("data: {") else e
    assert [strip(e) for e in sse_events(got.decode())] == [strip(e) for e in sse_events(direct.text)]
    assert "tok29" in got.decode() and got.endswith(b"data: [DONE]\n\n")


def test_usage_chunk_requested_for_the_log_is_hidden_from_the_client(upstream, profile_root, tmp_path):
    body = {**CHAT, "stream": True, "app_metadata": META}
    with running_gateway([upstream.url], profile_root, log_dir=tmp_path) as gw:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            events = sse_events(b"".join(r.iter_raw()).decode())
        assert wait_for(lambda: logged(gw) == 1)
        gw.log.rotate()
    assert upstream.received[-1].body["stream_options"] == {"include_usage": True}
    assert not any('"usage"' in e for e in events)                      # client did not ask
    assert events[-1] == "data: [DONE]"
    record = json.loads(next(tmp_path.glob("*.jsonl")).read_text().splitlines()[0])
    assert record["response"]["usage"]["completion_tokens"] == 8
    assert record["response"]["choices"][0]["message"]["content"] == " ".join(f"tok{i}" for i in range(8))
    assert record["t_arrival"] <= record["t_first_token"] <= record["t_finish"]


def test_openai_client_with_extra_body(upstream, profile_root):
    with running_gateway([upstream.url], profile_root) as gw:
        client = OpenAI(base_url=gw.url + "/v1", api_key="sk-test", max_retries=0)
        out = client.chat.completions.create(model="m", messages=CHAT["messages"],
                                             extra_body={"app_metadata": META})
        assert out.choices[0].message.content.startswith("tok0")
        assert upstream.received[-1].body["sys_annotations"]["known"] is True
        assert upstream.received[-1].headers["authorization"] == "Bearer sk-test"
        chunks = list(client.chat.completions.create(
            model="m", messages=CHAT["messages"], stream=True,
            extra_body={"app_metadata": {**META, "agent_id": "explorer"}}))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).startswith("tok0 tok1")
        assert [m.id for m in client.models.list()] == ["fake-model"]
        text = client.completions.create(model="m", prompt="hello", extra_body={"app_metadata": META})
        assert text.choices[0].text.startswith("tok0")


@pytest.mark.slow
def test_upstream_errors_reach_the_client_unchanged(upstream, profile_root):
    # timeout 2 s vs a 6 s delay: the answers that must arrive do so well inside it under load
    with running_gateway([upstream.url], profile_root, upstream_timeout_s=2.0) as gw:
        direct = httpx.post(upstream.url + "/v1/chat/completions", json=CHAT, headers={"x-fake-status": "500"})
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META},
                       headers={"x-fake-status": "500"})
        assert r.status_code == 500 and r.content == direct.content
        assert r.headers["x-fake"] == "error"
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META},
                       headers={"x-fake-status": "429"})
        assert r.status_code == 429
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT, headers={"x-fake-delay": "6"})
        assert r.status_code == 504 and r.json()["error"]["type"] == "upstream_timeout"
        assert metric(gw.url, "profiler_gateway_upstream_responses_total",
                      upstream=upstream.url, outcome="timeout") == 1


def test_unreachable_upstream_is_502(profile_root):
    with running_gateway([f"http://127.0.0.1:{free_port()}"], profile_root) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
    assert r.status_code == 502 and r.json()["error"]["type"] == "upstream_unreachable"


def test_sidecar_mode_and_sidecar_down_still_serves(upstream, profile_root):
    registry = CollectorRegistry()
    service = prediction_service(profile_root, registry, "profiler_sidecar")
    with serve_in_thread(create_sidecar_app(service, registry=registry)) as sidecar:
        with running_gateway([upstream.url], sidecar=sidecar.url) as gw:   # the default 30 s test budget
            r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
            assert r.status_code == 200
            assert upstream.received[-1].body["sys_annotations"]["known"] is True
            # the observe is sent in the background, after the client has its answer
            assert wait_for(lambda: (service.predictor.session_view(WT, "s-1") or {}).get("last_output"))
            assert service.predictor.session_view(WT, "s-1")["last_output"] == {"planner": 8}
            health = httpx.get(gw.url + "/healthz").json()
            assert (health["status"], health["sidecar"]) == ("ok", "ok")
    # the sidecar is gone now: calls still go through, unannotated, and a counter says so
    # (a refused connection is an error at once; a short budget would turn a slow refusal on a
    # loaded machine into a timeout)
    with running_gateway([upstream.url], sidecar=sidecar.url) as gw:
        for _ in range(3):
            r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
            assert r.status_code == 200
            assert "sys_annotations" not in upstream.received[-1].body
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="error") == 3
        # issue 24: /healthz said "ok" here; now it says the predictions are gone, and why
        health = httpx.get(gw.url + "/healthz")
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert health.json()["sidecar"].startswith("unreachable") and "127.0.0.1" not in health.text


class SlowAnnotator:
    """An in-process predictor that blows the time budget (an ``AnnotationSource``)."""

    blocking = True
    takes_priority_inputs = False

    def annotate_now(self, meta, request_id, input_tokens, timeout_s=None, advance=True,
                     priority_inputs=None):
        time.sleep(0.02)
        return Annotation(known=True)

    async def annotate(self, meta, request_id, input_tokens, advance=True, priority_inputs=None):
        return self.annotate_now(meta, request_id, input_tokens)

    async def cancel(self, meta, request_id):
        return False

    async def observe(self, completion):
        return None

    async def health(self):
        return None

    async def warm_up(self):
        return None

    async def start(self):
        return None

    async def aclose(self):
        return None


def test_over_budget_prediction_goes_upstream_unannotated(upstream):
    with running_gateway([upstream.url], annotator=SlowAnnotator(), budget_s=0.005) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
        assert r.status_code == 200 and "sys_annotations" not in upstream.received[-1].body
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="over_budget") == 1


def test_request_size_limit(upstream, profile_root):
    with running_gateway([upstream.url], profile_root, max_request_bytes=2000) as gw:
        before = len(upstream.received)
        r = httpx.post(gw.url + "/v1/chat/completions",
                       json={**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]})
        assert r.status_code == 413 and len(upstream.received) == before

        def chunked():
            yield b'{"model": "m", "messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'
        assert httpx.post(gw.url + "/v1/chat/completions", content=chunked()).status_code == 413


def test_gateway_log_is_read_by_profiler_fit_unchanged(upstream, profile_root, tmp_path):
    logs = tmp_path / "logs"
    tools = [{"type": "function", "function": {"name": "run_tests", "parameters": {}}}]
    with running_gateway([upstream.url], profile_root, log_dir=logs) as gw:
        client = OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        for i, agent in enumerate(["planner", "explorer", "engineer"]):
            client.chat.completions.create(
                model="m", messages=CHAT["messages"], stream=(i == 1), tools=tools if agent == "engineer" else None,
                extra_body={"app_metadata": {**META, "workflow_id": "s-log", "agent_id": agent}})
            time.sleep(0.05)  # the "tool time" between calls
        httpx.post(gw.url + "/v1/chat/completions", json=CHAT)            # no metadata: not logged
        httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META},
                   headers={"x-fake-status": "500"})                     # failed: not logged
        assert wait_for(lambda: logged(gw) == 3)
        assert list(logs.glob("*.jsonl.open"))                          # open file: invisible to fit
        gw.log.rotate()
    files = list(logs.glob("*.jsonl"))
    assert len(files) == 1 and not list(logs.glob("*.open"))
    _, report = fitting.fit_profile([logs], tmp_path / "p2")
    assert report.loaded == 3 and report.quarantined == 0
    con = duckdb.connect(str(tmp_path / "p2" / "store.duckdb"), read_only=True)
    rows = con.execute("SELECT agent_id, record_shape, output_tokens, tool_names, gap_after_s "
                       "FROM calls ORDER BY call_index").fetchall()
    assert [r[0] for r in rows] == ["planner", "explorer", "engineer"]
    assert all(r[1] == "gateway" and r[2] == 8 for r in rows)
    assert rows[2][3] == ["run_tests"] and rows[0][4] >= 0.04


def test_round_robin_over_upstreams_and_models_passthrough(profile_root):
    a, b = FakeOpenAI(), FakeOpenAI(model="other")
    with serve_in_thread(a.app) as sa, serve_in_thread(b.app) as sb:
        with running_gateway([sa.url, sb.url + "/v1"], profile_root) as gw:
            for _ in range(4):
                assert httpx.post(gw.url + "/v1/chat/completions", json=CHAT).status_code == 200
            models = {httpx.get(gw.url + "/v1/models").json()["data"][0]["id"] for _ in range(2)}
    assert len(a.received) >= 2 and len(b.received) >= 2
    assert models == {"fake-model", "other"}


def test_capacity_routing_seam_uses_the_workers_load_reports(profile_root):
    from serving_hooks.upstreams import CapacityRouting

    a, b = FakeOpenAI(), FakeOpenAI()
    with serve_in_thread(a.app) as sa, serve_in_thread(b.app) as sb:
        router = CapacityRouting([sa.url, sb.url], poll_interval_s=0.05)
        registry = CollectorRegistry()
        service = prediction_service(profile_root, registry, "profiler_gateway")
        gw = Gateway(router, LocalAnnotator(service), registry=registry, service=service)
        with serve_in_thread(create_gateway_app(gw)) as server:
            for i in range(6):
                r = httpx.post(server.url + "/v1/chat/completions",
                               json={**CHAT, "app_metadata": {**META, "workflow_id": f"cap-{i}"}})
                assert r.status_code == 200
            decisions = router.router.metrics()
            assert decisions["capacity"] == 6 and decisions["no_report"] == 0
            assert decisions["decisions"] == 6 and decisions["moved_sessions"] == 0
            text = httpx.get(server.url + "/metrics").text    # the same counters, scraped
            assert 'profiler_gateway_route_decisions_total{mode="capacity"} 6.0' in text
            assert "profiler_gateway_route_moved_sessions_total 0.0" in text
            assert "profiler_gateway_route_move_left_behind_tokens_total 0.0" in text
            assert not any(router.router.inflight().values())   # every finish was reported
