"""Issue 36 item 2, the gateway side: ``--sglang-sessions`` opens SGLang's own session per
workflow, tags every call of it with ``session_id`` and closes it after the workflow's last call
— the real ``openai`` client through the gateway to a fake SGLang that records the lifecycle
calls in order. (The real server, its KV released at close: tests/sglang/test_sglang_real_sessions.py.)
"""
from __future__ import annotations

import itertools
import json

import httpx
import pytest
from openai import OpenAI
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from tests.serving_helpers import fit_generated_profile, logged, metric, running_gateway, wait_for

WT = "coding_assistant"
_ids = itertools.count()


class FakeSglangSessions:
    """FakeOpenAI plus SGLang's ``/open_session`` and ``/close_session`` (0.5.23 semantics: an
    open of a session it holds answers 400 "... still open"); ``events`` in arrival order."""

    def __init__(self, held: set[str] | None = None, fail_close: bool = False) -> None:
        self.fake, self.events, self.open = FakeOpenAI(), [], set(held or ())
        self.fail_close = fail_close
        self.app = Starlette(routes=[
            Route("/open_session", self._open_session, methods=["POST"]),
            Route("/close_session", self._close_session, methods=["POST"]),
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/generate", self._generate, methods=["POST"])])

    async def _open_session(self, request: Request):
        body = json.loads(await request.body())
        self.events.append(("open", body["session_id"]))
        assert isinstance(body["capacity_of_str_len"], int)
        if body["session_id"] in self.open:
            return JSONResponse({"error": {"message": "Failed to open the session. Check if a "
                                           "session with the same id is still open."}}, 400)
        self.open.add(body["session_id"])
        return JSONResponse(body["session_id"])

    async def _close_session(self, request: Request):
        sid = json.loads(await request.body())["session_id"]
        self.events.append(("close", sid))
        if self.fail_close:
            return JSONResponse({"error": {"message": "boom"}}, 500)
        self.open.discard(sid)
        return Response(status_code=200)

    async def _chat(self, request: Request):
        body = json.loads(await request.body())
        self.events.append(("call", body.get("session_id")))
        return await self.fake._chat(request)

    async def _generate(self, request: Request):
        body = json.loads(await request.body())
        self.events.append(("call", body.get("session_id")))
        return await self.fake._native_generate(request)


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("sessions"), 60, seed=5, min_calls=20)


def _chat(c: OpenAI, meta: dict, stream: bool = False, **extra) -> None:
    r = c.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}],
                                  stream=stream, extra_body={"app_metadata": meta, **extra})
    if stream:
        list(r)


@pytest.mark.parametrize("stream", [False, True])
def test_one_session_per_workflow_opened_tagged_and_closed_after_its_last_call(stream, profile_root,
                                                                               tmp_path):
    sg = FakeSglangSessions()
    with serve_in_thread(sg.app) as up, \
            running_gateway([up.url], profile_root, dialect="sglang", sglang_sessions=True,
                            log_dir=tmp_path) as gw:
        c = OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        wf = f"s-{next(_ids)}"
        sid = f"{WT}:{wf}"
        meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": "planner"}
        _chat(c, meta, stream)
        _chat(c, {**meta, "agent_id": "coder"}, stream)
        _chat(c, {**meta, "agent_id": "reviewer", "last_call": True}, stream)
        assert wait_for(lambda: ("close", sid) in sg.events)
        assert sg.events == [("open", sid), ("call", sid), ("call", sid), ("call", sid), ("close", sid)]
        assert sg.open == set()
        assert wait_for(lambda: logged(gw) == 3)
        assert metric(gw.url, "profiler_gateway_sglang_sessions_total", event="open") == 1
        assert metric(gw.url, "profiler_gateway_sglang_sessions_total", event="close") == 1


def test_a_session_the_server_holds_counts_as_open_and_client_sessions_are_left_alone(profile_root):
    wf = f"s-{next(_ids)}"
    sid = f"{WT}:{wf}"
    sg = FakeSglangSessions(held={sid}, fail_close=True)     # e.g. opened before a gateway restart
    with serve_in_thread(sg.app) as up, \
            running_gateway([up.url], profile_root, dialect="sglang", sglang_sessions=True) as gw:
        c = OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": "planner"}
        _chat(c, meta)
        assert sg.events == [("open", sid), ("call", sid)]
        # SGLang's native /generate: session_id at the top level too
        r = httpx.post(gw.url + "/generate", json={"text": "plan", "app_metadata": meta,
                                                   "sampling_params": {"max_new_tokens": 4}})
        assert r.status_code == 200 and sg.events[-1] == ("call", sid)
        # a client that runs its own SGLang session keeps it, and the gateway manages nothing
        own = f"s-{next(_ids)}"
        _chat(c, {**meta, "workflow_id": own, "last_call": True}, session_id="client-own")
        assert sg.events[-1] == ("call", "client-own") and ("open", f"{WT}:{own}") not in sg.events
        _chat(c, {**meta, "agent_id": "reviewer", "last_call": True})
        assert wait_for(lambda: sg.events[-1] == ("close", sid))
        assert metric(gw.url, "profiler_gateway_sglang_sessions_total", event="close_failed") == 1
        assert metric(gw.url, "profiler_gateway_sglang_sessions_total", event="open") == 1


def test_off_by_default_and_only_for_the_sglang_dialect(profile_root):
    sg = FakeSglangSessions()
    with serve_in_thread(sg.app) as up:
        for opts in ({"dialect": "sglang"}, {"dialect": "vllm", "sglang_sessions": True}):
            with running_gateway([up.url], profile_root, **opts) as gw:
                c = OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
                _chat(c, {"workflow_type_id": WT, "workflow_id": f"s-{next(_ids)}",
                          "agent_id": "planner", "last_call": True})
    assert [e for e, _ in sg.events] == ["call", "call"] and all(s is None for _, s in sg.events)


def test_an_unannotated_last_call_still_closes_its_session(profile_root):
    """Over the annotation budget the call goes out unannotated; the client's last_call still ends
    the workflow's SGLang session."""
    sg = FakeSglangSessions()
    with serve_in_thread(sg.app) as up, \
            running_gateway([up.url], profile_root, dialect="sglang", sglang_sessions=True,
                            budget_s=0.0) as gw:
        wf = f"s-{next(_ids)}"
        _chat(OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0),
              {"workflow_type_id": WT, "workflow_id": wf, "agent_id": "planner", "last_call": True})
        assert wait_for(lambda: ("close", f"{WT}:{wf}") in sg.events)
        assert "sys_annotations" not in sg.fake.received[-1].body


def test_a_workflow_spread_over_two_upstreams_is_closed_on_both(profile_root):
    a, b = FakeSglangSessions(), FakeSglangSessions()
    with serve_in_thread(a.app) as ua, serve_in_thread(b.app) as ub, \
            running_gateway([ua.url, ub.url], profile_root, dialect="sglang",
                            sglang_sessions=True) as gw:          # round robin: a, b, a
        c = OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        wf = f"s-{next(_ids)}"
        sid = f"{WT}:{wf}"
        meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": "planner"}
        for last in (False, False, True):
            _chat(c, {**meta, "last_call": last})
        assert wait_for(lambda: ("close", sid) in a.events and ("close", sid) in b.events)
    assert [e for e, _ in a.events] == ["open", "call", "call", "close"]
    assert [e for e, _ in b.events] == ["open", "call", "close"]
