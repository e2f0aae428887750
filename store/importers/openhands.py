"""OpenHands evaluation output (``output.jsonl``) -> flat records.

Each line of an OpenHands evaluation ``output.jsonl`` is one ``EvalOutput``
(``evaluation/utils/shared.py`` of All-Hands-AI/OpenHands): ``{"instance_id", "instruction",
"metadata": {"agent_class", "llm_config": {"model", ...}, ...}, "history": [event, ...],
"metrics": {...}, "test_result", "error"}``. The parts read here (shapes as in
``openhands/llm/metrics.py`` and ``evaluation/benchmarks/multi_swe_bench/examples/output.jsonl``):

* ``metrics.token_usages``: one entry per LLM call — ``{"model", "prompt_tokens",
  "completion_tokens", "cache_read_tokens", "cache_write_tokens", "response_id"}``;
* ``metrics.response_latencies``: ``{"model", "latency", "response_id"}`` (seconds, round trip);
* ``history``: events ``{"id", "timestamp": "2025-04-30T16:32:57.821635", "source", "action" |
  "observation", "cause", "tool_call_metadata": {"function_name", "tool_call_id",
  "model_response": {"id", "choices": [...]}}, "llm_metrics": {"accumulated_token_usage": ...}}``.
  An *action* whose ``model_response.id`` is a call's ``response_id`` was produced by that call (an
  agent message without tool call has no ``tool_call_metadata``: it is matched by its
  ``llm_metrics`` running token totals, which equal the sum of ``token_usages`` up to its call);
  the *observation* with ``cause`` = the action's id is the tool's result.

One flat record per ``token_usages`` entry: ``t_finish`` = timestamp of the first action the
response produced, ``t_arrival`` = ``t_finish - latency``; tokens from the usage entry; each action
of that response whose observation exists becomes a ``tool_calls`` entry named by
``function_name`` (``execute_bash``, ``str_replace_editor``, ``think``...) from the action's to
the observation's timestamp. A call no event points to cannot be placed in time and is reported.
Event timestamps carry no offset (the agent machine's local time): the zone is taken from
``timezone`` or detected against the responses' ``created`` times, with a warning either way
when they disagree (:mod:`store.importers.openhands_time`). OpenHands V1 (the software agent
SDK) is read by :mod:`store.importers.openhands_v1`.

``workflow_id`` = ``<folder of output.jsonl>/<instance_id>``, ``agent_id`` = ``metadata.agent_class``,
``workflow_type_id`` = ``openhands`` unless given.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers import openhands_v1
from store.importers._common import (
    ErrorHandler,
    ImportFormatError,
    iso_to_epoch,
    iter_json_lines,
    report,
)
from store.importers.openhands_time import choose_zone

NAME = "openhands"
SUMMARY = ("OpenHands evaluation output.jsonl (V0 events or V1 SDK events) and V1 SDK conversation "
           "folders (base_state.json + events/)")
FILE_PATTERNS = ("output.jsonl", "output.jsonl.gz", "*.output.jsonl", "base_state.json")
DEFAULT_WORKFLOW_TYPE = "openhands"


def _response_id(event: dict) -> str | None:
    meta = event.get("tool_call_metadata")
    if not isinstance(meta, dict):
        return None
    return (meta.get("model_response") or {}).get("id")


def _running_total(event: dict) -> tuple[int, int] | None:
    """(prompt, completion) tokens accumulated up to the call that produced ``event``."""
    acc = ((event.get("llm_metrics") or {}).get("accumulated_token_usage") or {})
    try:
        return int(acc["prompt_tokens"]), int(acc["completion_tokens"])
    except (KeyError, TypeError, ValueError):
        return None


def _response_text(event: dict) -> str | None:
    choices = ((event.get("tool_call_metadata") or {}).get("model_response") or {}).get("choices") or []
    if choices and isinstance(choices[0], dict):
        content = (choices[0].get("message") or {}).get("content")
        return content if isinstance(content, str) else None
    return None


def _instance_records(out: dict, path: Path, line: int, tz, workflow_type: str | None, with_text: bool,
                      on_error: ErrorHandler | None) -> Iterator[dict]:
    def fail(reason: str, field: str | None = None) -> ImportFormatError:
        return ImportFormatError(str(path), line, reason, field)

    if not isinstance(out, dict) or not out.get("instance_id"):
        raise fail("not an OpenHands EvalOutput: no instance_id", "instance_id")
    history, metrics = out.get("history"), out.get("metrics")
    if not isinstance(history, list) or not all(isinstance(e, dict) and "timestamp" in e for e in history):
        raise fail("history events have no timestamps (an OpenHands output older than the event stream "
                   "format); calls cannot be placed in time", "history")
    usages = (metrics or {}).get("token_usages") if isinstance(metrics, dict) else None
    if not isinstance(usages, list):
        raise fail("no metrics.token_usages: this OpenHands version did not record per-call token usage",
                   "metrics.token_usages")
    latencies = {r.get("response_id"): r.get("latency") for r in (metrics.get("response_latencies") or [])
                 if isinstance(r, dict)}
    workflow_id = f"{path.parent.name}/{out['instance_id']}" if path.parent.name else str(out["instance_id"])
    meta = out.get("metadata") or {}
    agent = str(meta.get("agent_class") or "agent")
    default_model = (meta.get("llm_config") or {}).get("model")

    try:
        times = {e.get("id"): iso_to_epoch(str(e["timestamp"]), tz) for e in history}
    except ValueError as exc:
        raise fail(f"unreadable event timestamp ({exc})", "history[].timestamp")
    actions_of: dict[str, list[dict]] = {}
    by_running_total: dict[tuple[int, int], dict] = {}
    for e in sorted((e for e in history if "action" in e), key=lambda e: times[e.get("id")]):
        if (rid := _response_id(e)):
            actions_of.setdefault(rid, []).append(e)
        elif e.get("source") == "agent" and (total := _running_total(e)) is not None:
            by_running_total.setdefault(total, e)
    # An action without tool_call_metadata (a plain agent message) names no response id; its
    # llm_metrics snapshot (running token totals) still tells which call produced it.
    running = (0, 0)
    for usage in usages:
        if not isinstance(usage, dict):
            continue
        try:
            running = (running[0] + int(usage.get("prompt_tokens") or 0),
                       running[1] + int(usage.get("completion_tokens") or 0))
        except (TypeError, ValueError):
            continue
        rid = usage.get("response_id")
        if rid and rid not in actions_of and running in by_running_total:
            actions_of[rid] = [by_running_total[running]]
    result_of = {e.get("cause"): e for e in history if "observation" in e and e.get("cause") is not None}

    for k, usage in enumerate(usages):
        field = f"metrics.token_usages[{k}]"
        if not isinstance(usage, dict) or not usage.get("response_id"):
            report(on_error, fail("usage entry without response_id", field))
            continue
        rid = usage["response_id"]
        actions = actions_of.get(rid)
        if not actions:
            report(on_error, fail(f"response {rid}: no history event was produced by it, so its time is "
                                  "unknown; call skipped", field))
            continue
        latency = latencies.get(rid)
        try:
            n_in, n_out = int(usage["prompt_tokens"]), int(usage["completion_tokens"])
            latency = float(latency) if latency is not None else None
        except (KeyError, TypeError, ValueError) as exc:
            report(on_error, fail(f"response {rid}: bad or missing token count or latency ({exc})", field))
            continue
        if latency is None:
            report(on_error, fail(f"response {rid}: no response_latencies entry, so its start is unknown",
                                  "metrics.response_latencies"))
            continue
        t_finish = times[actions[0].get("id")]
        rec: dict[str, Any] = {
            "request_id": f"{workflow_id}/{rid}", "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE,
            "workflow_id": workflow_id, "agent_id": agent,
            "t_arrival": t_finish - latency, "t_finish": t_finish,
            "input_tokens": n_in, "output_tokens": n_out,
        }
        if usage.get("cache_read_tokens") is not None:
            rec["cached_tokens"] = int(usage["cache_read_tokens"])
        if usage.get("model") or default_model:
            rec["model"] = str(usage.get("model") or default_model)
        tools = []
        for a in actions:
            obs = result_of.get(a.get("id"))
            if obs is None:
                continue  # e.g. finish: nothing ran
            name = (a.get("tool_call_metadata") or {}).get("function_name") or a.get("action")
            tools.append({"name": str(name), "t_start": times[a.get("id")], "t_end": times[obs.get("id")],
                          "status": "error" if obs.get("observation") == "error" else "ok"})
        if tools:
            rec["tool_calls"] = tools
        if with_text and (text := _response_text(actions[0])) is not None:
            rec["response_text"] = text
        rec.update({"actions": [a.get("action") for a in actions], "source_format": NAME,
                    "import_source": f"{path}:{line}"})
        yield rec


def _created_of(event: dict) -> float | None:
    created = ((event.get("tool_call_metadata") or {}).get("model_response") or {}).get("created") \
        if isinstance(event.get("tool_call_metadata"), dict) else None
    return float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else None


def _clock_evidence(path: Path, limit: int = 500) -> tuple[list[tuple[str, float]], bool]:
    """(naive timestamp, created) pairs of model-made actions, and whether any timestamp has no
    offset, from a first pass over the file (bad lines are reported by the second pass)."""
    pairs: list[tuple[str, float]] = []
    any_naive = False
    for _, out in iter_json_lines(path, lambda err: None):
        history = out.get("history") if isinstance(out, dict) else None
        for e in history if isinstance(history, list) else []:
            if not isinstance(e, dict) or not isinstance(e.get("timestamp"), str):
                continue
            stamp = e["timestamp"]
            if not any_naive and not stamp.endswith("Z") and "+" not in stamp[10:] and "-" not in stamp[10:]:
                any_naive = True
            if len(pairs) < limit and (created := _created_of(e)) is not None:
                pairs.append((stamp, created))
    return pairs, any_naive


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              with_text: bool = True, on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for every instance of one ``output.jsonl`` (V0 or V1 events), or for one V1
    SDK conversation folder given by its ``base_state.json``."""
    if path.name == "base_state.json":
        yield from openhands_v1.read_conversation(path, workflow_type=workflow_type, timezone=timezone,
                                                  with_text=with_text, on_error=on_error)
        return
    pairs, any_naive = _clock_evidence(path)
    tz = choose_zone(path, timezone, pairs, any_naive, on_error)
    for line, out in iter_json_lines(path, on_error):
        try:
            if openhands_v1.is_v1_output(out):
                yield from openhands_v1.output_records(out, path, line, tz, workflow_type, with_text, on_error)
            else:
                yield from _instance_records(out, path, line, tz, workflow_type, with_text, on_error)
        except ImportFormatError as err:
            report(on_error, err)
