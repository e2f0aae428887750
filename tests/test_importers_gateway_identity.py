"""A profile fitted from Claude Code / Codex session files serves calls that carry only those
agents' own headers: the importers give a session the identity the gateway derives from its
headers with the default identity map (``claude_code`` / ``codex``, the session id, ``main``)."""
from __future__ import annotations

from pathlib import Path

import pytest
from openai import OpenAI

from fitting.profile_fit import FitOptions, fit_profile
from store.importers import convert
from serving_hooks.identity import IdentityMap, resolve_identity
from serving_hooks.shadow import ShadowGate
from tests.serving_helpers import running_gateway

FIX = Path(__file__).parent / "fixtures" / "importers"
CLAUDE_SID = "2f8b1c4d-6a73-4e9b-91c0-5d7f3a8e2b46"
CODEX_SID = "01a7c9e4-6d12-7b3a-9f42-8c6d5e1a0b73"


@pytest.fixture(scope="module")
def session_profile(tmp_path_factory):
    root = tmp_path_factory.mktemp("sessions")
    # the fixture sessions and three more of each (the same files under other session ids), so
    # that bands can be validated by workflow
    for src, sid in ((FIX / "claude_code" / "-workspace-project" / f"{CLAUDE_SID}.jsonl", CLAUDE_SID),
                     (next((FIX / "codex").rglob("rollout-*.jsonl")), CODEX_SID)):
        for k in range(4):
            new = sid if k == 0 else f"{sid[:-4]}{k:04d}"
            (root / "src" / f"{k}").mkdir(parents=True, exist_ok=True)
            (root / "src" / f"{k}" / src.name.replace(sid, new)).write_text(src.read_text().replace(sid, new))
    result = convert("auto", [root / "src"], root / "logs")
    assert result.records == 4 * (10 + 9)
    fit_profile([root / "logs"], root / "profile", options=FitOptions(min_calls=5))
    return root / "profile"


@pytest.mark.parametrize("headers, identity", [
    ({"x-claude-code-session-id": CLAUDE_SID}, ("claude_code", CLAUDE_SID, "main")),
    ({"thread-id": CODEX_SID}, ("codex", CODEX_SID, "main")),
    ({"thread-id": "child", "x-codex-parent-thread-id": CODEX_SID}, ("codex", CODEX_SID, "subagent")),
    # OpenCode (anomalyco/opencode packages/opencode/src/session/llm/request.ts): x-session-id,
    # x-opencode-session towards its hosted providers, x-parent-session-id in a child session
    ({"x-session-id": "ses_a"}, ("opencode", "ses_a", "main")),
    ({"x-opencode-session": "ses_a"}, ("opencode", "ses_a", "main")),
    ({"x-session-id": "ses_b", "x-parent-session-id": "ses_a"}, ("opencode", "ses_a", "subagent")),
])
def test_default_identity_map_matches_the_imported_identity(headers, identity):
    meta, _, _ = resolve_identity({"model": "m"}, headers)
    assert (meta["workflow_type_id"], meta["workflow_id"], meta["agent_id"]) == identity


@pytest.mark.parametrize("headers, workflow_type", [
    ({"x-claude-code-session-id": CLAUDE_SID}, "claude_code"),
    ({"thread-id": CODEX_SID}, "codex"),
])
def test_header_only_calls_are_annotated_from_the_imported_profile(upstream, session_profile, headers,
                                                                   workflow_type):
    # the shadow gate's 100-call floor is for production; the fixture sessions hold 9-17 calls
    with running_gateway([upstream.url], session_profile, dialect="sglang", gate=ShadowGate(min_calls=1)) as gw:
        c = OpenAI(base_url=gw.url + "/v1", api_key="x", default_headers=headers)
        c.chat.completions.create(model="m", messages=[{"role": "user", "content": "plan"}])
        ann = upstream.received[-1].body["sys_annotations"]
        assert ann["known"] is True, (ann.get("reason"), ann.get("detail"))  # no app_metadata, no identity map: the headers alone
        assert ann["workflow_type_id"] == workflow_type and ann["workflow_id"] == headers.popitem()[1]


def test_an_opencode_subagent_session_is_served_as_its_parent_workflow(upstream, session_profile):
    """OpenCode runs a sub-agent (its task tool) in a child session whose calls carry
    ``x-parent-session-id``: through a real gateway they advance the parent's workflow session,
    as the identity map's ``subagent`` agent, and no session of their own is opened. The map
    points OpenCode's calls at a workflow type of the profile, as a user does for their app."""
    parent, child = "ses_parent0001", "ses_child0002"
    idmap = IdentityMap(workflow_type_from="default", default_workflow_type="codex",
                        harnesses=("opencode",))
    with running_gateway([upstream.url], session_profile, dialect="sglang", identity=idmap,
                         gate=ShadowGate(min_calls=1)) as gw:
        for k, headers in enumerate(({"x-session-id": parent},
                                     {"x-session-id": child, "x-parent-session-id": parent},
                                     {"x-session-id": child, "x-parent-session-id": parent})):
            c = OpenAI(base_url=gw.url + "/v1", api_key="x", default_headers=headers)
            # distinct bodies: an identical one within --retry-window is a retry, not a call
            c.chat.completions.create(model="m", messages=[{"role": "user", "content": f"step {k}"}])
        anns = [r.body["sys_annotations"] for r in upstream.received[-3:]]
        assert [(a["workflow_id"], a["agent_id"]) for a in anns] == \
            [(parent, "main"), (parent, "subagent"), (parent, "subagent")]
        sessions = gw.service.predictor.sessions
        assert sessions.find("codex", parent).agents == ["main", "subagent", "subagent"]
        assert sessions.find("codex", child) is None
