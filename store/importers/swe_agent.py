"""SWE-agent trajectories (``<instance>.traj``, with or without ``<instance>.debug.log``) -> flat records.

A SWE-agent 1.x ``.traj`` file is one JSON document ``{"trajectory": [step, ...], "history": [...],
"info": {"model_stats": {...}, "exit_status", ...}, "replay_config": "<json>", "environment"}``;
each step is ``{"action", "observation", "response", "thought", "execution_time", "state",
"query", "extra_info"}`` (``sweagent/types.py: TrajectoryStep``). It holds **no wall-clock time
and no per-call token counts**. Those live in the per-instance debug log that ``sweagent
run-batch`` writes beside it (format ``"%(asctime)s - %(levelname)s - %(name)s - %(message)s"``,
``sweagent/utils/log.py``), whose lines this reader parses:

* ``... - INFO - swea-agent - ========================= STEP 3 =========================`` opens a
  step (``DefaultAgent.step``);
* ``... - DEBUG - swea-lm - input_tokens=6,736, output_tokens=81, instance_cost=..., cost=...``
  closes one LLM call (``LiteLLMModel._update_stats``; a step has several when the model was
  re-queried after a format error);
* ``... - INFO - swea-agent - 💭 THOUGHT ...`` is logged right before the action runs.

With the debug log: one record per LLM call, timed and counted from those lines, the last call of
a step carrying the step's tool (first word of ``action``, lasting ``execution_time``); asctime
has no offset and is read in ``timezone`` (default UTC). With the ``.traj`` alone: one record per
step *in order* (``timing = "synthetic_order"``, the step's position as its time, no time made
up), token counts from the step when it carries them, else ``tokens_unknown: true`` (or estimated
from the step's text with ``estimate_tokens=True``, flagged ``tokens_estimated``).

``workflow_id`` = ``<run folder>/<instance>``, ``workflow_type_id`` = ``swe_agent`` unless given,
``agent_id`` = the ``agent`` of the step's messages (``main``). Field by field, with the fit's
handling of unknown and estimated counts: docs/importers.md, "SWE-agent".
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    count_field,
    first_word,
    load_json_document,
    number_in_order,
    open_text,
    report,
    resolve_timezone,
    warn,
)

NAME = "swe-agent"
SUMMARY = ("SWE-agent .traj trajectories: timed with the <instance>.debug.log beside them, "
           "else in order (order-only)")
FILE_PATTERNS = ("*.traj",)
DEFAULT_WORKFLOW_TYPE = "swe_agent"

LOG_LINE = re.compile(r"^(\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2},\d{3}) - (\w+) - (\S+) - (.*)$")
STEP_LINE = re.compile(r"^=+ STEP (\d+) =+\s*$")
TOKENS_LINE = re.compile(r"^input_tokens=([\d,]+), output_tokens=([\d,]+)")
ACTION_LINE = re.compile(r"^💭 THOUGHT")
#: How estimated token counts are made (``--estimate-tokens``): UTF-8 bytes of the text / 4.
ESTIMATE_METHOD = "utf8_bytes/4"
#: OpenAI chat message keys kept from a step's query (SWE-agent adds agent, message_type, tags...).
CHAT_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


@dataclass
class LoggedStep:
    """What the debug log tells about one agent step."""

    number: int
    t_start: float
    log_line: int
    calls: list[tuple[float, int, int]] = field(default_factory=list)  # (t_finish, in, out)
    t_action: float | None = None


def parse_debug_log(path: Path, tz: tzinfo) -> list[list[LoggedStep]]:
    """The steps of a SWE-agent debug log, split into runs (a re-run appends to the same file and
    starts again at STEP 1)."""
    runs: list[list[LoggedStep]] = []
    with open_text(path) as fh:
        for lineno, line in enumerate(fh, 1):
            m = LOG_LINE.match(line)
            if not m:
                continue  # continuation of a multi-line message
            stamp, _level, _logger, message = m.groups()
            t = datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=tz).timestamp()
            if s := STEP_LINE.match(message):
                number = int(s.group(1))
                if number == 1 or not runs:
                    runs.append([])
                runs[-1].append(LoggedStep(number, t, lineno))
            elif runs and runs[-1] and (k := TOKENS_LINE.match(message)):
                runs[-1][-1].calls.append((t, int(k.group(1).replace(",", "")), int(k.group(2).replace(",", ""))))
            elif runs and runs[-1] and ACTION_LINE.match(message):
                runs[-1][-1].t_action = t
    return runs


def debug_log_for(traj: Path) -> Path | None:
    """The log SWE-agent wrote beside ``traj`` (debug level, else trace level, which holds more)."""
    for level in ("debug", "trace"):
        candidate = traj.with_name(f"{traj.stem}.{level}.log")
        if candidate.exists():
            return candidate
    return None


def workflow_id_for(traj: Path) -> str:
    """``<run folder>/<instance>``: the same instance is usually solved in several runs."""
    inst_dir = traj.parent
    run = inst_dir.parent.name if inst_dir.name == traj.stem else inst_dir.name
    return f"{run}/{traj.stem}" if run else traj.stem


def _model_of(doc: dict) -> str | None:
    try:
        return json.loads(doc["replay_config"])["agent"]["model"]["name"]
    except (KeyError, TypeError, ValueError):
        return None


def _chat(query: Any) -> list[dict] | None:
    if not isinstance(query, list):
        return None
    return [{k: m[k] for k in CHAT_KEYS if k in m} for m in query if isinstance(m, dict)]


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              with_text: bool = True, on_error: ErrorHandler | None = None, estimate_tokens: bool = False,
              **_: Any) -> Iterator[dict]:
    """Flat records for one ``.traj`` file: timed with its debug log, else in order (module docstring)."""
    tz = resolve_timezone(timezone)
    try:
        doc = load_json_document(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("trajectory"), list):
            raise ImportFormatError(str(path), None, "not a SWE-agent trajectory: expected a JSON object "
                                    "with a \"trajectory\" list", "trajectory")
        log = debug_log_for(path)
        steps = doc["trajectory"]
        if log is None:
            yield from _order_only_records(doc, path, workflow_type, with_text, on_error, estimate_tokens)
            return
        runs = parse_debug_log(log, tz)
        matching = [r for r in runs if len(r) == len(steps)]
        if not matching:
            raise ImportFormatError(str(log), None, f"the log's runs have {[len(r) for r in runs]} steps but "
                                    f"{path.name} has {len(steps)}: not the log of this trajectory")
    except ImportFormatError as err:
        report(on_error, err)
        return
    logged = matching[-1]
    workflow_id = workflow_id_for(path)
    wf_type = workflow_type or DEFAULT_WORKFLOW_TYPE
    model = _model_of(doc)
    for index, (step, ls) in enumerate(zip(steps, logged)):
        where = f"{path}#trajectory[{index}]"
        if not isinstance(step, dict):
            report(on_error, ImportFormatError(str(path), None, f"trajectory[{index}] is not an object"))
            continue
        if not ls.calls:
            report(on_error, ImportFormatError(str(log), ls.log_line, f"STEP {ls.number} has no "
                                               "input_tokens=... line: no LLM call was logged for it"))
            continue
        try:
            execution_time = float(step.get("execution_time") or 0.0)
        except (TypeError, ValueError):
            report(on_error, ImportFormatError(str(path), None, f"trajectory[{index}]: not a number",
                                               "execution_time"))
            continue
        query = step.get("query") or []
        agent = next((m.get("agent") for m in reversed(query) if isinstance(m, dict) and m.get("agent")), "main")
        t_prev = ls.t_start
        for j, (t_finish, n_in, n_out) in enumerate(ls.calls):
            last = j == len(ls.calls) - 1
            rec: dict[str, Any] = {
                "request_id": f"{workflow_id}/step{ls.number}" + ("" if last else f"-requery{j + 1}"),
                "workflow_type_id": wf_type, "workflow_id": workflow_id, "agent_id": str(agent),
                "t_arrival": t_prev, "t_finish": max(t_finish, t_prev),
                "input_tokens": n_in, "output_tokens": n_out,
            }
            if model:
                rec["model"] = model
            if last:
                tool = first_word(step.get("action") or "")
                if tool:
                    t_start = max(ls.t_action or t_finish, t_finish)
                    rec["tool_calls"] = [{"name": tool, "t_start": t_start, "t_end": t_start + execution_time,
                                          "status": "ok"}]
                if with_text:
                    if (messages := _chat(query)):
                        rec["messages"] = messages
                    if isinstance(step.get("response"), str):
                        rec["response_text"] = step["response"]
                rec["action"] = (step.get("action") or "")[:500]
            else:
                rec["requery"] = True
            rec.update({"step": ls.number, "source_format": NAME,
                        "import_source": where, "log_source": f"{log}:{ls.log_line}"})
            yield rec
            t_prev = t_finish


def _step_tokens(steps: list, info: dict) -> list[tuple[int, int] | None]:
    """(input, output) tokens of each step where the trajectory holds them (see module docstring)."""
    out: list[tuple[int, int] | None] = []
    prev: tuple[int, int] | None = (0, 0)
    for step in steps:
        stats = None
        if isinstance(step, dict):
            extra = step.get("extra_info") if isinstance(step.get("extra_info"), dict) else {}
            stats = extra.get("model_stats") or step.get("model_stats")
        tokens = None
        if isinstance(stats, dict):
            sent, received = count_field(stats.get("tokens_sent")), count_field(stats.get("tokens_received"))
            n_in = count_field(stats.get("input_tokens", stats.get("prompt_tokens")))
            n_out = count_field(stats.get("output_tokens", stats.get("completion_tokens")))
            if sent is not None and received is not None:  # cumulative: this step's share
                if prev is not None and sent >= prev[0] and received >= prev[1]:
                    tokens = (sent - prev[0], received - prev[1])
                prev = (sent, received)
            elif n_in is not None and n_out is not None:
                tokens = (n_in, n_out)
        out.append(tokens)
    total = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    if len(steps) == 1 and out[0] is None and count_field(total.get("api_calls")) == 1:
        sent, received = count_field(total.get("tokens_sent")), count_field(total.get("tokens_received"))
        if sent is not None and received is not None:
            out[0] = (sent, received)
    return out


def _text_bytes(value: Any) -> int:
    """UTF-8 bytes of a message content (a string, or a list of ``{"text": ...}`` parts)."""
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, list):
        return sum(_text_bytes(p.get("text") if isinstance(p, dict) else p) for p in value)
    return 0


def estimate_step_tokens(step: dict) -> tuple[int, int] | None:
    """(input, output) tokens of a step estimated from its text (:data:`ESTIMATE_METHOD`): the
    ``query`` messages it sent and the ``response`` it got; None without a query."""
    query = step.get("query")
    if not isinstance(query, list) or not query:
        return None
    n_in = sum(_text_bytes(m.get("content")) for m in query if isinstance(m, dict))
    return -(-n_in // 4), -(-_text_bytes(step.get("response") or "") // 4)


def _order_only_records(doc: dict, path: Path, workflow_type: str | None, with_text: bool,
                        on_error: ErrorHandler | None, estimate_tokens: bool = False) -> Iterator[dict]:
    """Records of a .traj read without its debug log: in order, tokens from the steps (or, with
    run totals only, unknown or estimated from the text)."""
    steps = doc["trajectory"]
    info = doc.get("info") if isinstance(doc.get("info"), dict) else {}
    tokens: list[tuple[int, int] | None] = _step_tokens(steps, info)
    flags: dict[str, Any] = {}
    if steps and not any(tokens):
        totals = info.get("model_stats") or {}
        what = (f"only the run's totals: tokens_sent={totals.get('tokens_sent')}, tokens_received="
                f"{totals.get('tokens_received')}, api_calls={totals.get('api_calls')}")
        if estimate_tokens:
            tokens = [estimate_step_tokens(s) if isinstance(s, dict) else None for s in steps]
            flags = {"tokens_estimated": True, "token_estimate_method": ESTIMATE_METHOD}
            warn(on_error, path, f"no per-call token counts ({what}): estimated from each step's query and "
                 f"response ({ESTIMATE_METHOD}), flagged tokens_estimated", field="trajectory[].query")
        else:
            tokens = [(0, 0)] * len(steps)
            flags = {"tokens_unknown": True}
            warn(on_error, path, f"no per-call token counts ({what}): {len(steps)} steps imported in order with "
                 "their tools and execution times, token counts unknown (left out of output-length bands; "
                 f"--estimate-tokens estimates them from the text, or put {path.stem}.debug.log beside it)",
                 field="trajectory[].extra_info.model_stats")
    yield from _ordered(doc, path, steps, tokens, flags, workflow_type, with_text, on_error)


def _ordered(doc: dict, path: Path, steps: list, tokens: list[tuple[int, int] | None], flags: dict[str, Any],
             workflow_type: str | None, with_text: bool, on_error: ErrorHandler | None) -> Iterator[dict]:
    workflow_id = workflow_id_for(path)
    model = _model_of(doc)
    records: list[dict] = []
    for index, (step, tok) in enumerate(zip(steps, tokens)):
        if not isinstance(step, dict) or tok is None:
            report(on_error, ImportFormatError(str(path), None, f"trajectory[{index}]: no token counts for this "
                                               "step; skipped", "trajectory[].extra_info.model_stats"))
            continue
        query = step.get("query") or []
        agent = next((m.get("agent") for m in reversed(query) if isinstance(m, dict) and m.get("agent")), "main")
        rec: dict[str, Any] = {
            "request_id": f"{workflow_id}/step{index + 1}", "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE,
            "workflow_id": workflow_id, "agent_id": str(agent), "input_tokens": tok[0], "output_tokens": tok[1],
            **flags,
        }
        if model:
            rec["model"] = model
        if (tool := first_word(step.get("action") or "")):
            rec["tool_calls"] = [{"name": tool, "t_start": 0.0, "t_end": 0.0, "status": "ok"}]
            try:
                rec["tool_execution_s"] = max(0.0, float(step.get("execution_time")))
            except (TypeError, ValueError):
                pass
        if with_text:
            if (messages := _chat(query)):
                rec["messages"] = messages
            if isinstance(step.get("response"), str):
                rec["response_text"] = step["response"]
        rec.update({"action": (step.get("action") or "")[:500], "step": index + 1, "source_format": NAME,
                    "import_source": f"{path}#trajectory[{index}]"})
        records.append(rec)
    for rec in number_in_order(records):
        for tool in rec.get("tool_calls", []):
            tool["t_start"] = rec["t_finish"]
            tool["t_end"] = rec["t_finish"] + rec.get("tool_execution_s", 0.0)
        if "tool_execution_s" in rec:
            rec["tool_timing"] = "duration_only"
        yield rec
