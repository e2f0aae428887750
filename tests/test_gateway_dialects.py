"""Issue 14 on real ports: engine dialects, identity from agent-harness headers, every endpoint,
retry-safe sessions, warm start, OpenTelemetry spans — the real ``openai`` client through the
gateway to a recording fake upstream."""
from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import replace

import httpx
import pytest
from openai import APIStatusError, OpenAI
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from predictors.contract import Annotation
from serving_hooks.dialects import hint_values, parse_upstreams, render
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.gateway import Gateway, GatewayOptions, create_gateway_app
from serving_hooks.identity import IdentityMap, load_identity_map, resolve_identity
from policies.session_end import DEFAULT_SESSION_END_P, SessionEndRule
from serving_hooks.retries import RetryLedger
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.telemetry import CallTracer
from serving_hooks.upstreams import RoundRobinRouter
from tests.serving_helpers import fit_generated_profile, logged, metric, running_gateway, wait_for

WT = "coding_assistant"
_ids = itertools.count()


def meta(agent: str = "planner", wf: str | None = None) -> dict:
    return {"workflow_type_id": WT, "workflow_id": wf or f"d-{next(_ids)}", "agent_id": agent}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("dialects"), 60, seed=5, min_calls=20)


def client(gw, **kw) -> OpenAI:
    return OpenAI(base_url=gw.url + "/v1", api_key="x", **kw)


def call(c: OpenAI, endpoint: str, stream: bool, app_metadata: dict | None = None,
         **kw) -> tuple[str, int | None]:
    """One call through the real openai client: (text, output tokens the client saw)."""
    extra = {"extra_body": {"app_metadata": app_metadata}} if app_metadata else {}
    if endpoint == "chat":
        r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}],
                                      stream=stream, **extra, **kw)
        if stream:
            return "".join(ch.choices[0].delta.content or "" for ch in r if ch.choices), None
        return r.choices[0].message.content, r.usage.completion_tokens
    if endpoint == "completions":
        r = c.completions.create(model="m", prompt="plan", stream=stream, **extra, **kw)
        if stream:
            return "".join(ch.choices[0].text for ch in r if ch.choices), None
        return r.choices[0].text, r.usage.completion_tokens
    r = c.responses.create(model="m", input="plan", stream=stream, **extra, **kw)
    if stream:
        events = list(r)
        assert events[-1].type == "response.completed"
        return "".join(e.delta for e in events if e.type == "response.output_text.delta"), \
            events[-1].response.usage.output_tokens
    return r.output_text, r.usage.output_tokens


@pytest.mark.parametrize("dialect", ["sglang", "vllm", "dynamo", "headers"])
def test_each_dialect_on_chat_completions_and_responses(dialect, upstream, profile_root, tmp_path):
    with running_gateway([upstream.url], profile_root, dialect=dialect, log_dir=tmp_path) as gw:
        c = client(gw)
        n = 0
        for endpoint, stream in itertools.product(("chat", "completions", "responses"), (False, True)):
            m = meta()
            text, out_tokens = call(c, endpoint, stream, m)
            n += 1
            assert text == " ".join(f"tok{i}" for i in range(8))        # the client's answer intact
            assert out_tokens in (None, 8)
            got = upstream.received[-1]
            ann = got.body["sys_annotations"]
            assert ann["known"] is True and ann["workflow_id"] == m["workflow_id"]
            v = hint_values(ann, m)
            if dialect == "sglang":
                assert got.body["priority"] == ann["priority"]
                assert got.body["custom_params"]["wf_id"] == m["workflow_id"]
                assert got.body["custom_params"]["pred_out_hi"] == ann["predicted_output_len"][1]
            elif dialect == "vllm":
                assert got.body["priority"] == -ann["priority"]           # vLLM: lower runs first
                xargs = got.body["vllm_xargs"]
                assert xargs["agent"] == "planner" and xargs["known"] == 1
                assert all(isinstance(x, (str, int, float)) and not isinstance(x, bool)
                           for x in xargs.values())
                assert "custom_params" not in got.body
            elif dialect == "dynamo":
                hints = got.body["nvext"]["agent_hints"]
                assert hints["priority"] == ann["priority"]
                assert hints["osl"] == round(ann["output_len_mean"])
                assert hints["speculative_prefill"] is (ann["p_end"] < 0.5)
                # Dynamo removed nvext.cache_control (v1.1.0) and refuses unknown nvext fields
                assert set(got.body["nvext"]) == {"agent_hints"}
                assert "latency_sensitivity" not in hints
                assert got.headers["x-dynamo-session-id"] == m["workflow_id"]
                assert "priority" not in got.body and "custom_params" not in got.body
            else:
                h = got.headers
                assert h["x-agentprof-workflow-id"] == m["workflow_id"]
                assert h["x-agentprof-agent"] == "planner" and h["x-agentprof-known"] == "1"
                assert int(h["x-agentprof-priority"]) == ann["priority"]
                assert int(h["x-agentprof-osl"]) == v.osl
                assert int(h["x-agentprof-output-hi"]) == ann["predicted_output_len"][1]
                assert "priority" not in got.body and "custom_params" not in got.body
            # every endpoint's answer is read back as a completed call (usage found, logged)
            assert wait_for(lambda: logged(gw) == n), (endpoint, stream, logged(gw))
        assert metric(gw.url, "profiler_gateway_dialect_calls_total", dialect=dialect) == 6
        assert metric(gw.url, "profiler_gateway_identity_calls_total", source="app_metadata") == 6


def test_per_upstream_dialects_and_client_hint_headers_dropped(profile_root):
    vllm, dyn = FakeOpenAI(), FakeOpenAI()
    with serve_in_thread(vllm.app) as a, serve_in_thread(dyn.app) as b:
        specs = parse_upstreams([f"{a.url},dialect=vllm,{b.url}/v1,dialect=dynamo,priority=low_first"])
        with running_gateway([s.url for s in specs], profile_root,
                             upstream_dialects={s.url.rstrip("/").removesuffix("/v1"):
                                                (s.dialect, s.priority_order) for s in specs}) as gw:
            c = client(gw, default_headers={"X-Agentprof-Priority": "999"})
            call(c, "chat", False, meta())
            call(c, "chat", False, meta())
    assert "vllm_xargs" in vllm.received[-1].body and "nvext" not in vllm.received[-1].body
    ann = dyn.received[-1].body["sys_annotations"]
    assert dyn.received[-1].body["nvext"]["agent_hints"]["priority"] == -ann["priority"]
    assert "x-agentprof-priority" not in vllm.received[-1].headers   # a client cannot set hints


def test_sglang_native_generate_is_annotated(upstream, profile_root, tmp_path):
    with running_gateway([upstream.url], profile_root, dialect="sglang", log_dir=tmp_path) as gw:
        for i, stream in enumerate((False, True)):
            m = meta()
            body = {"text": "plan", "sampling_params": {"max_new_tokens": 8, "temperature": 0},
                    "stream": stream, "app_metadata": m}
            r = httpx.post(gw.url + "/generate", json=body)
            assert r.status_code == 200
            got = upstream.received[-1].body
            ann = got["sys_annotations"]
            assert ann["known"] is True
            assert got["priority"] == ann["priority"]                    # GenerateReqInput.priority
            sp = got["sampling_params"]
            assert sp["max_new_tokens"] == 8 and sp["custom_params"]["wf_id"] == m["workflow_id"]
            assert "custom_params" not in got
            assert wait_for(lambda: logged(gw) == i + 1)
            session = gw.service.predictor.sessions.find(WT, m["workflow_id"])
            assert wait_for(lambda: session.last_output == {"planner": 8})   # observed after the log


def test_claude_code_headers_alone_are_annotated(upstream, profile_root, tmp_path):
    idmap = tmp_path / "identity.toml"
    idmap.write_text(f'workflow_type_from = "default"\ndefault_workflow_type = "{WT}"\n')
    with running_gateway([upstream.url], profile_root, dialect="sglang",
                         identity=load_identity_map(idmap)) as gw:
        c = client(gw, default_headers={"x-claude-code-session-id": "cc-7",
                                        "x-claude-code-agent-id": "planner"})
        call(c, "chat", False)                       # no app_metadata anywhere in the body
        got = upstream.received[-1].body
        assert got["sys_annotations"]["known"] is True
        assert got["sys_annotations"]["workflow_id"] == "cc-7"
        assert got["custom_params"]["agent"] == "planner"
        assert metric(gw.url, "profiler_gateway_identity_calls_total", source="claude_code") == 1
        c2 = client(gw)
        call(c2, "chat", False)
        assert "sys_annotations" not in upstream.received[-1].body
        assert metric(gw.url, "profiler_gateway_identity_calls_total", source="none") == 1


def test_identity_sources_and_map():
    m = IdentityMap(workflow_type_from="header:x-workflow-type", default_workflow_type="dflt")
    body = {"model": "gpt-x"}
    assert resolve_identity(body, {"thread-id": "t1"}, m)[0] == \
        {"workflow_type_id": "dflt", "workflow_id": "t1", "agent_id": "main"}
    got, _, src = resolve_identity(body, {"Thread-Id": "t2", "x-codex-parent-thread-id": "t1",
                                          "x-workflow-type": "codex_team"}, m)
    assert src == "codex" and got["workflow_id"] == "t1" and got["agent_id"] == "subagent"
    assert got["workflow_type_id"] == "codex_team"
    got, _, src = resolve_identity(body, {"x-session-id": "o1"}, IdentityMap(workflow_type_from="model"))
    assert (src, got["workflow_type_id"], got["workflow_id"]) == ("opencode", "gpt-x", "o1")
    got, _, src = resolve_identity(body, {"x-dynamo-session-id": "s2", "x-dynamo-parent-session-id": "s1"})
    assert (src, got["workflow_id"], got["agent_id"], got["workflow_type_id"]) == ("dynamo", "s1", "subagent", "dynamo")
    md = {"metadata": {"workflow_type_id": WT, "workflow_id": "w9", "agent_id": "engineer"}}
    assert resolve_identity(md, {"x-session-id": "o1"})[2] == "metadata"
    assert resolve_identity({"app_metadata": meta(wf="a")}, {"x-session-id": "o1"})[2] == "app_metadata"
    with pytest.raises(ValueError, match="workflow_type_from"):
        IdentityMap(workflow_type_from="nope")


def test_start_up_note_when_harness_headers_cannot_be_predicted():
    """Issue 24: with the default map a Claude Code call's workflow type is ``claude_code``; a
    profile without it annotated none of those calls and nothing said so."""
    from serving_hooks.identity import harness_identity_note

    note = harness_identity_note(IdentityMap(), {WT: 100})
    assert note and "Claude Code" in note and "claude_code / codex / opencode / dynamo" in note
    assert WT in note and "--identity-map" in note and "\n" not in note
    assert harness_identity_note(IdentityMap(), {"claude_code": 5, WT: 1}) is None
    assert harness_identity_note(IdentityMap(workflow_type_from="default", default_workflow_type=WT),
                                 {WT: 1}) is None
    assert "dflt" in harness_identity_note(IdentityMap(workflow_type_from="default",
                                                       default_workflow_type="dflt"), {WT: 1})
    assert harness_identity_note(IdentityMap(workflow_type_from="model"), {WT: 1}) is None
    assert harness_identity_note(IdentityMap(harnesses=()), {WT: 1}) is None


def test_gateway_command_prints_the_harness_note_at_start_up(profile_root, monkeypatch, tmp_path):
    """The line reaches the operator: ``profiler gateway`` prints it before serving (the server
    start itself is replaced, so no port is taken), and not when the map fits the profile."""
    import uvicorn
    from typer.testing import CliRunner

    from profiler.cli import app

    served = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: served.append(kw["port"]))
    args = ["gateway", "--upstream", "http://127.0.0.1:9", "--profile", str(profile_root), "--port", "8123"]
    out = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    assert "note:" in out.output and "forwarded without predictions" in out.output and served == [8123]
    good = tmp_path / "map.toml"
    good.write_text(f'workflow_type_from = "default"\ndefault_workflow_type = "{WT}"\n')
    out = CliRunner().invoke(app, [*args, "--identity-map", str(good)], env={"COLUMNS": "400"})
    assert out.exit_code == 0 and "forwarded without predictions" not in out.output, out.output


@pytest.mark.slow
def test_a_call_retried_twice_advances_its_session_once(profile_root, caplog):
    fake = FakeOpenAI()
    with serve_in_thread(fake.app) as up, running_gateway([up.url], profile_root, dialect="sglang") as gw:
        c = client(gw, max_retries=2)
        m = meta()
        fake.fail_next = 2
        with caplog.at_level(logging.WARNING, logger="serving_hooks.gateway"):
            text, _ = call(c, "chat", False, m)
        assert text.startswith("tok0")
        attempts = fake.received[-3:]
        assert [int(a.headers["x-stainless-retry-count"]) for a in attempts] == [0, 1, 2]
        # every attempt saw the session at the same position (session age and aging may differ)
        position = ("next_agents", "predicted_output_len", "expected_remaining_calls", "p_end")
        assert len({str([a.body["sys_annotations"][k] for k in position]) for a in attempts}) == 1
        pred = gw.service.predictor
        assert wait_for(lambda: not pred.sessions.find(WT, m["workflow_id"]).pending)
        assert pred.sessions.find(WT, m["workflow_id"]).calls == 1
        assert sum("failed 502" in r.getMessage() for r in caplog.records) == 2
        assert metric(gw.url, "profiler_gateway_retries_total", outcome="rolled_back") == 2
        # the workflow goes on: its next agent is still on the predicted path
        nxt = attempts[0].body["sys_annotations"]["next_agents"][0]["agent_id"]
        call(c, "chat", False, {**m, "agent_id": nxt})
        ann = fake.received[-1].body["sys_annotations"]
        assert ann["known"] is True, ann
        assert pred.sessions.find(WT, m["workflow_id"]).calls == 2
        # a call that fails for good leaves its session as it was
        fake.fail_next = 3
        with pytest.raises(APIStatusError):
            call(c, "chat", False, {**m, "agent_id": "engineer"})
        assert pred.sessions.find(WT, m["workflow_id"]).calls == 2


def test_identical_body_within_window_is_a_retry_clock_injected(upstream, profile_root):
    now = [1000.0]
    with running_gateway([upstream.url], profile_root, retries=RetryLedger(30.0, clock=lambda: now[0])) as gw:
        m = meta()
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "app_metadata": m}
        pred = gw.service.predictor
        for expected_calls, step in ((1, 0.0), (1, 10.0), (2, 31.0)):
            now[0] += step
            assert httpx.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
            assert wait_for(lambda: not pred.sessions.find(WT, m["workflow_id"]).pending)
            assert pred.sessions.find(WT, m["workflow_id"]).calls == expected_calls, step
        assert metric(gw.url, "profiler_gateway_retries_total", outcome="after_completion") == 1
        # an Idempotency-Key names the call whatever the body
        k = {"Idempotency-Key": "k-1"}
        httpx.post(gw.url + "/v1/chat/completions", json={**body, "temperature": 0.1}, headers=k)
        httpx.post(gw.url + "/v1/chat/completions", json={**body, "temperature": 0.2}, headers=k)
        assert wait_for(lambda: not pred.sessions.find(WT, m["workflow_id"]).pending)
        assert pred.sessions.find(WT, m["workflow_id"]).calls == 3


def test_readyz_is_503_until_the_profile_is_loaded_and_the_first_call_is_annotated(upstream, profile_root):
    from prometheus_client import CollectorRegistry

    from serving_hooks.annotator import LocalAnnotator
    from serving_hooks.service import prediction_service

    reg = CollectorRegistry()
    svc = prediction_service(profile_root, reg, "profiler_gateway")
    # the 30 s test budget (tests/serving_helpers.py): the deployed 5 ms fails the call open on a
    # loaded machine, and this test is about readiness, not the budget
    gw = Gateway(RoundRobinRouter([upstream.url]), LocalAnnotator(svc), registry=reg, service=svc,
                 options=GatewayOptions(budget_s=30.0))
    app = create_gateway_app(gw)
    async def before_start() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as ac:
            return (await ac.get("/readyz")).status_code   # no lifespan: start() has not run

    assert asyncio.run(before_start()) == 503
    with serve_in_thread(app) as server:
        r = httpx.get(server.url + "/readyz")
        assert r.status_code == 200 and r.json()["profile_version"] == svc.predictor.version
        assert svc.predictor.session_count() == 0                  # the warm-up left no session
        httpx.post(server.url + "/v1/chat/completions",
                   json={"model": "m", "messages": [], "app_metadata": meta()})
        assert metric(server.url, "profiler_gateway_annotate_total", outcome="annotated") == 1


def test_otel_spans_carry_prediction_and_outcome(upstream, profile_root):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with running_gateway([upstream.url], profile_root, tracer=CallTracer(provider)) as gw:
        c = client(gw)
        m = meta()
        call(c, "chat", False, m)
        assert wait_for(lambda: len(exporter.get_finished_spans()) == 1)
        first = dict(exporter.get_finished_spans()[0].attributes)
        nxt = first["agentprof.predicted_next_agent"]
        call(c, "responses", True, {**m, "agent_id": nxt})
        assert wait_for(lambda: len(exporter.get_finished_spans()) == 2)
    a, b = (dict(s.attributes) for s in exporter.get_finished_spans())
    assert exporter.get_finished_spans()[0].name == "chat m"
    assert (a["gen_ai.operation.name"], a["gen_ai.request.model"]) == ("chat", "m")
    assert (a["gen_ai.conversation.id"], a["gen_ai.agent.name"]) == (m["workflow_id"], "planner")
    assert a["gen_ai.usage.output_tokens"] == 8 and a["gen_ai.usage.input_tokens"] > 0
    assert a["agentprof.known"] is True and a["agentprof.identity_source"] == "app_metadata"
    assert a["agentprof.output_in_band"] == (a["agentprof.predicted_output_lo"] <= 8
                                             <= a["agentprof.predicted_output_hi"])
    assert "agentprof.actual_next_agent" not in a                  # nothing to score yet
    assert b["gen_ai.operation.name"] == "responses" and b["gen_ai.agent.name"] == nxt
    assert b["agentprof.actual_next_agent"] == nxt and b["agentprof.next_agent_hit"] is True
    assert b["agentprof.actual_idle_gap_s"] >= 0
    assert b["agentprof.idle_within_ttl"] == (b["agentprof.actual_idle_gap_s"] <= a["agentprof.ttl_s"])


def test_renderers_are_pure_and_merge_client_fields():
    ann = {"known": True, "workflow_type_id": WT, "workflow_id": "w", "agent_id": "planner",
           "predicted_output_len": [10, 30], "priority": 5, "keep_alive_ttl_s": 12.2, "p_end": 0.9}
    v = hint_values(ann)
    assert (v.osl, v.ttl_s, v.speculative_prefill) == (20, 13, False)
    body = {"nvext": {"greed_sampling": True, "agent_hints": {"latency_sensitivity": 1.2}}}
    patch, headers = render("dynamo", v, body)
    assert patch["nvext"]["greed_sampling"] is True and headers == {"X-Dynamo-Session-ID": "w"}
    # a client's deprecated latency_sensitivity is not forwarded (Dynamo: priority replaces it)
    assert patch["nvext"]["agent_hints"] == {"priority": 5, "osl": 20, "speculative_prefill": False}
    assert body == {"nvext": {"greed_sampling": True, "agent_hints": {"latency_sensitivity": 1.2}}}
    unknown = hint_values({"known": False, "workflow_type_id": WT, "workflow_id": "w", "agent_id": "x"})
    patch, _ = render("dynamo", unknown, {})
    assert patch == {"nvext": {"agent_hints": {}}}
    with pytest.raises(ValueError, match="dialect"):
        parse_upstreams(["http://a:1,dialect=trt"])


def test_otlp_exporter_posts_spans_to_a_collector():
    """The configured OTLP/HTTP exporter really sends: a fake collector on a real port receives
    the protobuf export request at /v1/traces."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from serving_hooks.telemetry import otlp_tracer_provider

    got: list[tuple[str, bytes]] = []

    async def traces(request: Request) -> Response:
        got.append((request.headers.get("content-type"), await request.body()))
        return Response(b"", media_type="application/x-protobuf")

    with serve_in_thread(Starlette(routes=[Route("/v1/traces", traces, methods=["POST"])])) as col:
        provider = otlp_tracer_provider(col.url)
        CallTracer(provider).record(endpoint="chat", model="m", meta=meta(), ann={"known": True},
                                    identity_source="app_metadata", dialect="vllm", t_arrival=1.0,
                                    t_finish=2.0, status=200, input_tokens=3, output_tokens=4)
        assert provider.force_flush(10_000)
        provider.shutdown()
    assert got and got[0][0] == "application/x-protobuf" and b"gen_ai.conversation.id" in got[0][1]


@pytest.mark.slow
def test_cli_rejects_a_bad_dialect_in_one_line():
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "profiler", "gateway", "--upstream",
                        "http://127.0.0.1:1,dialect=trt", "--sidecar", "http://127.0.0.1:2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "dialect 'trt'" in r.stderr + r.stdout, r.stderr


# ------------------------------------------------------------------ end of session (issue 24.7)
def _ended(dialect: str, got) -> bool:
    """Whether the upstream request carries the end-of-session signal in ``dialect``'s place."""
    body, h = got.body, got.headers
    if dialect == "sglang":
        flag = body["custom_params"]["session_end"]
        assert flag in (True, None)
        return flag is True
    if dialect == "vllm":
        return body["vllm_xargs"].get("session_end") == 1
    if dialect == "dynamo":
        final = h.get("x-dynamo-session-final") == "true"
        assert h["x-dynamo-session-id"] == body["app_metadata"]["workflow_id"]  # every call
        assert "cache_control" not in body["nvext"]
        return final
    return h.get("x-agentprof-session-end") == "1"


@pytest.mark.parametrize("dialect", ["sglang", "vllm", "dynamo", "headers"])
def test_session_end_signal_in_each_dialect(dialect, upstream, profile_root):
    with running_gateway([upstream.url], profile_root, dialect=dialect) as gw:
        c = client(gw)
        m = meta()
        call(c, "chat", False, m)
        first = upstream.received[-1]
        p_end = first.body["sys_annotations"]["p_end"]
        # default --session-end-p: a confident p_end ends the session, else no signal
        assert _ended(dialect, first) is (p_end >= DEFAULT_SESSION_END_P)
        assert first.body["sys_annotations"].get("session_end") is \
            (True if p_end >= DEFAULT_SESSION_END_P else None)
        call(c, "chat", False, {**m, "agent_id": "reviewer", "last_call": True})   # the client knows
        last = upstream.received[-1]
        assert _ended(dialect, last) and last.body["sys_annotations"]["session_end"] is True
        if dialect == "dynamo":   # a client that names its own Dynamo session keeps it
            call(c, "chat", False, {**meta(), "last_call": True},
                 extra_headers={"X-Dynamo-Session-ID": "engine-session"})
            h = upstream.received[-1].headers
            assert h["x-dynamo-session-id"] == "engine-session" and h["x-dynamo-session-final"] == "true"
    off = SessionEndRule(enabled=False)                     # --no-session-end-signal
    with running_gateway([upstream.url], profile_root, dialect=dialect, session_end=off) as gw:
        call(client(gw), "chat", False, {**meta(), "last_call": True})
        assert not _ended(dialect, upstream.received[-1])
        assert "session_end" not in upstream.received[-1].body["sys_annotations"]


def test_session_end_threshold_reads_the_served_p_end(upstream, profile_root):
    low = SessionEndRule(p_threshold=1e-6)                 # every predicted p_end > 0 ends
    with running_gateway([upstream.url], profile_root, dialect="sglang", session_end=low) as gw:
        call(client(gw), "chat", False, meta())
        got = upstream.received[-1]
        assert got.body["sys_annotations"]["p_end"] > 0
        assert got.body["custom_params"]["session_end"] is True
    with pytest.raises(ValueError, match="session-end-p"):
        SessionEndRule(p_threshold=0.0)


def test_session_end_rule_and_renderers_by_hand():
    rule = SessionEndRule()
    known = Annotation(known=True, workflow_type_id=WT, workflow_id="w", agent_id="a", p_end=0.95,
                       keep_alive_ttl_s=30.0)
    assert rule.ends(known, None) and not rule.ends(replace(known, p_end=0.2), None)
    assert rule.ends(replace(known, p_end=0.2), {"last_call": True})
    assert not rule.ends(replace(known, p_end=0.2), {"last_call": "yes"})   # only a real true
    unknown = Annotation(known=False, workflow_id="w")
    assert not rule.ends(replace(unknown, p_end=0.99), None) and rule.ends(unknown, {"last_call": True})
    assert not SessionEndRule(enabled=False).ends(known, {"last_call": True})
    v = hint_values(rule.mark(known, None))
    assert v.session_end and render("sglang", v, {})[0]["custom_params"]["session_end"] is True
    assert render("vllm", v, {})[0]["vllm_xargs"]["session_end"] == 1
    patch, headers = render("dynamo", v, {})
    assert headers == {"X-Dynamo-Session-ID": "w", "X-Dynamo-Session-Final": "true"}
    assert "cache_control" not in patch["nvext"]                 # Dynamo has no TTL field (v1.1.0)
    assert render("headers", v, {})[1]["X-Agentprof-Session-End"] == "1"
    plain = hint_values(known)                                   # not marked: no signal anywhere
    assert render("sglang", plain, {})[0]["custom_params"]["session_end"] is None
    assert "session_end" not in render("vllm", plain, {})[0]["vllm_xargs"]
    assert render("dynamo", plain, {})[1] == {"X-Dynamo-Session-ID": "w"}   # named, not final
    assert "X-Agentprof-Session-End" not in render("headers", plain, {})[1]
