"""Dynamo agentic Mooncake traces (v2 and v1) and plain Mooncake rows -> flat records.

**v2** (``{"schema": "dynamo.agentic_mooncake", "version": 2, "block_size", "hash_id_scope",
"source"}`` header line, then rows ``{"request_id", "play_id", "session_id", "model",
"input_length" | "input_tokens", "output_length" | "output_tokens", "hash_ids", "not_before_ms",
"dependencies": [{"request_id", "trigger", "delay_ms", "relation"}]}``): a play is a workflow
(``workflow_id`` = ``play_id``), a session an agent (``agent_id`` = ``session_id``); ``t_arrival``
= ``not_before_ms`` (ms from the trace start; seconds here), the parents are the ``completion``
dependencies (a ``dispatch`` one only anchors the start: kept as ``dispatch_after``).
``t_finish`` = arrival + ``recorded_api_time_ms`` where the row has it, else a child's arrival
minus its ``completion`` dependency's ``delay_ms`` (the recorded finish the delay counts from);
a call with neither is written ``t_finish = t_arrival`` and ``timing: created_only``.

**v1** (rows with ``wait_for`` / ``branches`` / ``tool_wait_ms``, ``timestamp`` in ms, ``delay``):
a session ``run:role`` is agent ``role`` of workflow ``run`` (Dynamo's own naming; no colon: the
session is the workflow, agent ``main``), a spawned session (``wait_for`` across sessions) joins
the workflow of the request it waits on; parents = ``wait_for``; a dependency's recorded finish =
the child's ``timestamp`` − ``delay`` − ``tool_wait_ms``, and ``tool_wait_ms`` becomes a tool
execution (``tool``) of the parent from its finish. **Plain Mooncake** rows (``timestamp``,
``input_length``, ``output_length``, ``hash_ids``, optional ``session_id`` / ``delay``) are one call
each, a session's rows in order (a row without ``session_id`` is a workflow of its own).

Kept from every row: ``hash_ids`` and ``block_size`` (the prompt's KV blocks: the prefix
structure), ``priority`` / ``strict_priority`` / ``policy_class``; what our exporter put in the
``agentprof`` object (workflow type, agent, tool executions, ``wait_after``, first token, trace
start) is read back. Times without an epoch (Dynamo's rows count from the trace start) start at 0
unless ``agentprof.trace_start_s`` says when.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers._common import ErrorHandler, ImportFormatError, count_field, iter_json_lines, report

NAME = "dynamo-agentic"
ALIASES = ("agentic-mooncake", "mooncake")
SUMMARY = "Dynamo agentic Mooncake traces (v2 with header, v1 wait_for/branches) and plain Mooncake rows"
FILE_PATTERNS = ("*.jsonl", "*.jsonl.gz")
SCHEMA = "dynamo.agentic_mooncake"
DEFAULT_TYPE = "dynamo_agentic"
KEPT = ("priority", "strict_priority", "policy_class")
#: agentprof extension fields copied back onto the record as they are.
EXTENSION_FIELDS = ("cached_tokens", "status", "wait_after", "timing", "tool_timing", "tokens_unknown",
                    "tokens_estimated", "stage", "tool_calls")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _tokens(row: dict, path: Path, lineno: int) -> tuple[int, int]:
    n_in = count_field(row.get("input_length", row.get("input_tokens")))
    n_out = count_field(row.get("output_length", row.get("output_tokens")))
    if n_in is None:
        raise ImportFormatError(str(path), lineno, "no input_length (a token count)", "input_length")
    if n_out is None:
        raise ImportFormatError(str(path), lineno, "no output_length (a token count)", "output_length")
    return n_in, n_out


def _finish_times(recs: list[dict], deps: dict[str, list[tuple[str, float]]]) -> None:
    """Fill each record's ``t_finish`` (module docstring): recorded duration, else a child's arrival
    minus its dependency delay, else the arrival itself (flagged)."""
    by_id = {r["request_id"]: r for r in recs}
    inferred: dict[str, float] = {}
    for rid, parents in deps.items():
        child = by_id[rid]
        for parent, delay_s in parents:
            if parent in by_id:
                t = child["t_arrival"] - delay_s
                inferred[parent] = min(inferred.get(parent, t), t)
    for r in recs:
        if "t_finish" in r:
            continue
        t = inferred.get(r["request_id"])
        if t is not None and t >= r["t_arrival"]:
            r["t_finish"] = t
        else:
            r["t_finish"] = r["t_arrival"]
            r["timing"] = "created_only"


def _v2(rows: list[tuple[int, dict]], header: dict, path: Path, workflow_type: str | None,
        on_error: ErrorHandler | None) -> list[dict]:
    block_size = header.get("block_size")
    recs: list[dict] = []
    deps: dict[str, list[tuple[str, float]]] = {}
    for lineno, row in rows:
        try:
            rid = row.get("request_id")
            if not isinstance(rid, str) or not rid:
                raise ImportFormatError(str(path), lineno, "no request_id", "request_id")
            nb = _number(row.get("not_before_ms"))
            if nb is None:
                raise ImportFormatError(str(path), lineno, "no not_before_ms (a number)", "not_before_ms")
            n_in, n_out = _tokens(row, path, lineno)
            ext = row.get("agentprof") if isinstance(row.get("agentprof"), dict) else {}
            start = _number(ext.get("trace_start_s")) or 0.0
            rec: dict[str, Any] = {
                "request_id": rid,
                "workflow_type_id": workflow_type or ext.get("workflow_type_id") or DEFAULT_TYPE,
                "workflow_id": str(ext.get("workflow_id") or row.get("play_id") or row.get("session_id") or rid),
                "agent_id": str(ext.get("agent_id") or row.get("session_id") or "main"),
                "t_arrival": start + nb / 1000.0, "input_tokens": n_in, "output_tokens": n_out,
            }
            api = _number(row.get("recorded_api_time_ms"))
            if api is not None and api >= 0:
                rec["t_finish"] = rec["t_arrival"] + api / 1000.0
            if row.get("model") and row["model"] != "unknown":
                rec["model"] = str(row["model"])
            parents = []
            for k, dep in enumerate(row.get("dependencies") or []):
                if not isinstance(dep, dict) or not isinstance(dep.get("request_id"), str):
                    raise ImportFormatError(str(path), lineno, "a dependency without request_id",
                                            f"dependencies[{k}]")
                delay = _number(dep.get("delay_ms")) or 0.0
                parents.append((dep["request_id"], delay / 1000.0 if dep.get("trigger", "completion")
                                == "completion" else float("nan")))
            # a dispatch dependency is a start-time anchor, not data the call consumes
            rec["parent_request_ids"] = [p for p, d in parents if d == d]
            deps[rid] = [(p, d) for p, d in parents if d == d]
            if len(rec["parent_request_ids"]) < len(parents):
                rec["dispatch_after"] = [p for p, d in parents if d != d]
            if isinstance(row.get("hash_ids"), list):
                rec["hash_ids"] = row["hash_ids"]
                rec["block_size"] = block_size
            for key in KEPT:
                if row.get(key) is not None:
                    rec[key] = row[key]
            if (ttft := _number(ext.get("t_first_token"))) is not None:
                rec["t_first_token"] = ttft
            for key in EXTENSION_FIELDS:
                if ext.get(key) is not None:
                    rec[key] = ext[key]
            rec["source_format"] = NAME
            rec["import_source"] = f"{path}:{lineno}"
            recs.append(rec)
        except ImportFormatError as err:
            report(on_error, err)
    _finish_times(recs, deps)
    return recs


def _v1(rows: list[tuple[int, dict]], path: Path, workflow_type: str | None,
        on_error: ErrorHandler | None) -> list[dict]:
    recs: list[dict] = []
    waits: dict[str, list[str]] = {}
    delays: dict[str, tuple[float, float]] = {}
    sessions: dict[str, str] = {}
    for lineno, row in rows:
        try:
            ts = _number(row.get("timestamp", row.get("created_time")))
            if ts is None:
                raise ImportFormatError(str(path), lineno, "no timestamp (ms, a number)", "timestamp")
            n_in, n_out = _tokens(row, path, lineno)
            session = str(row.get("session_id") or "")
            rid = str(row.get("request_id") or f"{session or path.name.split('.')[0]}#{lineno}")
            run, _, role = session.partition(":")
            sessions[rid] = session
            rec: dict[str, Any] = {"request_id": rid, "workflow_type_id": workflow_type or DEFAULT_TYPE,
                                   "workflow_id": run or session or rid, "agent_id": role or "main",
                                   "t_arrival": ts / 1000.0, "input_tokens": n_in, "output_tokens": n_out}
            if isinstance(row.get("hash_ids"), list):
                rec["hash_ids"] = row["hash_ids"]
            for key in KEPT:
                if row.get(key) is not None:
                    rec[key] = row[key]
            wait_for = [w for w in row.get("wait_for") or [] if isinstance(w, str)]
            if "wait_for" in row:
                rec["parent_request_ids"] = wait_for
                waits[rid] = wait_for
            delays[rid] = ((_number(row.get("delay", row.get("delay_ms"))) or 0.0) / 1000.0,
                           (_number(row.get("tool_wait_ms")) or 0.0) / 1000.0)
            rec["source_format"] = NAME
            rec["import_source"] = f"{path}:{lineno}"
            recs.append(rec)
        except ImportFormatError as err:
            report(on_error, err)
    by_id = {r["request_id"]: r for r in recs}
    # a spawned session joins the workflow of the request in another session it first waits on
    workflow_of: dict[str, str] = {}
    for r in sorted(recs, key=lambda r: r["t_arrival"]):
        sess = sessions[r["request_id"]] or r["request_id"]     # no session: a call of its own
        if sess not in workflow_of:
            workflow_of[sess] = next((by_id[p]["workflow_id"] for p in waits.get(r["request_id"], [])
                                      if p in by_id and (sessions[p] or p) != sess), r["workflow_id"])
        r["workflow_id"] = workflow_of[sess]
    if not waits:       # plain Mooncake: a session's rows in time order, each delay after the one before
        deps: dict[str, list[tuple[str, float]]] = {}
        last: dict[str, str] = {}
        for r in sorted(recs, key=lambda r: (r["t_arrival"], r["request_id"])):
            prev = last.get(r["workflow_id"])
            if prev is not None and sum(delays[r["request_id"]]) > 0:
                deps[r["request_id"]] = [(prev, sum(delays[r["request_id"]]))]
            last[r["workflow_id"]] = r["request_id"]
        _finish_times(recs, deps)
        return recs
    deps = {rid: [(p, sum(delays[rid])) for p in ps] for rid, ps in waits.items()}
    _finish_times(recs, deps)
    for rid, ps in waits.items():
        tool_s = delays[rid][1]
        for p in ps:
            parent = by_id.get(p)
            if parent is not None and tool_s > 0 and "tool_calls" not in parent:
                parent["tool_calls"] = [{"name": "tool", "t_start": parent["t_finish"],
                                         "t_end": parent["t_finish"] + tool_s, "status": "ok"}]
    return recs


def read_file(path: Path, *, workflow_type: str | None = None, on_error: ErrorHandler | None = None,
              **_: Any) -> Iterator[dict]:
    """Flat records of one agentic / plain Mooncake file (module docstring)."""
    rows: list[tuple[int, dict]] = []
    header: dict | None = None
    for lineno, row in iter_json_lines(path, on_error):
        if not isinstance(row, dict):
            report(on_error, ImportFormatError(str(path), lineno, "not a JSON object"))
            continue
        if row.get("schema") == SCHEMA:
            if row.get("version") != 2:
                report(on_error, ImportFormatError(
                    str(path), lineno, f"agentic Mooncake version {row.get('version')!r} is not read "
                    "(version 2 with a header, or v1 rows without one)", "version"))
                return
            header = row
            continue
        rows.append((lineno, row))
    if header is not None:
        yield from _v2(rows, header, path, workflow_type, on_error)
    else:
        yield from _v1(rows, path, workflow_type, on_error)
