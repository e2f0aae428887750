"""Issue 36 item 2 on a real SGLang 0.5.23 server (CPU): ``--enable-session-radix-cache`` and
the gateway's ``--sglang-sessions``.

The gateway opens one SGLang session per workflow and closes it after the workflow's last call
(on a plain server, and on one with the project's plugin loaded too: they compose).
The server's own cache state shows the KV released at the close: a session's KV is held
(eviction takes unreferenced KV first), so under memory pressure an open workflow's prompt
stays cached; once its session is closed, the same pressure evicts it. Read from outside the
scheduler with ``/generate``'s ``meta_info.cached_tokens`` on a probe of each prompt.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.sglang.real_server import SGLangServer, build_tiny_model, missing_server_modules
from tests.serving_helpers import fit_generated_profile, metric, running_gateway, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

POOL_TOKENS = 4096          # KV pool: two held prompts (~700 tokens each) + one filler fit
WT = "coding_assistant"
MISSING = missing_server_modules()


@pytest.fixture(scope="module", params=["plain", "with_plugin"])
def server(request, tmp_path_factory):
    """``plain``: no plugin — SGLang's own mechanism alone releases the KV. ``with_plugin``: the
    project's plugin and its ``workflow-retention`` backend loaded too (they compose: session
    references order eviction before the retention rank; the plugin also drops the ended
    session's tail on ``custom_params.session_end``)."""
    if MISSING:
        pytest.skip(f"a real SGLang server needs {', '.join(MISSING)} (.ci/run installs the CPU stack "
                    "and the server's extra packages)")
    root = tmp_path_factory.mktemp(f"sglang_sessions_{request.param}")
    plugin = request.param == "with_plugin"
    srv = SGLangServer(build_tiny_model(root / "model"), root / "server.log", extra_args=[
        "--max-total-tokens", str(POOL_TOKENS), "--enable-session-radix-cache",
        "--enable-cache-report",
        *(["--radix-cache-backend", "workflow-retention"] if plugin else [])],
        env={"AWP_SGLANG_PLUGIN": "1" if plugin else "0"})
    srv.plugin = plugin
    srv.start()
    print(f"\nSGLang server ready in {srv.startup_s:.1f}s on {srv.url}")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return fit_generated_profile(tmp_path_factory.mktemp("profile"), 40, seed=11, min_calls=5)


def _words(n: int, tag: str) -> str:
    from serving_hooks.replay_prompts import words
    return words(n, tag, 0)


def _generate(url: str, text: str, **body) -> dict:
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": {
        "max_new_tokens": 4, "temperature": 0}, **body}, timeout=120, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _pressure(url: str, tag: str, n: int = 8) -> None:
    """Calls of no session that together need more KV than the pool has free: eviction runs."""
    for i in range(n):
        _generate(url, _words(1200, f"{tag}{i}"))


def test_gateway_session_close_releases_the_workflows_kv(server, profile):
    prompts = {"keep": _words(700, "alpha"), "end": _words(700, "beta")}
    with running_gateway([server.url], profile, dialect="sglang", sglang_sessions=True) as gw:
        meta = {w: {"workflow_type_id": WT, "workflow_id": f"wf-{w}", "agent_id": "planner"}
                for w in prompts}
        for w, text in prompts.items():                     # first call: session opened, tagged
            info = _generate(gw.url, text, app_metadata=meta[w])
            assert info["prompt_tokens"] > 600
        assert metric(gw.url, "profiler_gateway_sglang_sessions_total", event="open") == 2
        plain = _words(700, "gamma")
        _generate(server.url, plain)                        # the control: no session
        _pressure(server.url, "f")
        held = {w: _generate(server.url, t)["cached_tokens"] for w, t in prompts.items()}
        # the pressure evicts KV no session holds, and both open sessions' KV survived it
        assert _generate(server.url, plain)["cached_tokens"] < 50
        assert all(held[w] >= 650 for w in prompts), held
        # the "end" workflow's last call: the gateway closes its session once the answer is in
        _generate(gw.url, prompts["end"] + " done",
                  app_metadata={**meta["end"], "agent_id": "reviewer", "last_call": True})
        assert wait_for(lambda: metric(gw.url, "profiler_gateway_sglang_sessions_total",
                                       event="close") == 1)
        _pressure(server.url, "g")
        after = {w: _generate(server.url, t)["cached_tokens"] for w, t in prompts.items()}
    print(f"\ncached tokens of each prompt under pressure: sessions open {held}, "
          f"after closing 'end' {after}")
    assert after["keep"] >= 650, after          # still open: still held
    assert after["end"] < 50, after             # closed: released, and evicted first
    log = server.log_text()
    assert "Session opened: coding_assistant:wf-end" in log
    assert ("agent-workflow plugin active" in log) is server.plugin
