"""A real SGLang server (``python -m sglang.launch_server``) with the project's plugin, over HTTP.

One server per module (start-up is most of the cost): a tiny Qwen2 config with random weights
(``--load-format dummy``) and a tokenizer trained here, on CPU with the stand-ins of
``cpu_standins/``, with priority scheduling, the ``workflow-retention`` radix-cache backend and
HiCache. Everything is observed from outside the scheduler process: finish order, the
``cached_tokens_details`` of ``/generate``, ``/v1/loads`` and the plugin's log lines
(``AWP_SGLANG_DEBUG=1``).
"""
from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from serving_hooks.annotations import flatten_for_sglang
from tests.sglang.real_server import SGLangServer, build_tiny_model, missing_server_modules
from tests.serving_helpers import fit_generated_profile, metric, running_gateway, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.sglang]

POOL_TOKENS = 2048
MISSING = missing_server_modules()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if MISSING:
        pytest.skip(f"a real SGLang server needs {', '.join(MISSING)} (.ci/run installs the CPU stack "
                    "and the server's extra packages)")
    root = tmp_path_factory.mktemp("sglang_server")
    model = build_tiny_model(root / "model")
    srv = SGLangServer(model, root / "server.log", extra_args=[
        "--max-total-tokens", str(POOL_TOKENS), "--max-running-requests", "2",
        "--enable-priority-scheduling", "--schedule-policy", "fcfs", "--default-priority-value", "250",
        "--disable-priority-preemption",   # queued order only: no race with a running call
        "--retraction-policy", "priority", "--radix-cache-backend", "workflow-retention",
        "--enable-hierarchical-cache", "--hicache-ratio", "4", "--hicache-write-policy", "write_back",
        "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first", "--enable-cache-report",
    ], env={"AWP_SGLANG_PLUGIN": "1", "AWP_SGLANG_DEBUG": "1", "AWP_LOG_EVERY_S": "2",
           "AWP_KEEP_IDLE": "1"})
    srv.start()
    print(f"\nSGLang server ready in {srv.startup_s:.1f}s on {srv.url}")
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    """A profile fitted on 40 generated coding-assistant workflows (logs under ``<root>/logs``)."""
    return fit_generated_profile(tmp_path_factory.mktemp("profile"), 40, seed=11, min_calls=5)


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30, trust_env=False).json()["data"][0]["id"]


def _loads(url: str) -> dict:
    return httpx.get(url + "/v1/loads", timeout=30, trust_env=False).json()["loads"][0]


def _words(n: int, tag: str) -> str:
    from serving_hooks.replay_prompts import words
    return words(n, tag, 0)


def _first_times(log: str, kind: str, rids: list[str]) -> dict[str, float]:
    """The scheduler-clock time ``t`` of each rid's first ``awp-decision <kind>`` line: ``priority``
    is logged as the request joins the waiting queue, ``finish`` as the scheduler finishes it."""
    found: dict[str, float] = {}
    for rid, t in re.findall(rf"awp-decision {kind} rid=(\S+) (?:.*? )?t=([0-9.]+)", log):
        found.setdefault(rid, float(t))
    return {r: found[r] for r in rids if r in found}


def finish_order(server: SGLangServer, rids: list[str]) -> list[str]:
    """``rids`` in the order the scheduler finished them (the plugin's ``finish`` lines).

    Not the order the responses reach the client: two calls finishing in one decode step, or a
    short call finishing a few steps after another, can swap on the way out under a busy CPU."""
    done = _first_times(server.log_text(), "finish", rids)
    return sorted(done, key=done.get)


FIVE = ("high0", "high1", "low0", "low1", "low2")


def contention_scene(server: SGLangServer, send, tag: str, tries: int = 3) -> list[str]:
    """Two long calls fill both running slots; three low calls queue, then two high ones; returns
    the five names in the order the scheduler finished them.

    ``send(name, rid, max_tokens)`` makes one call (blocking) for ``block0/1``, ``low0..2`` and
    ``high0/1``. The scene only tests something when all five were queued before a blocker
    finished: on a busy machine a blocker (900 tokens, about 2 s on CPU) can end first. That is
    judged from the scheduler's own times (``priority`` vs ``finish`` lines); a scene that lost
    the race is played again with fresh rids, up to ``tries`` times, and never scored."""
    for attempt in range(tries):
        rid = {n: f"{tag}{attempt}-{n}" for n in ("block0", "block1", *FIVE)}
        errors: list[BaseException] = []

        def run(name: str, max_tokens: int) -> threading.Thread:
            def target() -> None:
                try:
                    send(name, rid[name], max_tokens)
                except BaseException as exc:   # surfaced below: a thread's assert fails nothing
                    errors.append(exc)
            t = threading.Thread(target=target)
            t.start()
            return t

        def a_blocker_finished() -> bool:
            return bool(finish_order(server, [rid["block0"], rid["block1"]]))

        def until(n_running: int = 0, n_waiting: int = 0) -> bool:
            """Wait (polling /v1/loads) for that many running / waiting calls, or a blocker's end."""
            def ready() -> bool:
                loads = _loads(server.url)
                return (loads["num_running_reqs"] >= n_running and loads["num_waiting_reqs"] >= n_waiting) \
                    or a_blocker_finished()
            return wait_for(ready, 180, every_s=0.05)

        threads = [run(f"block{i}", 900) for i in range(2)]
        assert until(n_running=2)
        threads += [run(f"low{i}", 20) for i in range(3)]
        assert until(n_waiting=3)
        # two high calls: with two running slots they form the first batch after the blockers, so
        # they finish before any low call starts (a third would share a batch with a low one)
        threads += [run(f"high{i}", 20) for i in range(2)]
        assert until(n_waiting=5)
        for t in threads:
            t.join(300)
        assert not errors, errors
        log = server.log_text()
        queued = _first_times(log, "priority", [rid[n] for n in FIVE])
        freed = _first_times(log, "finish", [rid["block0"], rid["block1"]])
        assert len(queued) == 5 and len(freed) == 2, (queued, freed)
        if max(queued.values()) < min(freed.values()):
            by_rid = {v: k for k, v in rid.items()}
            return [by_rid[r] for r in finish_order(server, [rid[n] for n in FIVE])]
    pytest.fail(f"in {tries} tries a blocking call always finished before all five calls were queued")


def test_plugin_is_active_in_the_scheduler(server):
    assert wait_for(lambda: "agent-workflow plugin active" in server.log_text(), 120), server.log_tail()
    line = next(l for l in server.log_text().splitlines() if "agent-workflow plugin active" in l)
    assert "backend=workflow-retention in_use=True" in line and "clock=local" in line
    assert "default_priority_value=250" in line


def test_priority_changes_completion_order_under_contention(server, model_name):
    """Two long calls fill both running slots; three low calls queue, then two high ones (all
    five waiting, preemption off): the high ones run, and finish, before every low one."""
    def send(name: str, rid: str, max_tokens: int) -> None:
        body = {"model": model_name, "messages": [{"role": "user", "content": _words(20, name)}],
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "rid": rid,
                "priority": 100_000 if name.startswith("high") else 0}
        r = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300, trust_env=False)
        assert r.status_code == 200, r.text

    order = contention_scene(server, send, "prio")
    assert len(order) == 5 and sorted(order[:2]) == ["high0", "high1"], order
    # the plugin took the client's explicit values as the base (precedence 1)
    assert re.search(r"awp-decision priority rid=\S+ priority=100000 source=client", server.log_text())


def _keep_params(wf: str) -> dict:
    """custom_params of a call whose session goes on, after a tool with p95 = 100 s (keep)."""
    ann = {"known": True, "expected_remaining_calls": 3.0, "p_end": 0.05,
           "next_agents": [{"agent_id": "coder", "p": 0.9}],
           "tool_latency": {"bash": {"mu": 3.0, "sigma": 0.5, "p50_s": 20.0, "p95_s": 100.0}}}
    return flatten_for_sglang(ann, {"workflow_type_id": "ca", "workflow_id": wf, "agent_id": "coder"})


def _drop_params(wf: str) -> dict:
    """custom_params of a session's predicted last call (drop)."""
    ann = {"known": True, "expected_remaining_calls": 0.0, "p_end": 0.95, "next_agents": []}
    return flatten_for_sglang(ann, {"workflow_type_id": "ca", "workflow_id": wf, "agent_id": "coder"})


def _generate(url: str, text: str, custom_params: dict | None = None) -> dict:
    sp = {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0}
    if custom_params:
        sp["custom_params"] = custom_params
    r = httpx.post(url + "/generate", json={"text": text, "sampling_params": sp}, timeout=300, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def test_retention_keeps_the_kept_session_and_evicts_dropped_ones(server):
    """Under LRU the oldest prefix (the kept session's) would be evicted first; with the
    workflow-retention backend the dropped sessions go instead."""
    kept = _words(300, "kept-session")
    first = _generate(server.url, kept, _keep_params("wf-keep"))
    dropped = [_words(300, f"dropped-{i}") for i in range(9)]          # 9 x ~300 > 2048-token pool
    for i, text in enumerate(dropped):
        _generate(server.url, text, _drop_params(f"wf-drop-{i}"))
    again = _generate(server.url, kept + " " + _words(10, "next"))
    revisit = _generate(server.url, dropped[0] + " " + _words(10, "next"))
    device_kept = (again["cached_tokens_details"] or {}).get("device", 0)
    device_dropped = (revisit["cached_tokens_details"] or {}).get("device", 0)
    assert device_kept >= 0.9 * first["prompt_tokens"], (again, server.log_tail())
    assert device_dropped < 0.5 * first["prompt_tokens"], revisit
    log = server.log_text()
    assert "rank=KEEP" in log and "rank=DROP" in log and "session=wf-keep" in log


def test_prefetch_stages_a_confident_next_prefix_to_host(server):
    """A call whose next agent is predicted with p = 0.9 gets its history staged to the HiCache
    host tier by the plugin (counters); after newer untagged calls push it off the device, the
    session's next call is served from host (``cached_tokens_details.host``). (In write-back
    mode SGLang also backs a prefix up when it evicts it; the counters show the plugin's copy.)"""
    ann = {"known": True, "expected_remaining_calls": 0.0, "p_end": 0.95,    # dropped first...
           "next_agents": [{"agent_id": "coder", "p": 0.9}], "output_len_mean": 4,   # ...but announced
           "predicted_output_len": [4, 4]}
    params = flatten_for_sglang(ann, {"workflow_type_id": "ca", "workflow_id": "wf-pre", "agent_id": "coder"})
    text = _words(300, "prefetched-session")
    first = _generate(server.url, text, params)

    def staged() -> bool:
        lines = [l for l in server.log_text().splitlines() if "plugin counters" in l]
        m = re.search(r"prefetch_staged=(\d+)", lines[-1]) if lines else None
        return bool(m and int(m.group(1)) >= 1)

    assert wait_for(staged, 120), server.log_tail()
    for i in range(9):                       # untagged pressure: plain LRU, newer than ours
        _generate(server.url, _words(300, f"pressure-{i}"))
    again = _generate(server.url, text + " " + _words(10, "next"))
    details = again["cached_tokens_details"] or {}
    print("prefetch test:", again["cached_tokens"], details)
    assert details.get("host", 0) >= 0.9 * first["prompt_tokens"], (again, server.log_tail())


def test_capacity_router_polls_the_real_server(server, model_name):
    from serving_hooks.routing import CapacityRouter

    router = CapacityRouter([server.url])
    router.poll_once_blocking()
    load = router.loads()[server.url]
    assert load.capacity_tokens == POOL_TOKENS
    body = {"model": model_name, "messages": [{"role": "user", "content": _words(200, "load")}],
            "max_tokens": 800, "ignore_eos": True}
    t = threading.Thread(target=lambda: httpx.post(server.url + "/v1/chat/completions", json=body,
                                                   timeout=300, trust_env=False))
    t.start()

    def busy() -> bool:
        router.poll_once_blocking()
        return router.loads()[server.url].reported_tokens > 0

    assert wait_for(busy, 180)
    t.join(300)
    assert router.metrics()["poll_ok"] >= 2


def test_replay_through_the_gateway_reaches_the_scheduler(server, profile, tmp_path):
    """`profiler replay` of generated workflows through `profiler gateway --sglang-fields`:
    every call's gateway priority and session reach the plugin in the scheduler, and the
    replay's prefix-sharing prompts hit the real radix cache."""
    from serving_hooks.replay import ReplayOptions, replay
    from serving_hooks.replay_plan import load_plan
    from serving_hooks.replay_report import summarize

    plan, _ = load_plan([profile.parent / "logs"], max_workflows=3, token_scale=0.02)
    log_dir = tmp_path / "gwlog"
    with running_gateway([server.url], profile, log_dir=log_dir, sglang_fields=True) as gw:
        result = replay(plan, gw.url, ReplayOptions(concurrency=2, time_scale=0.002, run_tag="gw"))
    s = summarize(result)
    assert s["calls"]["errors"] == 0, s["errors"]
    assert s["calls"]["count"] == sum(len(w.calls) for w in plan)
    assert s["tokens"]["cached"] > 0 and s["workflows"]["jct_s"]["p95"] > 0
    sessions = {w.workflow_id for w in result.workflows}
    log = server.log_text()
    seen = set(re.findall(r"awp-decision priority rid=\S+ priority=-?\d+ source=gateway session=(\S+)", log))
    assert sessions <= seen, (sessions, seen)


def test_gateway_priorities_change_completion_order(server, profile, model_name):
    """Through `profiler gateway --sglang-fields`: two sessions that reached their last agent
    (the profile predicts no call after it: a high priority) overtake three sessions' first
    calls (ten or so calls to go: a low priority) queued before them."""
    agents = ["planner", "explorer", "chronicler", "architect", "engineer", "engineer", "engineer",
              "reviewer"]
    n_gateway_calls = 0

    def call(url: str, rid: str, session: str, agent: str, max_tokens: int, priority: int | None = None) -> None:
        body = {"model": model_name, "messages": [{"role": "user", "content": _words(20, rid)}],
                "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0, "rid": rid,
                "app_metadata": {"workflow_type_id": "coding_assistant", "workflow_id": session, "agent_id": agent}}
        if priority is not None:
            body["priority"] = priority
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300, trust_env=False)
        assert r.status_code == 200, r.text

    # The default test budget (30 s), not 1 s: under a CPU-heavy neighbour a call annotated over
    # budget goes out untagged (fail-open) and loses its priority — a run of the suite beside a
    # CPU hog failed that way. The assertion below checks every gateway call was annotated.
    with running_gateway([server.url], profile, sglang_fields=True) as gw:
        def send(name: str, rid: str, max_tokens: int) -> None:
            nonlocal n_gateway_calls
            scene_id = rid.split("-")[0]         # each scene has its own sessions
            if name.startswith("block"):
                call(server.url, rid, f"order-block-{rid}", "x", max_tokens, priority=0)
                return
            n_gateway_calls += 1
            kind, agent = ("low", "planner") if name.startswith("low") else ("high", "verifier")
            call(gw.url, rid, f"order-{kind}-{scene_id}-{name[-1]}", agent, max_tokens)

        order = None
        for attempt in range(3):                 # a scene that lost its set-up race is played anew
            scene_id = f"gw{attempt}0"           # contention_scene's rids: f"{tag}{try}-{name}"
            for i in range(2):                   # walk two fresh sessions up to their last agent
                for j, agent in enumerate(agents):
                    n_gateway_calls += 1
                    call(gw.url, f"walk-{scene_id}-{i}-{j}", f"order-high-{scene_id}-{i}", agent, 1)
            try:
                order = contention_scene(server, send, f"gw{attempt}", tries=1)
                break
            except pytest.fail.Exception:
                continue
        assert order is not None, "in 3 scenes a blocking call always finished before all five were queued"
        assert metric(gw.url, "profiler_gateway_annotate_total", outcome="annotated") == n_gateway_calls
    log = server.log_text()

    def gateway_priority(session: str) -> int:
        found = re.findall(rf"awp-decision priority rid=\S+ priority=(-?\d+) source=gateway session={session}\b", log)
        assert found, f"no gateway priority for {session} reached the scheduler"
        return int(found[-1])

    high = [gateway_priority(f"order-high-{scene_id}-{i}") for i in range(2)]
    low = [gateway_priority(f"order-low-{scene_id}-{i}") for i in range(3)]
    assert min(high) > max(low) + 10, (high, low)
    # the scheduler's finish order, not the clients': through the gateway a response can overtake another
    assert len(order) == 5 and sorted(order[:2]) == ["high0", "high1"], (order, high, low)
