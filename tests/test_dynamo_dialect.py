"""Issue 36 item 1: Dynamo as it is now — the real ``openai`` client through the gateway to a fake
Dynamo frontend that checks every field against Dynamo's own request types.

The fake (:class:`FakeDynamo`) accepts what ai-dynamo/dynamo's ``NvExt`` / ``AgentHints`` /
``AgentContext`` / ``SessionControl`` (Rust, ``lib/llm/src/protocols``) accept in the spelling
the gateway is set to speak, and answers 400 ``invalid nvext: unknown field …`` like Dynamo's
``deny_unknown_fields`` for anything else; it normalises the identity the way Dynamo's
``agents.rs`` does (its own headers first) and records it. Field names and types, with their
sources, are in docs/dialects.md ("Dynamo").
"""
from __future__ import annotations

import itertools
import json
from dataclasses import replace

import pytest
from openai import OpenAI
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from predictors.contract import Annotation
from serving_hooks.annotator import LocalAnnotator
from serving_hooks.dialects import DYNAMO_APIS, hint_values, render
from serving_hooks.fake_openai import FakeOpenAI
from serving_hooks.identity import IdentityMap, resolve_identity
from policies.session_end import SessionEndRule
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.service import prediction_service
from serving_hooks.settings import GatewaySettings, SettingsError
from tests.serving_helpers import fit_generated_profile, running_gateway

WT = "coding_assistant"
_ids = itertools.count()

#: ``NvExt`` fields of the newest Dynamo (``deny_unknown_fields``): no ``agent_context``
#: (refused since PR #10808), no ``session_control`` (removed in PR #10214), no
#: ``cache_control`` (removed in v1.1.0, PR #7790).
NVEXT_NOW = {"greed_sampling", "use_raw_prompt", "annotations", "backend_instance_id", "token_data",
             "max_thinking_tokens", "cache_salt", "extra_fields", "metadata_upload",
             "prefill_worker_id", "decode_worker_id", "dp_rank", "prefill_dp_rank", "agent_hints",
             "request_timestamp_ms", "routing_constraints", "router"}
#: Dynamo v1.2's ``NvExt`` also had these two.
NVEXT_V12 = NVEXT_NOW | {"agent_context", "session_control"}
#: ``AgentHints``: name -> (type check); ``latency_sensitivity`` (a deprecated alias) must not come.
HINTS = {"priority": lambda x: isinstance(x, int) and not isinstance(x, bool) and -2**31 <= x < 2**31,
         "strict_priority": lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32,
         "osl": lambda x: isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**32,
         "speculative_prefill": lambda x: isinstance(x, bool)}
HEADERS = {"session": ("x-dynamo-session-id", "x-dynamo-parent-session-id", "x-dynamo-session-final"),
           "trajectory": ("x-dynamo-trajectory-id", "x-dynamo-parent-trajectory-id",
                          "x-dynamo-trajectory-final")}


class FakeDynamo:
    """A Dynamo frontend for one ``api`` spelling: validates, normalises, then answers as
    :class:`FakeOpenAI` does. ``seen`` holds ``(agent context, agent hints, session control)``."""

    def __init__(self, api: str) -> None:
        self.api, self.fake, self.seen, self.refused = api, FakeOpenAI(), [], []
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    def _check(self, body: dict, h: dict) -> str | None:
        nvext = body.get("nvext") or {}
        allowed = NVEXT_V12 if self.api == "agent_context" else NVEXT_NOW
        unknown = sorted(set(nvext) - allowed)
        if unknown:
            return f"invalid nvext: unknown field `{unknown[0]}`"
        hints = nvext.get("agent_hints") or {}
        for k, v in hints.items():
            if k not in HINTS or not HINTS[k](v):
                return f"invalid nvext: agent_hints.{k} = {v!r}"
        if self.api == "agent_context":
            ctx = nvext.get("agent_context")
            if ctx is not None:
                for k in ("workflow_type_id", "workflow_id", "program_id"):
                    if not isinstance(ctx.get(k), str) or not ctx[k].strip():
                        return "agent_context required identifiers must be non-empty"
                if set(ctx) - {"workflow_type_id", "workflow_id", "program_id", "parent_program_id"}:
                    return "invalid nvext: agent_context unknown field"
            ctl = nvext.get("session_control")
            if ctl is not None:
                if not isinstance(ctl.get("session_id"), str) or set(ctl) - {"session_id", "action", "timeout"}:
                    return "invalid nvext: session_control"
                if ctl.get("action") not in (None, "open", "close"):
                    return f"invalid nvext: session_control.action {ctl.get('action')!r}"
                if "timeout" in ctl and not (isinstance(ctl["timeout"], int) and ctl["timeout"] >= 0):
                    return "invalid nvext: session_control.timeout"
        return None

    def _context(self, body: dict, h: dict) -> dict | None:
        """What Dynamo derives (``agents.rs``: its own headers; v1.2: the body)."""
        if self.api == "agent_context":
            return (body.get("nvext") or {}).get("agent_context")
        own, parent, final = HEADERS[self.api]
        is_final = (h.get(final) or "").lower() in ("true", "1", "yes")
        if h.get(own):
            return {"id": h[own], "parent": h.get(parent), "final": is_final}
        if self.api == "session":      # agents.rs: the coding agents' own headers, mapped
            root = h.get("x-claude-code-session-id")
            if root:
                child = h.get("x-claude-code-agent-id") or root
                par = h.get("x-claude-code-parent-agent-id") or (root if child != root else None)
                return {"id": child, "parent": par, "final": is_final}
            for sess, par in (("thread-id", "x-codex-parent-thread-id"),
                              ("x-session-id", "x-parent-session-id")):
                if h.get(sess):
                    return {"id": h[sess], "parent": h.get(par), "final": is_final}
        return None

    async def _chat(self, request: Request):
        body = json.loads(await request.body())
        h = {k.lower(): v for k, v in request.headers.items()}
        err = self._check(body, h)
        if err is not None:
            self.refused.append(err)
            return JSONResponse({"error": {"message": err, "type": "invalid_request_error"}},
                                status_code=400)
        nvext = body.get("nvext") or {}
        self.seen.append((self._context(body, h), nvext.get("agent_hints"), nvext.get("session_control")))
        return await self.fake._chat(request)


@pytest.fixture(scope="module")
def profile_root(tmp_path_factory):
    return fit_generated_profile(tmp_path_factory.mktemp("dynamo"), 60, seed=5, min_calls=20)


@pytest.fixture
def dynamo():
    servers = {}
    ctx = []

    def start(api: str) -> FakeDynamo:
        d = FakeDynamo(api)
        cm = serve_in_thread(d.app)
        d.url = cm.__enter__().url
        ctx.append(cm)
        servers[api] = d
        return d
    yield start
    for cm in ctx:
        cm.__exit__(None, None, None)


def sdk(gw, **kw) -> OpenAI:
    return OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, **kw)


def chat(c: OpenAI, **kw):
    return c.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}], **kw)


IDMAP = IdentityMap(workflow_type_from="default", default_workflow_type=WT)


@pytest.mark.parametrize("spelling", ["program_body", "trajectory_body", "session_headers",
                                      "trajectory_headers"])
def test_dynamo_identity_alone_is_annotated_and_sent_on_in_the_newest_spelling(
        spelling, profile_root, dynamo):
    """A call carrying only Dynamo's identity (any spelling) is annotated; the upstream (newest
    Dynamo) gets it as ``X-Dynamo-Session-*`` headers and no body field it would refuse."""
    d = dynamo("session")
    run = f"run-{next(_ids)}"
    kw: dict = {}
    if spelling == "program_body":
        kw["extra_body"] = {"nvext": {"agent_context": {
            "workflow_type_id": WT, "workflow_id": run, "program_id": f"{run}:reviewer",
            "parent_program_id": f"{run}:planner"}}}
    elif spelling == "trajectory_body":
        kw["extra_body"] = {"nvext": {"agent_context": {
            "session_type_id": WT, "session_id": run, "trajectory_id": f"{run}:reviewer",
            "parent_trajectory_id": f"{run}:planner"}}}
    elif spelling == "session_headers":
        kw["extra_headers"] = {"X-Dynamo-Session-ID": f"{run}:reviewer",
                               "X-Dynamo-Parent-Session-ID": f"{run}:planner"}
    else:
        kw["extra_headers"] = {"x-dynamo-trajectory-id": f"{run}:reviewer",
                               "x-dynamo-parent-trajectory-id": f"{run}:planner"}
    with running_gateway([d.url], profile_root, dialect="dynamo", identity=IDMAP) as gw:
        r = chat(sdk(gw), **kw)
    assert r.choices[0].message.content and not d.refused
    got = d.fake.received[-1]
    ann = got.body["sys_annotations"]
    assert ann["known"] is True and ann["workflow_id"] == run and ann["agent_id"] == "reviewer"
    assert ann["workflow_type_id"] == WT
    ctx, hints, control = d.seen[-1]
    assert ctx == {"id": f"{run}:reviewer", "parent": f"{run}:planner", "final": False}
    assert "agent_context" not in got.body["nvext"] and control is None
    assert set(hints) <= set(HINTS) and hints["priority"] == ann["priority"]
    assert hints["osl"] == round(ann["output_len_mean"])


@pytest.mark.parametrize("api", list(DYNAMO_APIS))
def test_last_call_leaves_with_the_final_flag_in_each_spelling(api, profile_root, dynamo):
    """The session's last call carries Dynamo's final flag in the upstream's spelling (header, or
    ``session_control.action: close``); earlier calls do not; nothing the version refuses is sent,
    ``latency_sensitivity`` never."""
    d = dynamo(api)
    wf = f"w-{next(_ids)}"
    meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": "planner"}
    with running_gateway([d.url], profile_root, dialect="dynamo", dynamo_api=api) as gw:
        c = sdk(gw)
        # a client that still sends the deprecated hint and an old body field
        chat(c, extra_body={"app_metadata": meta,
                            "nvext": {"agent_hints": {"latency_sensitivity": 5.0}}})
        chat(c, extra_body={"app_metadata": {**meta, "agent_id": "reviewer", "last_call": True}})
    assert not d.refused, d.refused
    (first_ctx, first_hints, first_ctl), (last_ctx, last_hints, last_ctl) = d.seen[-2:]
    assert "latency_sensitivity" not in first_hints and "latency_sensitivity" not in last_hints
    first_ann = d.fake.received[-2].body["sys_annotations"]
    if api == "agent_context":
        assert first_ctx == {"workflow_type_id": WT, "workflow_id": wf, "program_id": wf}
        if first_ann["p_end"] < 0.5:   # a return is predicted: sticky, opened on the first call
            assert first_ctl["session_id"] == wf and first_ctl["action"] == "open"
            assert first_ctl["timeout"] >= 1
        assert last_ctl == {"session_id": wf, "action": "close"}
    else:
        assert first_ctx == {"id": wf, "parent": None, "final": False}
        assert last_ctx == {"id": wf, "parent": None, "final": True}
        assert first_ctl is None and last_ctl is None


class _Interactive(LocalAnnotator):
    """The class work (issue 39) fills ``latency_class``; here the planner is interactive."""

    def annotate_now(self, app_metadata, request_id, input_tokens, **kw):
        ann = super().annotate_now(app_metadata, request_id, input_tokens, **kw)
        return replace(ann, latency_class="interactive" if app_metadata["agent_id"] == "planner"
                       else "batch")


def test_latency_class_becomes_strict_priority(profile_root, dynamo):
    d = dynamo("session")
    service = prediction_service(profile_root, CollectorRegistry(), "profiler_gateway")
    with running_gateway([d.url], annotator=_Interactive(service), dialect="dynamo") as gw:
        for agent in ("planner", "reviewer"):
            chat(sdk(gw), extra_body={"app_metadata": {"workflow_type_id": WT, "agent_id": agent,
                                                       "workflow_id": f"l-{next(_ids)}"}})
    assert not d.refused
    assert [hints["strict_priority"] for _, hints, _ in d.seen[-2:]] == [1, 0]


def test_client_final_header_is_a_declared_end_and_its_chain_is_kept(profile_root, dynamo):
    """A root chain's final flag is the client declaring the workflow's end (``last_call``);
    the client's own session header names what Dynamo closes."""
    d = dynamo("session")
    run = f"run-{next(_ids)}"
    with running_gateway([d.url], profile_root, dialect="dynamo", identity=IDMAP) as gw:
        chat(sdk(gw), extra_headers={"x-dynamo-trajectory-id": f"{run}:planner",
                                     "x-dynamo-trajectory-final": "true"})
    assert d.seen[-1][0] == {"id": f"{run}:planner", "parent": None, "final": True}
    assert d.fake.received[-1].body["sys_annotations"]["session_end"] is True


def test_coding_agent_headers_keep_dynamos_own_mapping(profile_root, dynamo):
    """Claude Code's headers name the session in Dynamo's own mapping (a child agent is its own
    session): the gateway adds no X-Dynamo-Session-ID over it, only the final flag at the end."""
    d = dynamo("session")
    root = f"cc-{next(_ids)}"
    cc = {"x-claude-code-session-id": root, "x-claude-code-agent-id": "reviewer"}
    with running_gateway([d.url], profile_root, dialect="dynamo", identity=IDMAP) as gw:
        chat(sdk(gw), extra_headers=cc)
    ann = d.fake.received[-1].body["sys_annotations"]
    assert ann["known"] is True and ann["workflow_id"] == root
    assert "x-dynamo-session-id" not in d.fake.received[-1].headers
    assert d.seen[-1][0] == {"id": "reviewer", "parent": root, "final": False}
    ends = SessionEndRule(p_threshold=1e-6)          # the end predicted: any p_end > 0 ends
    with running_gateway([d.url], profile_root, dialect="dynamo", identity=IDMAP,
                         session_end=ends) as gw:
        chat(sdk(gw), extra_headers=cc)
    assert d.seen[-1][0] == {"id": "reviewer", "parent": root, "final": True}
    assert not d.refused


def test_identity_spellings_by_hand():
    m = IdentityMap()
    got, _, src = resolve_identity({}, {"x-dynamo-session-id": "s2", "x-dynamo-parent-session-id": "s1"})
    assert (src, got["workflow_id"], got["agent_id"], got["child_session_id"]) == ("dynamo", "s1", "subagent", "s2")
    got = resolve_identity({}, {"X-Dynamo-Session-ID": "r:researcher", "x-dynamo-parent-session-id": "r:planner",
                                "x-dynamo-session-final": "true"}, m)[0]
    assert (got["workflow_id"], got["agent_id"], got["parent_agent_id"]) == ("r", "researcher", "planner")
    assert got["program_final"] is True and "last_call" not in got     # a sub-agent's end only
    body = {"nvext": {"agent_context": {"session_id": "c1", "parent_session_id": "root", "session_final": True}}}
    got = resolve_identity(body, {}, m)[0]
    assert (got["workflow_id"], got["agent_id"], got["program_id"]) == ("root", "subagent", "c1")
    empty = {"nvext": {"agent_context": {"workflow_type_id": WT, "workflow_id": "", "program_id": "x"}}}
    assert resolve_identity(empty, {}, m)[2] is None   # Dynamo refuses an empty id: not guessed
    assert resolve_identity({"nvext": {"agent_context": {"program_id": 3}}}, {}, m)[2] is None
    # the headers win over the body, as in Dynamo
    both = {"nvext": {"agent_context": {"workflow_type_id": WT, "workflow_id": "b", "program_id": "b:x"}}}
    assert resolve_identity(both, {"x-dynamo-session-id": "h:y"}, m)[0]["workflow_id"] == "h"


def test_render_dynamo_by_hand():
    ann = Annotation(known=True, workflow_type_id=WT, workflow_id="w", agent_id="a", p_end=0.2,
                     keep_alive_ttl_s=12.5, priority=7, latency_class="interactive", session_age_s=0.0)
    meta = {"program_id": "w:a", "parent_program_id": "w:root"}
    v = hint_values(ann, meta)
    patch, headers = render("dynamo", v, {"nvext": {"agent_context": {"x": 1}, "cache_salt": "t"}})
    assert patch["nvext"] == {"cache_salt": "t", "agent_hints": {
        "priority": ann.sglang_priority(), "strict_priority": 1, "speculative_prefill": True}}
    huge = hint_values(replace(ann, priority=1e9), meta)         # AgentHints.priority: an i32
    assert render("dynamo", huge, {})[0]["nvext"]["agent_hints"]["priority"] == 2**31 - 1
    assert headers == {"X-Dynamo-Session-ID": "w:a", "X-Dynamo-Parent-Session-ID": "w:root"}
    _, headers = render("dynamo", hint_values(replace(ann, session_end=True), meta), {},
                        dynamo_api="trajectory")
    assert headers["x-dynamo-trajectory-final"] == "true"
    patch, headers = render("dynamo", v, {}, dynamo_api="agent_context")
    assert headers == {} and patch["nvext"]["agent_context"] == {
        "workflow_type_id": WT, "workflow_id": "w", "program_id": "w:a", "parent_program_id": "w:root"}
    assert patch["nvext"]["session_control"] == {"session_id": "w:a", "action": "open", "timeout": 13}
    later = hint_values(replace(ann, session_age_s=4.0), meta)
    assert render("dynamo", later, {}, dynamo_api="agent_context")[0]["nvext"]["session_control"] == \
        {"session_id": "w:a"}
    ending = replace(ann, p_end=0.9)                       # no return predicted: not sticky
    assert "session_control" not in render("dynamo", hint_values(ending, meta), {},
                                           dynamo_api="agent_context")[0]["nvext"]
    with pytest.raises(ValueError, match="dynamo api"):
        render("dynamo", v, {}, dynamo_api="v9")


def test_dynamo_api_setting_is_checked():
    assert GatewaySettings().dynamo_api == "session"
    with pytest.raises(SettingsError, match="dynamo_api"):
        GatewaySettings(dynamo_api="sessions")
