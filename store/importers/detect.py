"""Telling a trace file's format from its name and its first bytes (``--format auto``).

Names decide first (``*.traj`` is SWE-agent, ``*.traj.json`` mini-SWE-agent, ``base_state.json``
an OpenHands V1 conversation, whose ``events/*.json`` belong to it and are not read alone);
otherwise a few marker keys near the start of the file do: ``dynamo.request.trace.v1``,
``schema_version: ATIF-...``, ``resourceSpans`` / ``"span_id"`` / ``context.span_id`` (spans),
``instance_id`` + ``history`` (OpenHands), ``trajectory_format: mini-swe-agent``.

JSON Lines written by coding agents are told by the keys of their first records (their text
holds arbitrary tool output, so no marker search is trusted there): ``rollout-*.jsonl`` or
``{"type": "session_meta" | "response_item" | "event_msg" | "turn_context", "payload": {...}}``
is a Codex rollout; ``sessionId`` / ``isSidechain`` or a Claude Code runtime record type
(``mode``, ``permission-mode``, ``file-history-snapshot``, ``summary``…) a Claude Code session;
``provider`` with ``timing_events`` / ``round_index`` a TraceLab round row; the
``dynamo.agentic_mooncake`` header, or rows with ``input_length`` / ``output_length`` and
``hash_ids`` / ``wait_for`` / ``timestamp``, Dynamo's (agentic) Mooncake; a trace object with
``requests`` and ``block_size`` (one per line) AIPerf's agentic "Weka" trace. A whole-file JSON
document with ``"hash_id_scope"`` and ``"requests"`` is a Weka trace too.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from store.importers._common import open_text

#: Every file name any importer reads (a folder is searched for these under ``--format auto``).
AUTO_PATTERNS = ("*.traj", "*.traj.json", "*.json", "*.jsonl", "*.json.gz", "*.jsonl.gz")
HEAD_CHARS = 65_536

_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("dynamo", re.compile(r'"schema"\s*:\s*"dynamo\.request\.trace\.v1"')),
    ("dynamo-agentic", re.compile(r'"schema"\s*:\s*"dynamo\.agentic_mooncake"')),
    ("aiperf-agentic", re.compile(r'"hash_id_scope"[\s\S]*"requests"\s*:\s*\[|"requests"\s*:\s*\[[\s\S]*"hash_id_scope"')),
    ("atif", re.compile(r'"schema_version"\s*:\s*"ATIF-v', re.IGNORECASE)),
    ("mini-swe-agent", re.compile(r'"trajectory_format"\s*:\s*"mini-swe-agent')),
    ("otel", re.compile(r'"resourceSpans"|"context"\s*:\s*\{[^{}]*"span_id"|"context\.span_id"|"spans"\s*:\s*\[')),
    ("openhands", re.compile(r'"instance_id"[\s\S]*"history"|"history"[\s\S]*"instance_id"')),
    ("swe-agent", re.compile(r'"trajectory"\s*:\s*\[')),
)


CODEX_TYPES = frozenset({"session_meta", "response_item", "event_msg", "turn_context", "compacted"})
CLAUDE_TYPES = frozenset({"user", "assistant", "system", "summary", "mode", "permission-mode",
                          "file-history-snapshot", "attachment", "ai-title", "last-prompt", "progress",
                          "queue-operation", "custom-title", "agent-name"})
#: Complete lines of the head looked at for the record-shape check.
SHAPE_LINES = 20


def _shape_format(head: str) -> str | None:
    """The coding-agent format whose record shape the first complete JSON lines have."""
    for line in head.splitlines()[:SHAPE_LINES]:
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict):
            return None
        if rec.get("type") in CODEX_TYPES and isinstance(rec.get("payload"), dict):
            return "codex"
        if rec.get("provider") in ("claude", "codex") and ("timing_events" in rec or "round_index" in rec):
            return "tracelab"
        if rec.get("schema") == "dynamo.agentic_mooncake":
            return "dynamo-agentic"
        if "input_length" in rec and "output_length" in rec and set(rec) & {"hash_ids", "wait_for", "timestamp"}:
            return "dynamo-agentic"
        if isinstance(rec.get("requests"), list) and "block_size" in rec and "id" in rec:
            return "aiperf-agentic"
        if "sessionId" in rec or "isSidechain" in rec or (
                rec.get("type") in CLAUDE_TYPES and not isinstance(rec.get("payload"), dict)
                and set(rec) & {"mode", "permissionMode", "snapshot", "summary", "aiTitle", "lastPrompt",
                                "message", "leafUuid", "uuid"}):
            return "claude-code"
    return None


def part_of_conversation(path: Path) -> bool:
    """An OpenHands V1 ``events/*.json`` file (read through its ``base_state.json``)."""
    return path.parent.name == "events" and (path.parent.parent / "base_state.json").exists()


def detect_format(path: Path) -> str | None:
    """The format name for ``path``, or None when nothing matches."""
    name = path.name
    if name.endswith(".traj"):
        return "swe-agent"
    if name.endswith(".traj.json"):
        return "mini-swe-agent"
    if name == "base_state.json":
        return "openhands"
    if name.startswith("rollout-") and (name.endswith(".jsonl") or name.endswith(".jsonl.gz")):
        return "codex"
    try:
        with open_text(path) as fh:
            head = fh.read(HEAD_CHARS)
    except (OSError, UnicodeDecodeError, EOFError):
        return None
    if (shape := _shape_format(head)) is not None:
        return shape
    for fmt, marker in _MARKERS:
        if marker.search(head):
            return fmt
    return None
