"""Codex CLI rollouts (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) -> flat records.

Every line of a rollout is ``{"timestamp", "type", "payload"}`` (shapes as in the public TraceLab
example, uw-syfi/TraceLab ``example_sessions/codex/``, and community notes such as
kvsankar/agent-history ``docs/codex-format.md``):

* ``session_meta`` — ``payload.id`` (the thread id Codex sends as the ``thread-id`` header),
  ``cwd``, ``cli_version``, ``source`` (``"cli"``, ``"exec"``…, or for a spawned sub-agent
  ``{"subagent": {"thread_spawn": {"parent_thread_id", "agent_role", "agent_nickname"}}}``);
* ``turn_context`` — ``payload.model``, ``payload.turn_id``;
* ``event_msg`` with ``payload.type`` ``user_message`` (a person's prompt), ``token_count``
  (``payload.info.last_token_usage`` / ``total_token_usage``: ``input_tokens`` — cached included —,
  ``cached_input_tokens``, ``output_tokens`` — reasoning included —, ``reasoning_output_tokens``),
  ``agent_message``, ``task_started`` / ``task_complete`` …;
* ``response_item`` with ``payload.type`` ``function_call`` / ``custom_tool_call`` (``name``,
  ``call_id``) and ``function_call_output`` / ``custom_tool_call_output`` (``call_id``),
  ``message``, ``reasoning``.

One flat record per ``token_count`` event that reports a new usage: Codex writes one after every
model response, and repeats it unchanged on rate-limit updates (``info`` null, or the same
``total_token_usage``: skipped, as TraceLab's extractor does). The call's ``t_finish`` is the
event's time, its ``t_arrival`` the latest input before it (the user prompt, the last tool
output, or the previous call's end); its tools are the function calls written since the previous
call, timed from the ``function_call`` record to its ``…_output`` record. A ``user_message``
marks the call before it ``wait_after: "human"`` (think time, not tool time).

``workflow_type_id`` = ``codex`` (the gateway's name for Codex sessions; ``--workflow-type``
overrides), ``workflow_id`` = the session id, ``agent_id`` = ``main``. A spawned sub-agent's rollout
is the same workflow as its parent (``workflow_id`` = ``parent_thread_id``), agent ``subagent``
(what the gateway names a request carrying ``x-codex-parent-thread-id``), its role kept as
``codex_agent_role``; the parent history such a file replays (turns older than the sub-agent's
own thread id) is already in the parent's rollout and is skipped. Kept besides: ``model``,
``reasoning_tokens``, ``turn_id``, and unless ``--no-text`` the agent's visible messages as
``response_text``; prompts, tool arguments and tool outputs are never copied.
"""
from __future__ import annotations

import json
from typing import Any, Iterator
from pathlib import Path

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    iso_to_epoch,
    iter_json_lines,
    report,
    resolve_timezone,
)

NAME = "codex"
ALIASES = ("codex-cli",)
SUMMARY = "Codex CLI rollouts (~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl)"
FILE_PATTERNS = ("rollout-*.jsonl", "rollout-*.jsonl.gz")
DEFAULT_WORKFLOW_TYPE = "codex"
MAIN_AGENT = "main"
SUBAGENT = "subagent"
TOOL_CALLS = frozenset({"function_call", "custom_tool_call", "local_shell_call"})
TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})


def _spawn(source: Any) -> dict:
    sub = source.get("subagent") if isinstance(source, dict) else None
    spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
    return spawn if isinstance(spawn, dict) else {}


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              with_text: bool = True, on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for one Codex rollout (module docstring)."""
    tz = resolve_timezone(timezone)
    records: list[dict] = []
    own_id: str | None = None        # this rollout's thread id
    workflow_id: str | None = None
    agent, role = MAIN_AGENT, None
    model = turn_id = None
    ready: float | None = None       # latest input time
    pending: list[dict] = []         # tools since the previous call
    open_tools: dict[str, dict] = {}
    texts: list[str] = []
    last_total: str | None = None
    for lineno, rec in iter_json_lines(path, on_error):
        if not isinstance(rec, dict) or not isinstance(rec.get("payload"), dict):
            report(on_error, ImportFormatError(str(path), lineno, "not a rollout line: expected "
                                               "{\"timestamp\", \"type\", \"payload\": {...}}", "payload"))
            continue
        kind, payload = rec.get("type"), rec["payload"]
        sub = payload.get("type")
        try:
            t = iso_to_epoch(str(rec.get("timestamp")), tz)
        except ValueError:
            report(on_error, ImportFormatError(str(path), lineno, "missing or unreadable timestamp", "timestamp"))
            continue
        if kind == "session_meta":
            if own_id is None and payload.get("id"):
                own_id = str(payload["id"])
                spawn = _spawn(payload.get("source"))
                if spawn.get("parent_thread_id"):
                    workflow_id, agent = str(spawn["parent_thread_id"]), SUBAGENT
                    role = spawn.get("agent_role") or spawn.get("agent_nickname")
                else:
                    workflow_id = own_id
            ready = t if ready is None else ready
            continue
        if kind == "turn_context":
            model = payload.get("model") or model
            turn_id = payload.get("turn_id") or turn_id
            continue
        if ready is None:
            ready = t
        replay = agent == SUBAGENT and own_id is not None and isinstance(turn_id, str) and turn_id < own_id
        if kind == "event_msg" and sub == "user_message":
            if records and not replay:
                records[-1]["wait_after"] = "human"
            ready = t
        elif kind == "event_msg" and sub == "agent_message" and isinstance(payload.get("message"), str):
            texts.append(payload["message"])
        elif kind == "response_item" and sub in TOOL_CALLS:
            tool = {"name": str(payload.get("name") or sub), "t_start": t}
            pending.append(tool)
            if payload.get("call_id") is not None:
                open_tools[str(payload["call_id"])] = tool
        elif kind == "response_item" and sub in TOOL_OUTPUTS:
            tool = open_tools.pop(str(payload.get("call_id")), None)
            if tool is not None:
                tool["t_end"] = max(t, tool["t_start"])
                tool["status"] = "ok"
            ready = t
        elif kind == "event_msg" and sub == "token_count":
            info = payload.get("info")
            if not isinstance(info, dict):
                continue  # a rate-limit update: no usage
            last, total = info.get("last_token_usage"), info.get("total_token_usage")
            if not isinstance(last, dict):
                report(on_error, ImportFormatError(str(path), lineno, "token_count without last_token_usage",
                                                   "payload.info.last_token_usage"))
                continue
            signature = json.dumps(total, sort_keys=True)
            if signature == last_total:
                continue  # the same usage written again
            last_total = signature
            n_in, n_out = count_field(last.get("input_tokens")), count_field(last.get("output_tokens"))
            if n_in is None or n_out is None:
                report(on_error, ImportFormatError(str(path), lineno, "token_count usage without input_tokens/"
                                                   "output_tokens", "payload.info.last_token_usage"))
                continue
            tools, pending = pending, []
            call_texts, texts = texts, []
            if replay:
                ready = t
                continue
            session = own_id or path.stem
            out: dict[str, Any] = {
                "request_id": f"codex:{session}:{len(records)}",
                "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE,
                "workflow_id": workflow_id or session, "agent_id": agent,
                "t_arrival": min(ready, t), "t_finish": t,
                "input_tokens": n_in, "output_tokens": n_out,
            }
            if (cached := count_field(last.get("cached_input_tokens"))) is not None:
                out["cached_tokens"] = min(cached, n_in)
            if model:
                out["model"] = model
            if tools:
                out["tool_calls"] = tools
            if with_text and call_texts:
                out["response_text"] = "\n".join(call_texts)
            if (reasoning := count_field(last.get("reasoning_output_tokens"))) is not None:
                out["reasoning_tokens"] = reasoning
            out.update({"turn_id": turn_id, "source_format": NAME, "import_source": f"{path}:{lineno}"})
            if agent == SUBAGENT:
                out["codex_thread_id"] = own_id
                if role:
                    out["codex_agent_role"] = role
            records.append(out)
            ready = t
    yield from records
