"""Who is calling: ``app_metadata`` without changing the app.

The profile keys every prediction by ``(workflow_type_id, workflow_id, agent_id)``. An app can
send them itself, or the gateway derives them from what the request already carries. Sources, in
order (the first that yields a ``workflow_id`` wins; :func:`resolve_identity` names it):
``app_metadata`` (body, or under ``extra_body``), OpenAI's ``metadata``, ``claude_code``
headers, ``codex`` (``thread-id``), ``opencode`` (``x-session-id``) and ``dynamo`` (its
session / trajectory / program identity in every spelling of its recent history, headers or
``nvext.agent_context``). A chain id ``run:role`` gives workflow ``run`` and agent ``role``; a
parent makes the call a sub-agent of the parent's workflow.

The workflow type is not in any harness header; :class:`IdentityMap` says where it comes from
(``workflow_type_from``: ``harness``, ``model``, ``header:NAME`` or ``default``), loaded by
:func:`load_identity_map` from TOML or JSON (``profiler gateway --identity-map FILE``).
The table of sources, the Dynamo spellings with their PRs, and an identity-map example:
docs/dialects.md ("Identity sources (serving_hooks/identity.py)").
"""
from __future__ import annotations

import json
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from serving_hooks.annotations import find_app_metadata

#: Identity sources in the order they are tried.
SOURCES = ("app_metadata", "metadata", "claude_code", "codex", "opencode", "dynamo")
HARNESSES = SOURCES[2:]

#: Dynamo's identity headers, newest first: ``(own chain, parent chain, final flag)``
#: (ai-dynamo/dynamo ``lib/llm/src/protocols/agents.rs``: PR #10896 session names, PR #10214
#: trajectory names).
DYNAMO_HEADERS: tuple[tuple[str, str, str], ...] = (
    ("x-dynamo-session-id", "x-dynamo-parent-session-id", "x-dynamo-session-final"),
    ("x-dynamo-trajectory-id", "x-dynamo-parent-trajectory-id", "x-dynamo-trajectory-final"),
)
#: ``nvext.agent_context`` spellings: ``(workflow type, workflow, own chain, parent chain, final)``
#: keys, None where the spelling has none (Dynamo ``AgentContext``: program names in
#: ``docs/agents/agent-context.md``; trajectory names before PR #10808; session names after #10896).
DYNAMO_CONTEXT_KEYS: tuple[tuple[str | None, str | None, str, str, str | None], ...] = (
    ("workflow_type_id", "workflow_id", "program_id", "parent_program_id", None),
    ("session_type_id", "session_id", "trajectory_id", "parent_trajectory_id", "trajectory_final"),
    (None, None, "session_id", "parent_session_id", "session_final"),
)
_TRUE = ("true", "1", "yes")    # Dynamo's header_bool


@dataclass(frozen=True)
class IdentityMap:
    """How harness headers become ``app_metadata`` (docs/dialects.md)."""

    workflow_type_from: str = "harness"
    default_workflow_type: str = "default"
    default_agent: str = "main"
    subagent: str = "subagent"
    harnesses: tuple[str, ...] = HARNESSES
    agents: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        src = self.workflow_type_from
        if src not in ("harness", "model", "default") and not (src.startswith("header:") and len(src) > 7):
            raise ValueError(f"workflow_type_from {src!r}: expected harness, model, default or "
                             "header:NAME")
        bad = [h for h in self.harnesses if h not in HARNESSES]
        if bad:
            raise ValueError(f"harnesses: unknown {bad} (known: {', '.join(HARNESSES)})")


#: Harnesses whose sub-agents run in a session of their own: ``(own session headers, parent
#: session header)``. A call with the parent header is the parent's workflow (agent: the map's
#: ``subagent``), its own session kept as ``child_session_id``. OpenCode's names are read from its
#: source (anomalyco/opencode, formerly sst/opencode, ``packages/opencode/src/session/llm/
#: request.ts``): ``x-session-id`` (``x-opencode-session`` towards OpenCode's own hosted
#: providers) and, in a child session (the task tool's sub-agent), ``x-parent-session-id``.
SESSION_HEADERS: dict[str, tuple[tuple[str, ...], str]] = {
    "codex": (("thread-id",), "x-codex-parent-thread-id"),
    "opencode": (("x-session-id", "x-opencode-session"), "x-parent-session-id"),
}

#: How the harnesses are named to a user (start-up note).
HARNESS_NAMES = {"claude_code": "Claude Code", "codex": "Codex", "opencode": "OpenCode",
                 "dynamo": "Dynamo"}


def harness_identity_note(m: IdentityMap, profile_types: Collection[str]) -> str | None:
    """A start-up line when calls identified by harness headers alone cannot be predicted.

    With the default map a Claude Code call's workflow type is ``claude_code`` (the harness
    name), which a profile fitted on the app's own logs seldom holds: every such call is then
    forwarded unannotated and nothing said so (issue 24). None when the map can give a type the
    profile holds, or when the type comes from each request (``model``, a header that is set)."""
    if not m.harnesses:
        return None
    if m.workflow_type_from == "harness":
        types = list(m.harnesses)
    elif m.workflow_type_from == "default":
        types = [m.default_workflow_type]
    else:   # "model" / "header:NAME": decided per request
        return None
    if any(t in profile_types for t in types):
        return None
    held = ", ".join(sorted(profile_types)[:5]) + (", …" if len(profile_types) > 5 else "")
    return (f"calls identified only by agent-harness headers "
            f"({', '.join(HARNESS_NAMES[h] for h in m.harnesses)}) get workflow type "
            f"{' / '.join(types)}, which the profile does not hold ({held or 'no types'}): they "
            "are forwarded without predictions. Map them with --identity-map "
            "(default_workflow_type, workflow_type_from; docs/dialects.md).")


def load_identity_map(path: str | Path) -> IdentityMap:
    """An :class:`IdentityMap` from a ``.toml`` or ``.json`` file (one-line error naming it)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text()) if p.suffix == ".toml" else json.loads(p.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{p}: cannot read identity map: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: identity map must be a table/object")
    known = set(IdentityMap.__dataclass_fields__)
    extra = set(data) - known
    if extra:
        raise ValueError(f"{p}: unknown field(s) {sorted(extra)} (known: {sorted(known)})")
    if "harnesses" in data:
        data["harnesses"] = tuple(data["harnesses"])
    try:
        return IdentityMap(**data)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{p}: {exc}") from None


def _harness_ids(name: str, h: Mapping[str, str], m: IdentityMap) -> tuple[str, str, dict] | None:
    """``(workflow_id, agent_id, extra)`` from one harness's headers, or None."""
    if name == "claude_code":
        sid = h.get("x-claude-code-session-id")
        if not sid:
            return None
        extra = {"parent_agent_id": h["x-claude-code-parent-agent-id"]} \
            if h.get("x-claude-code-parent-agent-id") else {}
        return sid, h.get("x-claude-code-agent-id") or m.default_agent, extra
    if name in SESSION_HEADERS:
        own_names, parent_name = SESSION_HEADERS[name]
        own = next((h[n] for n in own_names if h.get(n)), None)
        if h.get(parent_name):    # a sub-agent: its calls belong to the parent's workflow
            return h[parent_name], m.subagent, {"child_session_id": own} if own else {}
        return (own, m.default_agent, {}) if own else None
    return None


def _split_chain(chain: str) -> tuple[str, str | None]:
    """``(run, role)`` of a Dynamo chain id ``run:role`` (role None without a colon)."""
    run, sep, role = chain.rpartition(":")
    return (run, role) if sep and run and role else (chain, None)


def dynamo_agent_context(body: Any) -> Mapping[str, Any] | None:
    """The body's ``nvext.agent_context`` (top level, else under ``extra_body``), or None."""
    if not isinstance(body, Mapping):
        return None
    for holder in (body, body.get("extra_body")):
        nvext = holder.get("nvext") if isinstance(holder, Mapping) else None
        ctx = nvext.get("agent_context") if isinstance(nvext, Mapping) else None
        if isinstance(ctx, Mapping):
            return ctx
    return None


def _dynamo_chain(body: Any, h: Mapping[str, str]
                  ) -> tuple[str, str | None, bool, str | None, str | None] | None:
    """``(own chain, parent chain, final, workflow type, workflow)`` from Dynamo's headers (any
    spelling, newest first) or ``nvext.agent_context`` (any spelling), or None."""
    for own_name, parent_name, final_name in DYNAMO_HEADERS:
        own = (h.get(own_name) or "").strip()
        if own:
            parent = (h.get(parent_name) or "").strip()
            final = (h.get(final_name) or "").strip().lower() in _TRUE
            return own, (parent if parent and parent != own else None), final, None, None
    ctx = dynamo_agent_context(body)
    if ctx is None:
        return None
    for type_key, wf_key, own_key, parent_key, final_key in DYNAMO_CONTEXT_KEYS:
        own = ctx.get(own_key)
        if not isinstance(own, str) or not own.strip():
            continue
        if wf_key is not None and not (isinstance(ctx.get(wf_key), str) and ctx[wf_key].strip()):
            continue   # the session-named spelling: its session_id is the chain, not a workflow
        parent = ctx.get(parent_key)
        wf_type = ctx.get(type_key) if type_key else None
        return (own.strip(), parent.strip() if isinstance(parent, str) and parent.strip() else None,
                final_key is not None and ctx.get(final_key) is True,
                wf_type.strip() if isinstance(wf_type, str) and wf_type.strip() else None,
                ctx[wf_key].strip() if wf_key else None)
    return None


def _dynamo_ids(body: Any, h: Mapping[str, str], m: IdentityMap
                ) -> tuple[str, str, dict, str | None] | None:
    """``(workflow_id, agent_id, extra, workflow type or None)`` from Dynamo's identity (module
    doc), or None."""
    found = _dynamo_chain(body, h)
    if found is None:
        return None
    own, parent, final, wf_type, workflow = found
    run, role = _split_chain(own)
    extra: dict[str, Any] = {"program_id": own}
    if parent is not None:
        prun, prole = _split_chain(parent)
        extra["parent_program_id"] = parent
        if prole is not None:
            extra["parent_agent_id"] = prole
        wf, agent = prun, role or m.subagent
        if role is None:
            extra["child_session_id"] = own
    else:
        wf, agent = run, role or m.default_agent
    if workflow is not None:          # the program spelling names its workflow outright
        wf = workflow
        if role is None and own.startswith(workflow + ":"):
            agent = own[len(workflow) + 1:]
    if final:                 # the chain's last call; a root chain's is its workflow's last
        extra["program_final"] = True
        if parent is None:
            extra["last_call"] = True
    return wf, agent, extra, wf_type


def _workflow_type(source: str, body: Mapping[str, Any], h: Mapping[str, str], m: IdentityMap) -> str:
    how = m.workflow_type_from
    if how.startswith("header:") and h.get(how[7:].lower()):
        return h[how[7:].lower()]
    if how == "model" and isinstance(body.get("model"), str) and body["model"]:
        return body["model"]
    if how == "harness":
        return source
    return m.default_workflow_type


def resolve_identity(body: Any, headers: Mapping[str, str], mapping: IdentityMap | None = None
                     ) -> tuple[dict | None, str | None, str | None]:
    """``(app_metadata, where, source)``: ``where`` is ``"top"``/``"extra_body"`` when the body
    carries it (else None); ``source`` one of :data:`SOURCES` (None: no identity)."""
    m = mapping or IdentityMap()
    meta, where = find_app_metadata(body)
    if meta is not None:
        return meta, where, "app_metadata"
    b = body if isinstance(body, Mapping) else {}
    h = {k.lower(): v for k, v in headers.items()}
    md = b.get("metadata")
    if isinstance(md, Mapping) and md.get("workflow_id"):
        out = {"workflow_type_id": md.get("workflow_type_id") or _workflow_type("metadata", b, h, m),
               "workflow_id": md["workflow_id"],
               "agent_id": md.get("agent_id") or m.default_agent}
        return out, None, "metadata"
    for name in m.harnesses:
        if name == "dynamo":
            found = _dynamo_ids(b, h, m)
            if found is None:
                continue
            wf, agent, extra, wf_type = found
            if m.workflow_type_from.startswith("header:") and h.get(m.workflow_type_from[7:].lower()):
                wf_type = None    # the operator's header wins over the body's type
            return {"workflow_type_id": wf_type or _workflow_type(name, b, h, m), "workflow_id": wf,
                    "agent_id": m.agents.get(agent, agent), **extra}, None, name
        ids = _harness_ids(name, h, m)
        if ids is not None:
            wf, agent, extra = ids
            return {"workflow_type_id": _workflow_type(name, b, h, m), "workflow_id": wf,
                    "agent_id": m.agents.get(agent, agent), **extra}, None, name
    return None, None, None
