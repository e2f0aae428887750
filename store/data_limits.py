"""What a log can and cannot teach: the ``limitations`` section of a profile.

Imported traces do not all carry the same facts. A SWE-agent ``.traj`` without its debug log has
token counts and order but no times (``timing = "synthetic_order"``: t_arrival = t_finish = the
call's position); mini-SWE-agent and ATIF have one timestamp per call (``created_only``: the
gaps between calls are real, call durations are not). The fit never turns such stand-in times
into predictions: it looks at how the calls in the store were timed, and

* **order-only** (every call ``synthetic_order``, or ``profiler fit --order-only``): fits the
  output-length bands, next-agent / path automata and remaining-calls models, which need only
  token counts and order, and leaves the time models empty (tool latency, idle-gap keep-alive
  TTLs, call latency / TTFT / decode speed), saying so;
* **one stamp per call** (every call ``created_only`` or zero-length): fits everything but warns
  that call latency, TTFT and decode speed are not known and that idle gaps include the calls'
  own durations.

:func:`limitations` returns ``{"timing": "timed" | "mixed" | "one_stamp" | "order_only",
"calls_by_timing": {...}, "unavailable": {prediction: reason}, "notes": [...]}``; ``profiler fit``
prints it and ``profiler show`` repeats it.
"""
from __future__ import annotations

from typing import Any

import duckdb

ORDER_ONLY = "synthetic_order"
ONE_STAMP = "created_only"

#: Predictions that need real times, and why each is missing in an order-only profile.
TIME_PREDICTIONS = {
    "tool_latency": "tool latency and its keep-alive TTL need tool start/end times",
    "idle_gap": "idle-gap keep-alive TTLs need the time between a call's finish and the next arrival",
    "call_latency": "call latency, TTFT and decode speed need call start/finish times",
}


def calls_by_timing(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Number of ok calls per kind of timing: ``synthetic_order``, ``created_only`` (flagged, or a
    zero-length call), ``timed``."""
    rows = con.execute(
        "SELECT CASE WHEN json_extract_string(extra, '$.timing') = ? THEN ? "
        "WHEN json_extract_string(extra, '$.timing') = ? OR t_finish <= t_arrival THEN ? ELSE 'timed' END AS k, "
        "count(*) FROM calls WHERE status = 'ok' GROUP BY 1", [ORDER_ONLY, ORDER_ONLY, ONE_STAMP, ONE_STAMP]).fetchall()
    return {k: int(n) for k, n in rows}


def order_only_types(con: duckdb.DuckDBPyConnection) -> list[str]:
    """Workflow types whose ok calls all have stand-in times (``timing = synthetic_order``).

    Judged per type, not per log: in a mixed log a type with order-only times would otherwise
    get idle-gap TTLs and tool latencies fit on call positions (a served 1.0 s TTL), and
    ``profiler eval`` would count its position gaps as covered idle gaps."""
    return [r[0] for r in con.execute(
        "SELECT workflow_type_id FROM calls WHERE status = 'ok' GROUP BY 1 "
        "HAVING bool_and(coalesce(json_extract_string(extra, '$.timing') = ?, false)) "
        "ORDER BY 1", [ORDER_ONLY]).fetchall()]


def is_order_only(counts: dict[str, int], forced: bool = False) -> bool:
    """Fit from token counts and order alone: forced, or no call in the store has a real time."""
    return forced or (bool(counts) and set(counts) == {ORDER_ONLY})


def limitations(counts: dict[str, int], order_only: bool, timed_tools: int) -> dict[str, Any]:
    """The ``limitations`` section (see the module docstring)."""
    total = sum(counts.values())
    unavailable: dict[str, str] = {}
    notes: list[str] = []
    if order_only:
        kind = "order_only"
        unavailable.update(TIME_PREDICTIONS)
        notes.append("fit from token counts and call order alone: output-length bands, next agent, paths and "
                     "remaining calls are fit; no time is predicted")
    else:
        stamped = counts.get(ONE_STAMP, 0)
        ordered = counts.get(ORDER_ONLY, 0)
        kind = "one_stamp" if stamped == total and total else ("timed" if stamped + ordered == 0 else "mixed")
        if kind == "one_stamp":
            unavailable["call_latency"] = ("call latency, TTFT and decode speed: the logs have one timestamp "
                                           "per call (no durations)")
            notes.append("idle gaps are measured between call timestamps, so they include the calls' own durations")
        elif kind == "mixed":
            notes.append(f"{stamped + ordered:,} of {total:,} calls have no duration ({ordered:,} order-only); "
                         "latency statistics use the timed calls only where they can tell them apart")
        if timed_tools == 0:
            unavailable["tool_latency"] = "no tool execution in the logs has a start and end time"
    return {"timing": kind, "calls_by_timing": counts, "unavailable": unavailable, "notes": notes}


def note_order_only_types(section: dict[str, Any], types: list[str]) -> dict[str, Any]:
    """Add ``order_only_types`` (and a note) to a ``limitations`` section of a timed log."""
    if types and section["timing"] != "order_only":
        section["order_only_types"] = list(types)
        section["notes"].append(f"workflow types with order-only times get no time predictions "
                                f"(idle-gap TTL, tool latency): {', '.join(types)}")
    return section


def summary_lines(section: dict[str, Any]) -> list[str]:
    """The section as short lines for the terminal (empty for a fully timed profile)."""
    lines = [f"cannot predict {name.replace('_', ' ')}: {why}" for name, why in section.get("unavailable", {}).items()]
    return lines + [f"note: {n}" for n in section.get("notes", [])]
