"""The gateway against adversarial input, on real ports: what it forwards, refuses and recovers."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from predictors.contract import Annotation
from store.ingest import discover
from serving_hooks.gateway import ENGINE_ADMIN_PATHS, path_forwarded, DEFAULT_FORWARD_PATHS
from serving_hooks.gateway_log import GatewayLog, recover_orphans
from serving_hooks.server_thread import serve_in_thread
from tests.serving_helpers import fit_generated_profile, free_port, metric, running_gateway, wait_for

WT = "coding_assistant"
META = {"workflow_type_id": WT, "workflow_id": "s-1", "agent_id": "planner"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Recorder:
    """An upstream that records every request on every path and can stream broken SSE."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.raws: list[bytes] = []
        self.app = Starlette(routes=[Route("/{path:path}", self.any, methods=["GET", "POST"])])

    async def any(self, request):
        raw = await request.body()
        self.paths.append(request.url.path)
        self.raws.append(raw)
        if request.url.path == "/v1/chat/completions" and b'"stream":true' in raw.replace(b" ", b""):
            return StreamingResponse(self.broken_stream(), media_type="text/event-stream")
        return JSONResponse({"id": "x", "choices": [{"index": 0, "message": {"content": "ok"}}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})

    EVENTS = [
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":"not a list"}\n\n',                  # wrong shape
        b'data: {not json at all\n\n',                           # not JSON
        b'data: {"choices":[{"index":0,"delta":"string"}]}\n\n',  # delta not an object
        b'data: ' + b'[' * 3000 + b']' * 3000 + b'\n\n',            # too deep for the parser
        b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}\n\n',
        b'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n',
        b'data: [DONE]\n\n',
    ]

    async def broken_stream(self):
        for event in self.EVENTS:
            yield event


@pytest.fixture(scope="module")
def recorder():
    rec = Recorder()
    with serve_in_thread(rec.app) as server:
        rec.url = server.url
        yield rec


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("gwh"), 30, seed=5, min_calls=10)


def test_path_allow_list_and_engine_admin_paths(recorder):
    with running_gateway([recorder.url], forward_paths=DEFAULT_FORWARD_PATHS + ("/flush_cache", "/*"),
                         admin_token="t0k") as gw:
        before = len(recorder.paths)
        for method, path in [("POST", "/flush_cache"), ("POST", "/update_weights_from_disk"),
                             ("GET", "/get_server_info"), ("POST", "/release_memory_occupation"),
                             ("GET", "/v1/models/../flush_cache"), ("GET", "//flush_cache"),
                             ("POST", "/v1/load_lora_adapter"), ("POST", "/FLUSH_CACHE")]:
            r = httpx.request(method, gw.url + path)
            assert r.status_code == 404, (path, r.status_code)
        assert len(recorder.paths) == before                   # none reached the engine
        assert httpx.get(gw.url + "/v1/models").status_code == 200
        assert httpx.post(gw.url + "/v1/rerank", json={}).status_code == 200   # "/*" allows it
        assert metric(gw.url, "profiler_gateway_paths_refused_total") == 8
    with running_gateway([recorder.url]) as gw:                 # the default list
        assert httpx.post(gw.url + "/v1/rerank", json={}).status_code == 404
        for path in ("/v1/models", "/health", "/generate"):
            assert httpx.request("POST" if path == "/generate" else "GET", gw.url + path).status_code == 200
    assert not path_forwarded("/v1/models/x/../../flush_cache", ("/v1/models/*",))
    assert all(pat.startswith(("*", "/")) for pat in ENGINE_ADMIN_PATHS)


@pytest.mark.slow
def test_client_scheduler_fields_are_stripped_unless_allowed(recorder):
    for body in ({**CHAT, "priority": -100, "custom_params": {"known": True, "priority": 9}},
                 {**CHAT, "app_metadata": {"workflow_type_id": "nope"}, "priority": 5},
                 {**CHAT, "extra_body": {"priority": 1, "custom_params": {"x": 1}}}):
        with running_gateway([recorder.url]) as gw:
            assert httpx.post(gw.url + "/v1/chat/completions", json=body).status_code == 200
            got = json.loads(recorder.raws[-1])
            assert "priority" not in got and "custom_params" not in got
            assert not {"priority", "custom_params"} & set(got.get("extra_body", {}))
            assert got["messages"] == CHAT["messages"]
            assert metric(gw.url, "profiler_gateway_client_scheduler_fields_stripped_total") == 1
        with running_gateway([recorder.url], allow_client_scheduler_fields=True) as gw:
            raw = json.dumps(body).encode()
            httpx.post(gw.url + "/v1/chat/completions", content=raw)
            assert recorder.raws[-1] == raw                       # untouched when allowed


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "messages": [], "temperature": 1e400, "app_metadata": {"workflow_type_id": "a", "workflow_id": "b", "agent_id": "c"}}',
    b'{"model": "m", "messages": [], "temperature": NaN, "app_metadata": {"workflow_type_id": "a", "workflow_id": "b", "agent_id": "c"}}',
    b'{"model": "m", "top_p": -Infinity}',
    b'{"model": "m", "x": ' + b'[' * 990 + b']' * 990 + b', "app_metadata": {"workflow_type_id": "a", "workflow_id": "b", "agent_id": "c"}}',
    b'{"model": "m", "x": ' + b'{"a":' * 5000 + b'1' + b'}' * 5000 + b'}',
    b'{"model": "m", "user": "\\ud800", "app_metadata": {"workflow_type_id": "a", "workflow_id": "\\udc00", "agent_id": "c"}}',
    b'not json {',
])
def test_unparseable_or_non_interoperable_json_is_forwarded_byte_for_byte(recorder, profile_root, raw):
    with running_gateway([recorder.url], profile_root) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert r.status_code == 200
        assert recorder.raws[-1] == raw          # never re-encoded, so never Infinity/NaN emitted
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="not_json") == 1


#: Issue 24: a call without app_metadata set its own scheduling through these (one body per
#: dialect field; each also inside ``extra_body``). Path: endpoint, body.
HOSTILE_SCHEDULER_BODIES = [
    ("/v1/chat/completions", {**CHAT, "custom_params": {"priority": 9, "known": True}}),   # SGLang plugin
    ("/generate", {"text": "hi", "priority": 50,
                   "sampling_params": {"max_new_tokens": 4, "custom_params": {"priority": 9}}}),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"custom_params": {"priority": 9}},
                                                          {"max_new_tokens": 2}]}),          # batch
    ("/v1/chat/completions", {**CHAT, "priority": -100, "vllm_xargs": {"priority": 9}}),     # vLLM
    ("/v1/completions", {"model": "m", "prompt": "hi", "vllm_xargs": {"x": 1}}),
    ("/v1/chat/completions", {**CHAT, "nvext": {"agent_hints": {"priority": 100, "osl": 1},  # Dynamo
                                                "cache_control": {"type": "ephemeral", "ttl": "3600"},
                                                "ignore_eos": False}}),
    ("/v1/chat/completions", {**CHAT, "extra_body": {"vllm_xargs": {"x": 1},
                                                     "nvext": {"cache_control": {"ttl": "3600"}}}}),
    ("/v1/responses", {"model": "m", "input": "hi", "priority": 7}),
]


def _scheduler_fields_in(body) -> list[str]:
    """Every client scheduler field still present in a forwarded body (empty: all stripped)."""
    found = []
    for scope in (body, body.get("extra_body") or {}):
        found += [k for k in ("priority", "custom_params", "vllm_xargs") if k in scope]
        nvext = scope.get("nvext") or {}
        found += [f"nvext.{k}" for k in ("agent_hints", "cache_control") if k in nvext]
        sps = scope.get("sampling_params")
        for sp in sps if isinstance(sps, list) else [sps or {}]:
            found += ["sampling_params.custom_params"] if "custom_params" in sp else []
    return found


@pytest.mark.parametrize("dialect", [None, "sglang", "vllm", "dynamo", "headers"])
def test_client_scheduler_fields_of_every_dialect_are_stripped(recorder, dialect):
    """Whatever the gateway's dialect, no client body keeps a field that sets its own priority,
    output length or KV TTL; other fields (``nvext.ignore_eos``, the batch's second
    ``sampling_params``) are kept. With ``--allow-client-scheduler-fields`` the bytes pass."""
    with running_gateway([recorder.url], dialect=dialect) as gw:
        for path, body in HOSTILE_SCHEDULER_BODIES:
            r = httpx.post(gw.url + path, json=body,
                           headers={"X-Agentprof-Priority": "100", "X-Agentprof-Known": "1"})
            assert r.status_code == 200, (path, r.text)
            got = json.loads(recorder.raws[-1])
            assert _scheduler_fields_in(got) == [], (path, body, got)
        assert metric(gw.url, "profiler_gateway_client_scheduler_fields_stripped_total") == \
            len(HOSTILE_SCHEDULER_BODIES)
    assert got == {"model": "m", "input": "hi"}
    nv = next(b for _, b in HOSTILE_SCHEDULER_BODIES if "nvext" in b)
    with running_gateway([recorder.url], dialect=dialect) as gw:
        httpx.post(gw.url + "/v1/chat/completions", json=nv)
        assert json.loads(recorder.raws[-1])["nvext"] == {"ignore_eos": False}
        batch = HOSTILE_SCHEDULER_BODIES[2][1]
        httpx.post(gw.url + "/generate", json=batch)
        assert json.loads(recorder.raws[-1])["sampling_params"] == [{}, {"max_new_tokens": 2}]
    with running_gateway([recorder.url], dialect=dialect, allow_client_scheduler_fields=True) as gw:
        for path, body in HOSTILE_SCHEDULER_BODIES:
            raw = json.dumps(body).encode()
            httpx.post(gw.url + path, content=raw, headers={"content-type": "application/json"})
            assert recorder.raws[-1] == raw


@pytest.mark.parametrize("raw", [
    b'{"model": "m", "vllm_xargs": {"x": 1}, "top_p": NaN}',
    b'{"model": "m", "nvext": {"agent_hints": {"priority": 9}}, "t": 1e400}',
    b'{"model": "m", "top_p": -Infinity, "priority": -100}',
    b'{"model": "m", "extra_body": {"custom_params": {"x": NaN}}}',
    b'{"priority": 1, "x": ' + b'[' * 5000 + b']' * 5000 + b'}',
])
def test_scheduler_fields_in_a_body_that_cannot_be_stripped_are_refused(recorder, raw):
    with running_gateway([recorder.url]) as gw:
        before = len(recorder.raws)
        r = httpx.post(gw.url + "/v1/chat/completions", content=raw,
                       headers={"content-type": "application/json"})
        assert r.status_code == 400 and "scheduler fields" in r.json()["error"]["message"]
        assert len(recorder.raws) == before


def test_malformed_sse_chunks_pass_through_untouched(recorder, profile_root):
    with running_gateway([recorder.url], profile_root) as gw:
        with httpx.stream("POST", gw.url + "/v1/chat/completions",
                          json={**CHAT, "stream": True, "stream_options": {"include_usage": True},
                                "app_metadata": META}) as r:
            got = b"".join(r.iter_bytes())
        assert r.status_code == 200
        assert got == b"".join(Recorder.EVENTS)      # every event, the malformed ones included
        assert metric(gw.url, "profiler_gateway_sse_malformed_events_total") == 4


class DyingUpstream:
    """An upstream whose streams break off: two whole events, half of a third, then the process
    behind the connection dies (the ASGI app raises, so the server drops the connection without
    the chunked body's end: the client side sees an incomplete payload)."""

    EVENTS = [b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"Hel"}}]}\n\n',
              b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"lo"}}]}\n\n']
    PARTIAL = b'data: {"id":"c","choices":[{"index":0,"del'

    def __init__(self) -> None:
        self.app = Starlette(routes=[Route("/{path:path}", self.any, methods=["POST"])])

    async def any(self, request):
        await request.body()

        async def events():
            for e in self.EVENTS:
                yield e
            yield self.PARTIAL
            raise RuntimeError("engine died")

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def dying():
    up = DyingUpstream()
    with serve_in_thread(up.app) as server:
        up.url = server.url
        yield up


@pytest.mark.parametrize("with_metadata", [False, True])
def test_a_stream_the_upstream_breaks_off_ends_with_an_sse_error_event(dying, profile_root, with_metadata):
    """Issue 24: the client used to get a cut-off stream and no word why. Now it gets the whole
    events the upstream sent, never the half event, then the engines' in-band error event and
    ``[DONE]``; the OpenAI SDK raises on it."""
    import openai

    body = {**CHAT, "stream": True, **({"app_metadata": META} if with_metadata else {})}
    with running_gateway([dying.url], profile_root) as gw:
        with httpx.stream("POST", gw.url + "/v1/chat/completions", json=body) as r:
            got = b"".join(r.iter_bytes())
        assert r.status_code == 200
        assert got.startswith(b"".join(DyingUpstream.EVENTS))
        rest = got[len(b"".join(DyingUpstream.EVENTS)):].split(b"\n\n")
        assert rest[0].startswith(b'data: {"error": ')       # not the half event
        error = json.loads(rest[0].removeprefix(b"data: "))["error"]
        assert error["type"] == "upstream_broken" and error["code"] == 502
        assert "mid-stream" in error["message"] and "127.0.0.1" not in error["message"]
        assert rest[1:] == [b"data: [DONE]", b""]
        assert metric(gw.url, "profiler_gateway_upstream_responses_total", upstream=dying.url,
                      outcome="stream_broken") == 1
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIError, match="mid-stream"):
            for _ in client.chat.completions.create(model="m", messages=CHAT["messages"], stream=True,
                                                    extra_body=body.get("app_metadata") and
                                                    {"app_metadata": META}):
                pass
        with httpx.stream("POST", gw.url + "/v1/responses",
                          json={"model": "m", "input": "hi", "stream": True}) as r:
            got = b"".join(r.iter_bytes())
        event = got[len(b"".join(DyingUpstream.EVENTS)):]
        assert event.startswith(b"event: error\ndata: ") and event.endswith(b"\n\n")
        assert json.loads(event.split(b"data: ", 1)[1])["type"] == "error"


def test_502_body_does_not_name_the_upstream():
    port = free_port()
    with running_gateway([f"http://127.0.0.1:{port}"]) as gw:
        r = httpx.post(gw.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert str(port) not in r.text and "127.0.0.1" not in r.text and r.json()["error"]["type"]


def test_admin_profile_needs_the_token(recorder, profile_root):
    with running_gateway([recorder.url], profile_root, admin_token="s3cret") as gw:
        assert httpx.get(gw.url + "/admin/profile").status_code == 401
        ok = httpx.get(gw.url + "/admin/profile", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["upstreams"] == [recorder.url]
        health = httpx.get(gw.url + "/healthz").json()
        assert health["upstreams"] == 1 and recorder.url not in json.dumps(health)
        assert "path" not in json.dumps(health)


#: How long the hung annotator takes, and the bound a budgeted request must stay under: far apart,
#: so the check holds on a loaded machine (a request's own cost is not what is measured).
HANG_S, BOUND_S = 20.0, 10.0


class _Hang:
    """A sidecar annotator that never answers within the budget (an ``AnnotationSource``)."""

    blocking = False
    takes_priority_inputs = False

    async def annotate(self, meta, request_id, input_tokens, advance=True, priority_inputs=None):
        await asyncio_sleep_uncancellable(HANG_S)
        return Annotation(known=True)

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


async def asyncio_sleep_uncancellable(seconds: float) -> None:
    """Sleep that ignores the first cancellation (a client library slow to unwind)."""
    import asyncio
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        await asyncio.sleep(seconds)


def test_annotate_budget_is_a_bound(recorder, profile_root):
    with running_gateway([recorder.url], annotator=_Hang(), budget_s=0.005) as gw:
        t0 = time.perf_counter()
        r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META})
        elapsed = time.perf_counter() - t0
        assert r.status_code == 200 and "sys_annotations" not in json.loads(recorder.raws[-1])
        assert elapsed < BOUND_S      # the hung annotation would take ≥ HANG_S; the budget is 5 ms
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="timeout") == 1
    with running_gateway([recorder.url], profile_root, budget_s=0.005) as gw:
        lock = gw.service.predictor._lock     # the session table held by another thread
        lock.acquire()
        try:   # neither annotate nor the observe after each call may wait on the event loop
            for i in range(3):
                t0 = time.perf_counter()
                r = httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": META},
                               timeout=2 * BOUND_S)
                assert time.perf_counter() - t0 < BOUND_S   # the lock is held until after the loop
                assert r.status_code == 200 and "sys_annotations" not in json.loads(recorder.raws[-1])
        finally:
            lock.release()
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="timeout") == 3


WRITER = """
import sys, time
from serving_hooks.gateway_log import GatewayLog
log = GatewayLog(sys.argv[1], max_age_s=3600)
for i in range(int(sys.argv[2])):
    log.write({"request_id": f"r{i}", "t_arrival": 1.0, "t_finish": 2.0,
               "request": {"app_metadata": {"workflow_type_id": "w", "workflow_id": "f", "agent_id": "a"}},
               "response": {"choices": [{"message": {"content": "x"}}],
                            "usage": {"prompt_tokens": 1, "completion_tokens": 1}}})
while log.records_written < int(sys.argv[2]):
    time.sleep(0.01)
print("ready", flush=True)
time.sleep(600)
"""


def test_kill_9_leaves_an_open_log_that_the_next_start_recovers(tmp_path):
    logs = tmp_path / "logs"
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(logs), "50"], stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert child.stdout.readline().strip() == b"ready"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    (opened,) = logs.glob("*.jsonl.open")
    assert [p for p, _ in discover([logs])] == []              # fit would skip it forever
    with open(opened, "ab") as fh:                              # as if killed mid-line
        fh.write(b'{"request_id": "torn", "t_arr')
    log = GatewayLog(logs)
    try:
        assert (log.recovered_files, log.recovered_torn_lines) == (1, 1)
        (closed,) = [p for p, _ in discover([logs])]
        lines = closed.read_bytes().splitlines()
        assert len(lines) == 50 and all(json.loads(line)["request_id"] for line in lines)
    finally:
        log.close()
    assert recover_orphans(logs) == (0, 0)                      # idempotent


def test_log_of_a_live_writer_is_left_alone(tmp_path):
    live = tmp_path / f"gateway-20260101T000000Z-{os.getppid()}-0001.jsonl.open"
    live.write_text('{"a": 1}\n')
    assert recover_orphans(tmp_path) == (0, 0) and live.exists()


def test_records_metric_counts_only_what_reached_disk(tmp_path, recorder, profile_root):
    with running_gateway([recorder.url], profile_root, log_dir=tmp_path) as gw:
        for i in range(3):
            httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": {**META, "workflow_id": f"w{i}"}})
        assert wait_for(lambda: gw.log.records_written == 3)
        fh = gw.log._fh
        real_write = fh.write

        def full_disk(data):   # ENOSPC after 10 bytes: a torn line that must not stay
            real_write(bytes(data[:10]))
            raise OSError(28, "No space left on device")

        gw.log._fh = type("Full", (), {"write": staticmethod(full_disk), "truncate": fh.truncate,
                                       "flush": fh.flush, "close": fh.close})()
        for i in range(4):
            httpx.post(gw.url + "/v1/chat/completions", json={**CHAT, "app_metadata": {**META, "workflow_id": f"x{i}"}})
        assert wait_for(lambda: gw.log.write_errors == 4)
        assert metric(gw.url, "profiler_gateway_log_records_total", outcome="written") == 3
        gw.log._fh = fh
    (closed,) = tmp_path.glob("*.jsonl")
    assert len(closed.read_bytes().splitlines()) == 3 and closed.read_bytes().endswith(b"\n")
