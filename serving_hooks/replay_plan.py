"""What `profiler replay` sends: recorded workflows turned into a closed-loop call graph.

The logs are read through the project's own ingest (an in-memory store), so every log format
`profiler fit` accepts replays. Each recorded call becomes a :class:`PlannedCall`:

* **parents** — the calls that must finish before it is sent: its ``parent_request_ids`` when the
  log gives them, otherwise the latest earlier call of the workflow that had *finished* when it
  arrived (for a sequential agent loop that is the previous call; calls that overlapped in the
  recording stay concurrent). A call with no parent is released ``delay_s`` after its workflow
  starts.
* **delay_s** — the recorded tool/think gap: ``t_arrival - max(t_finish of parents)`` (the same
  quantity as the store's ``gap_after_s`` for a sequential loop), or the offset from the
  workflow's first arrival when there is no parent; never negative. The replayer multiplies it by
  ``--time-scale``.
* **input_tokens / output_tokens** — the recorded prompt length (the synthetic prompt is sized to
  it) and completion length (sent as ``max_tokens``).

**The replay's clock.** A replay at ``--time-scale s`` shortens every tool/think gap ``s``-fold
while the engine decides how long each call takes. A profile fitted on the recorded times then
predicts keep-alive TTLs, tool latencies and ages ``1/s`` too long for that traffic (at
``s = 0.02``: a 1.3 s TTL against ~30 ms gaps, and keep/drop retention keeps almost everything).
:func:`on_replay_clock` puts records on the replay's clock — idle time × ``s``, time with a call
in flight unchanged — and the profile a gateway serves during a replay is fitted on those
(``bench/bench_engine.py`` does).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path


from store.ingest import ingest
from store.duckdb_store import connect


@dataclass
class PlannedCall:
    request_id: str
    agent_id: str
    parents: list[str]
    delay_s: float
    input_tokens: int
    output_tokens: int


@dataclass
class PlannedWorkflow:
    workflow_type_id: str
    workflow_id: str
    t_start: float                       # recorded first arrival (epoch s): orders the replay
    calls: list[PlannedCall] = field(default_factory=list)   # in recorded arrival order
    recorded_jct_s: float = 0.0          # last recorded finish - first recorded arrival


_CALLS_SQL = """
SELECT workflow_type_id, workflow_id, request_id, agent_id, t_arrival, t_finish,
       input_tokens, output_tokens, parent_request_ids
FROM calls
ORDER BY min(t_arrival) OVER (PARTITION BY workflow_id), workflow_id, call_index
"""


def load_plan(paths: Sequence[str | Path], *, max_workflows: int | None = None,
              workflow_types: Sequence[str] | None = None,
              token_scale: float = 1.0) -> tuple[list[PlannedWorkflow], str]:
    """Ingest ``paths`` into a throw-away in-memory store and build the replay plan.

    ``token_scale`` multiplies every recorded input and output length (e.g. 0.05 to replay
    long-context traces on a small test engine); the timing structure is unchanged.

    Returns the workflows in recorded start order and the ingest summary line. Raises
    :class:`store.ingest.IngestError` when no log file is found, ``ValueError`` when no valid
    call is left.
    """
    if token_scale <= 0:
        raise ValueError(f"token_scale must be > 0, not {token_scale}")
    con = connect(None)
    report = ingest(con, list(paths))
    rows = con.execute(_CALLS_SQL).fetchall()
    con.close()
    wanted = set(workflow_types or ())
    workflows: list[PlannedWorkflow] = []
    by_id: dict[str, PlannedWorkflow] = {}
    finishes: dict[str, dict[str, float]] = {}
    arrivals: dict[str, list[tuple[str, float, float]]] = {}
    for wtype, wid, rid, agent, t_arr, t_fin, n_in, n_out, parent_ids in rows:
        if wanted and wtype not in wanted:
            continue
        wf = by_id.get(wid)
        if wf is None:
            if max_workflows is not None and len(workflows) >= max_workflows:
                continue
            wf = by_id[wid] = PlannedWorkflow(wtype, wid, t_arr)
            workflows.append(wf)
            finishes[wid], arrivals[wid] = {}, []
        done = finishes[wid]
        parents = _parents(parent_ids, done, arrivals[wid], t_arr)
        anchor = max((done[p] for p in parents), default=wf.t_start)
        wf.calls.append(PlannedCall(rid, agent, parents, max(0.0, t_arr - anchor),
                                    max(0, round(n_in * token_scale)),
                                    max(1, round(n_out * token_scale))))
        done[rid] = t_fin
        arrivals[wid].append((rid, t_arr, t_fin))
        wf.recorded_jct_s = max(wf.recorded_jct_s, t_fin - wf.t_start)
    if not workflows:
        raise ValueError("no valid calls to replay in " + ", ".join(map(str, paths))
                         + (f" (workflow types {sorted(wanted)})" if wanted else ""))
    return workflows, report.summary()


def on_replay_clock(records: Sequence[dict], time_scale: float,
                    call_scale: float | None = None) -> list[dict]:
    """Copies of flat records (log-format §1) with their times on the clock of a replay at
    ``time_scale`` (module doc): a call is sent ``time_scale ×`` its recorded gap (``delay_s``,
    :func:`load_plan`'s parents and gaps) after its parents finish, and lasts ``call_scale ×``
    its recorded duration; its ``tool_calls`` happen ``time_scale ×`` as long after its finish.
    Each workflow's first arrival stays where it was.

    ``call_scale`` None scales the calls like the gaps — every time ``× time_scale``, the
    profile of "the time-scaled records". The replay cannot know how long the engine will take
    a call; give ``call_scale`` when that ratio (engine time / recorded time) is known. It
    matters where a TTL spans other calls (the gap after one of several parallel calls lasts
    until its siblings finish); a TTL over a tool or think gap is ``time_scale ×`` the recorded
    one either way.
    """
    if time_scale < 0 or (call_scale is not None and call_scale < 0):
        raise ValueError(f"time scales must be >= 0, not {time_scale}, {call_scale}")
    call_scale = time_scale if call_scale is None else call_scale
    out = [dict(r) for r in records]
    by_wf: dict[tuple, list[dict]] = defaultdict(list)
    for r in out:
        by_wf[(r.get("workflow_type_id"), r.get("workflow_id"))].append(r)
    for calls in by_wf.values():
        calls.sort(key=lambda r: float(r["t_arrival"]))
        t_start = float(calls[0]["t_arrival"])
        done: dict[str, float] = {}           # recorded finishes
        moved: dict[str, float] = {}          # finishes on the replay's clock
        arrivals: list[tuple[str, float, float]] = []
        for r in calls:
            rid, t_arr, t_fin = str(r["request_id"]), float(r["t_arrival"]), float(r["t_finish"])
            parents = _parents(r.get("parent_request_ids"), done, arrivals, t_arr)
            anchor = max((done[p] for p in parents), default=t_start)
            new_arr = max((moved[p] for p in parents), default=t_start) \
                + time_scale * max(0.0, t_arr - anchor)
            r["t_arrival"], r["t_finish"] = new_arr, new_arr + call_scale * (t_fin - t_arr)
            if r.get("t_first_token") is not None:
                r["t_first_token"] = new_arr + call_scale * (float(r["t_first_token"]) - t_arr)
            if r.get("tool_calls"):
                r["tool_calls"] = [{**tc, **{k: r["t_finish"] + time_scale * (float(tc[k]) - t_fin)
                                             for k in ("t_start", "t_end") if tc.get(k) is not None}}
                                   for tc in r["tool_calls"]]
            done[rid], moved[rid] = t_fin, r["t_finish"]
            arrivals.append((rid, t_arr, t_fin))
    return out


def _parents(parent_ids: Sequence[str] | None, done: dict[str, float],
             arrivals: list[tuple[str, float, float]], t_arr: float) -> list[str]:
    """A call's parents (module doc): its ``parent_request_ids`` already seen, else the latest
    earlier call of its workflow that had finished when it arrived (ties: the later one)."""
    if parent_ids:
        return [p for p in parent_ids if p in done]
    finished = [(f, r) for r, a, f in arrivals if f <= t_arr]
    return [max(finished)[1]] if finished else []
