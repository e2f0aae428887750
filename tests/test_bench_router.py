"""The real sglang-router (bench/engine_router.py) in front of two fake OpenAI workers: it proxies
streams with the fields the replay needs (``ignore_eos``, ``stream_options``, the usage chunk), and
its default cache_aware policy sends a prompt that extends an earlier one to the worker that
served it. (The other rule the simulator's model of it assumes — a miss goes to the worker with
fewer requests in flight — holds against real SGLang workers, whose in-flight counts the router
tracks; with these fake workers, which lack SGLang's ``/server_info``, sglang-router 0.3.2 keeps
every worker's load at 0 and sends every miss to the same worker, so it is not tested here.)
Skipped when sglang-router (the 'bench' extra) is not installed."""
from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from bench.engine_router import SGLangRouter, router_available
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from tests.sglang.real_server import free_port

pytestmark = pytest.mark.skipif(not router_available(), reason="sglang-router not installed (pip install -e '.[bench]')")


def _with_health(fake: FakeOpenAI) -> Starlette:
    return Starlette(routes=[Route("/health", lambda r: PlainTextResponse("ok")), Mount("/", app=fake.app)])


def _text(seed: int) -> str:
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    return " ".join(words[(seed * 7 + i * (seed + 3)) % len(words)] for i in range(120))


def _chat(url: str, content: str, headers: dict | None = None) -> list[str]:
    body = {"model": "fake-model", "messages": [{"role": "user", "content": content}], "max_tokens": 4,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=30,
                      trust_env=False) as resp:
        assert resp.status_code == 200
        return [line for line in resp.iter_lines() if line.startswith("data:")]


def _served_by(fakes: list[FakeOpenAI], content: str) -> int:
    hits = [i for i, f in enumerate(fakes) for r in f.received if r.body and r.body["messages"][0]["content"] == content]
    assert len(hits) == 1
    return hits[0]


@pytest.mark.slow
def test_router_proxies_streams_and_routes_cache_aware(tmp_path):
    fakes = [FakeOpenAI(), FakeOpenAI()]
    with serve_in_thread(_with_health(fakes[0])) as a, serve_in_thread(_with_health(fakes[1])) as b, \
            SGLangRouter([a.url, b.url], free_port(), tmp_path / "router.log") as router:
        lines = _chat(router.url, _text(1))
        assert any('"usage"' in line for line in lines) and lines[-1].strip() == "data: [DONE]"
        first = _served_by(fakes, _text(1))
        body = next(r.body for r in fakes[first].received)
        assert body["ignore_eos"] is True and body["stream_options"] == {"include_usage": True}

        # a prompt that extends the first one (match share > 0.3) goes where the first went
        _chat(router.url, _text(1) + " and more words")
        assert _served_by(fakes, _text(1) + " and more words") == first


@pytest.mark.slow
def test_router_strips_hints_and_identity(tmp_path):
    """sglang-router 0.3.2 re-serialises a chat request from its own typed struct: SGLang's
    ``priority`` / ``custom_params`` / ``rid`` and the gateway's identity headers do not reach the
    worker (docs/sglang.md, "Why the hints cannot ride behind sglang-router 0.3.2"). When a router
    release forwards them, this test fails and the deployment note must change."""
    fake = FakeOpenAI()
    with serve_in_thread(_with_health(fake)) as a, SGLangRouter([a.url], free_port(), tmp_path / "router.log") as router:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                "priority": 7, "custom_params": {"awp_ttl_s": 3.5}, "rid": "abc"}
        headers = {"x-workflow-type-id": "t1", "x-workflow-id": "w1", "x-agent-id": "coder"}
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body, headers=headers, timeout=30,
                          trust_env=False) as resp:
            assert resp.status_code == 200
            resp.read()
        got = fake.received[-1]
        assert got.body["ignore_eos"] is True                   # SGLang's sampling extensions pass
        assert not {"priority", "custom_params", "rid"} & set(got.body)
        assert not {h for h in got.headers if h.startswith("x-workflow") or h == "x-agent-id"}
