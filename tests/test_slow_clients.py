"""Slow clients cannot hold the sidecar or the gateway: a request body must arrive within
``body_timeout_s`` of its headers (408 beyond), while other clients are served meanwhile.

Real servers on 127.0.0.1. The slow client is a raw socket that sends its headers and part of a
declared body, then stalls; the test waits on the socket (generous 20 s cap), not on a clock.
"""
from __future__ import annotations

import json
import socket

import httpx
import pytest
from prometheus_client import CollectorRegistry

from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.sidecar import create_sidecar_app
from tests.serving_helpers import fit_generated_profile, running_gateway

META = {"workflow_type_id": "coding_assistant", "workflow_id": "w1", "agent_id": "planner"}


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("slow"), 20, seed=3, min_calls=10)


def _stall_body(host: str, port: int, path: str) -> bytes:
    """Send headers and 10 of 100 declared body bytes, then wait for whatever the server says."""
    with socket.create_connection((host, port), timeout=20) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                  "Content-Length: 100\r\n\r\n".encode() + b'{"app_meta')
        chunks = []
        try:
            while True:
                data = s.recv(65536)
                if not data:
                    break
                chunks.append(data)
                if b"\r\n\r\n" in b"".join(chunks) and b"}" in data:
                    break
        except socket.timeout:
            pass
        return b"".join(chunks)


def _check(url: str, path: str, good: dict) -> None:
    host, port = httpx.URL(url).host, httpx.URL(url).port
    with httpx.Client(base_url=url, timeout=20) as c:
        reply = _stall_body(host, port, path)
        assert reply.startswith(b"HTTP/1.1 408"), reply[:200]
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["type"] == "request_timeout"
        assert c.post(path, json=good).status_code == 200   # a normal client is served


def test_sidecar_cuts_off_a_client_that_never_finishes_its_body(profile_root):
    registry = CollectorRegistry()
    service = prediction_service(profile_root, registry, "profiler_sidecar", reload_every_s=0)
    app = create_sidecar_app(service, registry=registry, body_timeout_s=0.5)
    with serve_in_thread(app) as server:
        _check(server.url, "/v1/annotate", {"app_metadata": META, "request_id": "r1"})


def test_gateway_cuts_off_a_client_that_never_finishes_its_body(profile_root):
    with serve_in_thread(FakeOpenAI(reply_tokens=3, record=False).app) as upstream, \
            running_gateway([upstream.url], profile_root, body_timeout_s=0.5) as gw:
        _check(gw.url, "/v1/chat/completions",
               {"model": "m", "messages": [{"role": "user", "content": "hi"}], "extra_body": {"app_metadata": META}})
