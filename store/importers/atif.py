"""ATIF trajectories (Agent Trajectory Interchange Format, Harbor; v1.0 - v1.7) -> flat records.

An ATIF file (laude-institute/harbor ``docs/rfcs/0001-trajectory-format.md``; Harbor's
``harbor/models/trajectories``) is one JSON document::

    {"schema_version": "ATIF-v1.7", "session_id", "trajectory_id", "agent": {"name", "version",
     "model_name"}, "steps": [{"step_id": 1, "timestamp": "2026-10-05T12:00:00.000Z",
     "source": "system" | "user" | "agent", "model_name", "message", "reasoning_content",
     "tool_calls": [{"tool_call_id", "function_name", "arguments"}],
     "observation": {"results": [{"source_call_id", "content", "subagent_trajectory_ref"}]},
     "metrics": {"prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd"}}],
     "final_metrics": {...}, "subagent_trajectories": [<ATIF trajectory>, ...]}

One flat record per ``agent`` step with ``metrics`` (an LLM turn):

=============================================  ===============================================
source                                         flat record field
=============================================  ===============================================
``metrics.prompt_tokens`` / ``completion``     ``input_tokens`` / ``output_tokens``
``metrics.cached_tokens``                      ``cached_tokens``
``timestamp`` of the step                      ``t_arrival`` = ``t_finish``, ``timing =
                                               "created_only"`` (one stamp per turn: gaps are
                                               real, durations unknown); no timestamp: the
                                               step's position, ``timing = "synthetic_order"``
``tool_calls[].function_name``                 ``action`` / ``tool_names`` (tools have no times)
``step.model_name`` (else ``agent.model_name``)  ``model``
``agent.name``                                 ``agent_id`` (an embedded subagent trajectory's
                                               steps get its own ``agent.name``)
``session_id`` of the root trajectory          ``workflow_id``
``message`` / previous steps                   ``response_text`` / ``messages``
=============================================  ===============================================

An agent step without ``metrics`` (token counts) is not a call we can size: when no step has
them the file gives no calls and says so. A timestamp without offset is read in ``timezone``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

from store.importers._common import (
    TIMING_ONE_STAMP,
    TIMING_ORDER_ONLY,
    ErrorHandler,
    ImportFormatError,
    count_field,
    iso_to_epoch,
    load_json_document,
    report,
    resolve_timezone,
)

NAME = "atif"
ALIASES = ("harbor",)
SUMMARY = "ATIF v1.x agent trajectories (Harbor trajectory.json, with embedded subagents)"
FILE_PATTERNS = ("trajectory.json", "*.trajectory.json", "*.atif.json")
DEFAULT_WORKFLOW_TYPE = "atif"


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # multimodal content parts
        return "\n".join(str(p.get("text", "")) for p in value if isinstance(p, dict))
    return ""


def _walk(traj: dict, workflow_id: str, path: Path, where: str, tz, workflow_type: str | None, with_text: bool,
          on_error: ErrorHandler | None, stats: dict) -> Iterator[dict]:
    agent = traj.get("agent") if isinstance(traj.get("agent"), dict) else {}
    agent_id = str(agent.get("name") or "agent")
    steps = traj.get("steps")
    if not isinstance(steps, list):
        report(on_error, ImportFormatError(str(path), None, f"{where}: no \"steps\" list", f"{where}.steps"))
        return
    history: list[dict] = []
    for k, step in enumerate(steps):
        if not isinstance(step, dict):
            continue
        source = step.get("source")
        role = {"agent": "assistant", "user": "user", "system": "system"}.get(str(source), "user")
        metrics = step.get("metrics") if isinstance(step.get("metrics"), dict) else None
        if source == "agent":
            stats["agent_steps"] += 1
        if source == "agent" and metrics is not None:
            n_in, n_out = count_field(metrics.get("prompt_tokens")), count_field(metrics.get("completion_tokens"))
            field = f"{where}.steps[{k}].metrics"
            if n_in is None or n_out is None:
                report(on_error, ImportFormatError(str(path), None, "prompt_tokens / completion_tokens missing; "
                                                   "step skipped", field))
            else:
                rec: dict[str, Any] = {
                    "request_id": f"{workflow_id}/{traj.get('trajectory_id') or agent_id}/step{step.get('step_id', k + 1)}",
                    "workflow_type_id": workflow_type or DEFAULT_WORKFLOW_TYPE, "workflow_id": workflow_id,
                    "agent_id": agent_id, "input_tokens": n_in, "output_tokens": n_out,
                }
                stamp = step.get("timestamp")
                try:
                    t = iso_to_epoch(str(stamp), tz) if stamp else None
                except ValueError:
                    report(on_error, ImportFormatError(str(path), None, f"unreadable timestamp {stamp!r}; step "
                                                       "skipped", f"{where}.steps[{k}].timestamp"))
                    continue
                if t is None:
                    rec["t_arrival"] = rec["t_finish"] = float(stats["calls"])
                    rec["timing"] = TIMING_ORDER_ONLY
                else:
                    rec["t_arrival"] = rec["t_finish"] = t
                    rec["timing"] = TIMING_ONE_STAMP
                if (cached := count_field(metrics.get("cached_tokens"))) is not None:
                    rec["cached_tokens"] = cached
                if (model := step.get("model_name") or agent.get("model_name")):
                    rec["model"] = str(model)
                tools = [str(c.get("function_name")) for c in step.get("tool_calls") or []
                         if isinstance(c, dict) and c.get("function_name")]
                if tools:
                    rec["action"], rec["tool_names"] = tools[0], tools
                if with_text:
                    if history:
                        rec["messages"] = list(history)
                    rec["response_text"] = _text(step.get("message"))
                rec.update({"step": step.get("step_id", k + 1), "source_format": NAME,
                            "import_source": f"{path}#{where}.steps[{k}]"})
                stats["calls"] += 1
                yield rec
        if with_text:
            history.append({"role": role, "content": _text(step.get("message"))})
            obs = step.get("observation") if isinstance(step.get("observation"), dict) else {}
            for res in obs.get("results") or []:
                if isinstance(res, dict) and isinstance(res.get("content"), str):
                    history.append({"role": "tool", "tool_call_id": str(res.get("source_call_id") or ""),
                                    "content": res["content"]})
    for j, sub in enumerate(traj.get("subagent_trajectories") or []):
        if isinstance(sub, dict):
            yield from _walk(sub, workflow_id, path, f"{where}.subagent_trajectories[{j}]", tz, workflow_type,
                             with_text, on_error, stats)


def read_file(path: Path, *, workflow_type: str | None = None, timezone: str | None = None,
              with_text: bool = True, on_error: ErrorHandler | None = None, **_: Any) -> Iterator[dict]:
    """Flat records for one ATIF trajectory file and the subagent trajectories embedded in it."""
    try:
        doc = load_json_document(path)
        version = doc.get("schema_version") if isinstance(doc, dict) else None
        if not isinstance(version, str) or "ATIF" not in version.upper() and not version[:1].isdigit():
            raise ImportFormatError(str(path), None, "not an ATIF trajectory: no schema_version \"ATIF-v1.x\"",
                                    "schema_version")
    except ImportFormatError as err:
        report(on_error, err)
        return
    workflow_id = str(doc.get("session_id") or doc.get("trajectory_id") or path.parent.name or path.stem)
    stats = {"calls": 0, "agent_steps": 0}
    yield from _walk(doc, workflow_id, path, "trajectory", resolve_timezone(timezone), workflow_type, with_text,
                     on_error, stats)
    if stats["calls"] == 0:
        report(on_error, ImportFormatError(str(path), None, f"{stats['agent_steps']} agent steps but none has "
                                           "metrics.prompt_tokens/completion_tokens: no call can be sized",
                                           "steps[].metrics"))
