"""Our flat records -> Dynamo's agentic Mooncake trace, version 2 (``--format dynamo-agentic``).

What ``python -m dynamo.replay --trace-format agentic_mooncake`` replays (ai-dynamo/dynamo,
``AgenticMooncakeHeader`` / ``AgenticMooncakeRow``): JSON Lines, a header line then one row per
call::

    {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 64, "hash_id_scope": "local",
     "source": {"format": "agentprof", "digest": "<sha256 of the rows>"}}
    {"request_id", "play_id", "session_id", "model", "input_length", "output_length", "hash_ids",
     "not_before_ms", "recorded_api_time_ms",
     "dependencies": [{"request_id", "trigger": "completion", "delay_ms", "relation"}], "agentprof": {...}}

A play is one workflow (``play_id`` = ``workflow_id``; ``<type>:<workflow_id>`` when two workflow
types use the same id), a session one agent's conversation in it
(``session_id`` = ``agent_id``: Dynamo scopes sessions by play). ``not_before_ms`` is the call's
arrival in ms from the trace's first arrival, ``recorded_api_time_ms`` its recorded duration.
Each parent is a ``completion`` dependency whose ``delay_ms`` is the recorded gap from that
parent's finish (tool time, think time; never below 0): ``sequence`` when the parent is the same
agent's, ``join`` when the call has several parents or resumes an agent after another's call,
``spawn`` when it is an agent's first call after another agent's. A play has one root: a call
of the workflow with no parents other than its first depends on the first's ``dispatch`` (its
start offset as ``delay_ms``), which the importer reads as timing, not as a parent. ``hash_ids`` are the prompt's
blocks (:class:`store.exporters._graph.BlockIds`: conversation lineage as prefix structure).

Dynamo's row type ignores keys it does not know, so what its format has no field for rides in
one ``agentprof`` object (the importer reads it back; Dynamo skips it): workflow type, tool
executions, ``wait_after``, first-token time, cached tokens, status, and the trace start's epoch
time (``trace_start_s``) so times come back absolute.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from store.exporters._graph import BlockIds, Workflow

NAME = "dynamo-agentic"
SUMMARY = "Dynamo agentic Mooncake v2 JSONL (python -m dynamo.replay --trace-format agentic_mooncake)"
SCHEMA = "dynamo.agentic_mooncake"
VERSION = 2
#: Fields of our record carried in the ``agentprof`` extension when present.
EXTENSION_FIELDS = ("t_first_token", "cached_tokens", "status", "wait_after", "timing", "tool_timing",
                    "tokens_unknown", "tokens_estimated", "stage")


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 6)


def relation(wf: Workflow, call: dict, parent_ids: list[str], seen_agents: set[str]) -> str:
    """Dynamo's dependency relation of ``call`` on its parents (module docstring)."""
    calls = wf.by_id()
    if len(parent_ids) > 1:
        return "join"
    if calls[parent_ids[0]]["agent_id"] == call["agent_id"]:
        return "sequence"
    return "join" if call["agent_id"] in seen_agents else "spawn"


def rows(workflows: Sequence[Workflow], block_size: int = 64) -> list[dict]:
    """The trace's rows (header excluded), workflows in order of their first arrival."""
    if not workflows:
        return []
    t0 = min(wf.start for wf in workflows)
    blocks = BlockIds(block_size)
    out = []
    counts = Counter(wf.workflow_id for wf in workflows)
    shared = {w for w, n in counts.items() if n > 1}     # one id in two workflow types: plays must differ
    for wf in workflows:
        play = f"{wf.workflow_type_id}:{wf.workflow_id}" if wf.workflow_id in shared else wf.workflow_id
        hashes = blocks.workflow(wf)
        calls = wf.by_id()
        seen: set[str] = set()
        root = wf.calls[0]
        for c in wf.calls:
            rid = c["request_id"]
            deps = []
            parent_ids = wf.parents[rid]
            if parent_ids:
                rel = relation(wf, c, parent_ids, seen)
                deps = [{"request_id": p, "trigger": "completion",
                         "delay_ms": max(_ms(c["t_arrival"] - calls[p]["t_finish"]), 0.0), "relation": rel}
                        for p in parent_ids]
            elif c is not root:     # a second root: a play has one, so it starts after the first's dispatch
                deps = [{"request_id": root["request_id"], "trigger": "dispatch",
                         "delay_ms": max(_ms(c["t_arrival"] - root["t_arrival"]), 0.0), "relation": "spawn"}]
            seen.add(c["agent_id"])
            ext: dict[str, Any] = {"workflow_type_id": wf.workflow_type_id, "agent_id": c["agent_id"],
                                   "trace_start_s": t0}
            if play != wf.workflow_id:
                ext["workflow_id"] = wf.workflow_id
            for key in EXTENSION_FIELDS:
                if c.get(key) is not None:
                    ext[key] = c[key]
            if c.get("tool_calls"):
                ext["tool_calls"] = c["tool_calls"]
            row = {"request_id": rid, "play_id": play, "session_id": c["agent_id"],
                   "model": c.get("model") or "unknown", "input_length": int(c["input_tokens"]),
                   "output_length": int(c["output_tokens"]), "hash_ids": hashes[rid],
                   "not_before_ms": _ms(c["t_arrival"] - t0),
                   "recorded_api_time_ms": _ms(c["t_finish"] - c["t_arrival"])}
            if deps:
                row["dependencies"] = deps
            row["agentprof"] = ext
            out.append(row)
    return out


def write(workflows: Sequence[Workflow], out: Path, block_size: int = 64) -> dict:
    """Write the trace to ``out`` (one JSONL file); returns counts for the command's report."""
    body = [json.dumps(r, ensure_ascii=False, separators=(",", ":")) for r in rows(workflows, block_size)]
    digest = hashlib.sha256("\n".join(body).encode()).hexdigest()
    header = {"schema": SCHEMA, "version": VERSION, "block_size": block_size, "hash_id_scope": "local",
              "source": {"format": "agentprof", "digest": digest}}
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(header, separators=(",", ":")) + "\n")
        for line in body:
            fh.write(line + "\n")
    tmp.replace(out)
    return {"files": 1, "workflows": len(workflows), "calls": len(body)}
