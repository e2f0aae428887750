"""Claude Code session files (``~/.claude/projects/<project>/<session>.jsonl``) -> flat records.

Claude Code writes every session as JSON Lines, one record per event (shapes as documented by
the public TraceLab examples, uw-syfi/TraceLab ``example_sessions/claude/``, and by community
schema notes such as 23min/copilot-lens ``docs/research/claude-code-sessions.md``):

* ``{"type": "assistant", "message": {"id": "msg_…", "model", "content": [block], "usage":
  {"input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens"}},
  "timestamp", "sessionId", "isSidechain", "agentId"?}`` — **one API response is split over
  several records** (one per content block: ``thinking``, ``text``, ``tool_use``) that repeat the
  same ``message.id`` and the same ``usage``: it is one call, counted once;
* ``{"type": "user", "message": {"content": "…" | [block]}}`` — a human prompt (text), or tool
  results (``tool_result`` blocks whose ``tool_use_id`` names the ``tool_use.id``);
* runtime records — ``mode``, ``permission-mode``, ``file-history-snapshot``, ``attachment``,
  ``ai-title``, ``last-prompt``, ``system``, ``summary``, ``progress``, ``queue-operation`` … —
  hold no call and are skipped silently.

One flat record per assistant ``message.id``: ``workflow_id`` = ``sessionId``, ``agent_id``
``main`` or the subagent's type, ``t_arrival`` = the latest input the call answers, ``t_finish``
= its last record, input tokens = uncached + cache creation + cache read, tool calls timed from
``tool_use`` to its ``tool_result``, ``wait_after: "human"`` before a typed prompt. The field
table: docs/importers.md, "Coding agents on your own machine".

Kept besides: ``model``, ``stop_reason``, the token split (``cache_creation_tokens``,
``uncached_input_tokens``), and — unless ``--no-text`` — the visible ``response_text``. Prompts,
thinking, tool inputs and tool outputs are never copied. Messages from ``<synthetic>`` (Claude
Code's own stand-in replies, no API call) are skipped.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    iso_to_epoch,
    iter_json_lines,
    report,
    resolve_timezone,
)

NAME = "claude-code"
ALIASES = ("claude",)
SUMMARY = "Claude Code session JSONL (~/.claude/projects/<project>/<session>.jsonl, subagents included)"
FILE_PATTERNS = ("*.jsonl",)
DEFAULT_WORKFLOW_TYPE = "claude_code"
MAIN_AGENT = "main"
SUBAGENT = "subagent"
#: Tools that start a subagent (renamed from ``Task`` to ``Agent`` in later versions).
SPAWN_TOOLS = frozenset({"Task", "Agent"})
AGENT_ID_TEXT = re.compile(r"agentId:\s*([0-9A-Za-z_-]+)")


@dataclass
class _Call:
    """One assistant message being assembled from its records."""

    rec: dict[str, Any]
    chain: str
    texts: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)


def _ts(record: dict, tz: Any) -> float | None:
    stamp = record.get("timestamp")
    if not isinstance(stamp, str):
        return None
    try:
        return iso_to_epoch(stamp, tz)
    except ValueError:
        return None


def _blocks(message: dict) -> list[dict]:
    content = message.get("content")
    return [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []


def _is_human(record: dict) -> bool:
    """A user record typed by a person: text content (not tool results), not a sidechain's
    prompt (that comes from the parent agent), not Claude Code's own meta message or the summary
    it writes after compacting the conversation."""
    if record.get("isSidechain") or record.get("isMeta") or record.get("isCompactSummary"):
        return False
    content = (record.get("message") or {}).get("content")
    if isinstance(content, str):
        return bool(content.strip())
    blocks = [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    return bool(blocks) and not any(b.get("type") == "tool_result" for b in blocks)


def _spawns(path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """From one session file: subagent type by the subagent's ``agentId`` (read from the spawning
    tool's result), and by the prompt the spawning tool gave (for inline sidechains)."""
    by_tool: dict[str, tuple[str, str]] = {}  # tool_use id -> (subagent_type, prompt)
    by_agent: dict[str, str] = {}
    by_prompt: dict[str, str] = {}
    for _, rec in iter_json_lines(path, lambda err: None):
        if not isinstance(rec, dict) or not isinstance(rec.get("message"), dict):
            continue
        for b in _blocks(rec["message"]):
            if b.get("type") == "tool_use" and b.get("name") in SPAWN_TOOLS and isinstance(b.get("input"), dict):
                kind = str(b["input"].get("subagent_type") or SUBAGENT)
                by_tool[str(b.get("id"))] = (kind, str(b["input"].get("prompt") or ""))
                if b["input"].get("prompt"):
                    by_prompt[str(b["input"]["prompt"])] = kind
            elif b.get("type") == "tool_result" and str(b.get("tool_use_id")) in by_tool:
                kind = by_tool[str(b["tool_use_id"])][0]
                result = rec.get("toolUseResult")
                agent = result.get("agentId") if isinstance(result, dict) else None
                text = b.get("content") if isinstance(b.get("content"), str) else " ".join(
                    str(c.get("text", "")) for c in b.get("content") or [] if isinstance(c, dict))
                m = AGENT_ID_TEXT.search(text or "")
                for aid in {agent, m.group(1) if m else None} - {None}:
                    by_agent[str(aid)] = kind
    return by_agent, by_prompt


@lru_cache(maxsize=64)
def _spawns_cached(path: str, mtime: float) -> tuple[dict[str, str], dict[str, str]]:
    return _spawns(Path(path))


def _parent_session_file(path: Path) -> Path | None:
    """``<project>/<session>.jsonl`` for ``<project>/<session>/subagents/agent-<id>.jsonl``."""
    if path.parent.name != "subagents":
        return None
    candidate = path.parent.parent.parent / f"{path.parent.parent.name}.jsonl"
    return candidate if candidate.exists() else None


def _workflow_type(template: str | None, cwd: str | None, path: Path) -> str:
    wt = template or DEFAULT_WORKFLOW_TYPE
    if "{project}" in wt:
        project = Path(cwd).name if cwd else path.parent.name.rsplit("-", 1)[-1]
        wt = wt.replace("{project}", project or "project")
    return wt


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              with_text: bool = True, on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for one Claude Code session file (module docstring)."""
    tz = resolve_timezone(timezone)
    parent_file = _parent_session_file(path)
    spawn_file = parent_file or path
    by_agent, by_prompt = _spawns_cached(str(spawn_file), spawn_file.stat().st_mtime)
    calls: dict[str, _Call] = {}
    order: list[str] = []
    tools: dict[str, dict[str, Any]] = {}       # tool_use id -> tool entry (filled by its result)
    ready: dict[str, float] = {}                # chain -> time of the latest input it has received
    last_call: dict[str, _Call] = {}            # chain -> its latest call
    chain_agent: dict[str, str] = {}            # chain -> agent_id
    cwd: str | None = None
    for lineno, rec in iter_json_lines(path, on_error):
        if not isinstance(rec, dict):
            report(on_error, ImportFormatError(str(path), lineno, "not a JSON object"))
            continue
        kind = rec.get("type")
        if kind not in ("user", "assistant"):
            continue  # runtime records: mode, permission-mode, file-history-snapshot, attachment...
        message = rec.get("message")
        if not isinstance(message, dict):
            report(on_error, ImportFormatError(str(path), lineno, f"a {kind} record without a message object",
                                               "message"))
            continue
        t = _ts(rec, tz)
        if t is None:
            report(on_error, ImportFormatError(str(path), lineno, "missing or unreadable timestamp", "timestamp"))
            continue
        cwd = cwd or rec.get("cwd")
        sidechain = bool(rec.get("isSidechain"))
        chain = f"side:{rec.get('agentId') or ''}" if sidechain else "main"
        if chain not in chain_agent:
            if not sidechain:
                chain_agent[chain] = MAIN_AGENT
            else:
                chain_agent[chain] = by_agent.get(str(rec.get("agentId")), SUBAGENT)
        if kind == "user":
            content = message.get("content")
            if sidechain and chain_agent[chain] == SUBAGENT and isinstance(content, str) and content in by_prompt:
                chain_agent[chain] = by_prompt[content]
            for b in _blocks(message):
                if b.get("type") == "tool_result" and str(b.get("tool_use_id")) in tools:
                    tool = tools.pop(str(b["tool_use_id"]))
                    tool["t_end"] = max(t, tool["t_start"])
                    tool["status"] = "error" if b.get("is_error") else "ok"
            if _is_human(rec) and chain in last_call:
                last_call[chain].rec["wait_after"] = "human"
            ready[chain] = t
            continue
        msg_id = message.get("id")
        if message.get("model") == "<synthetic>" or msg_id == "<synthetic>":
            continue
        if not isinstance(msg_id, str) or not msg_id:
            report(on_error, ImportFormatError(str(path), lineno, "assistant record without message.id", "message.id"))
            continue
        usage = message.get("usage")
        counts = {k: count_field(usage.get(k)) if isinstance(usage, dict) else None
                  for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens", "output_tokens")}
        if counts["input_tokens"] is None or counts["output_tokens"] is None:
            report(on_error, ImportFormatError(str(path), lineno, f"assistant message {msg_id}: usage without "
                                               "input_tokens/output_tokens", "message.usage"))
            continue
        call = calls.get(msg_id)
        session = str(rec.get("sessionId") or path.stem)
        if call is None:
            start = ready.get(chain, t)
            rec_out: dict[str, Any] = {
                "request_id": f"claude-code:{session}:{msg_id}", "workflow_id": session,
                "agent_id": chain_agent[chain], "t_arrival": min(start, t), "t_finish": t,
            }
            call = calls[msg_id] = _Call(rec_out, chain)
            order.append(msg_id)
            last_call[chain] = call
            rec_out["import_source"] = f"{path}:{lineno}"
            if sidechain:
                rec_out["claude_agent_id"] = rec.get("agentId")
        call.rec["t_finish"] = max(call.rec["t_finish"], t)
        cache_new, cache_read = counts["cache_creation_input_tokens"] or 0, counts["cache_read_input_tokens"] or 0
        call.rec.update({   # the usage repeats on every record of the message: the last one counts
            "input_tokens": counts["input_tokens"] + cache_new + cache_read, "cached_tokens": cache_read,
            "output_tokens": counts["output_tokens"], "uncached_input_tokens": counts["input_tokens"],
            "cache_creation_tokens": cache_new,
        })
        if message.get("model"):
            call.rec["model"] = message["model"]
        if message.get("stop_reason"):
            call.rec["stop_reason"] = message["stop_reason"]
        for b in _blocks(message):
            if b.get("type") == "text" and isinstance(b.get("text"), str):
                call.texts.append(b["text"])
            elif b.get("type") == "tool_use" and b.get("id") is not None:
                tool = {"name": str(b.get("name") or "tool"), "t_start": t}
                tools[str(b["id"])] = tool
                call.tools.append(tool)
    wt = _workflow_type(workflow_type, cwd, path)
    for msg_id in order:
        call = calls[msg_id]
        rec = {"request_id": call.rec.pop("request_id"), "workflow_type_id": wt, **call.rec}
        if call.tools:
            rec["tool_calls"] = call.tools
        if with_text and call.texts:
            rec["response_text"] = "\n".join(call.texts)
        rec["source_format"] = NAME
        yield rec
