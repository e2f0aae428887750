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
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from profiler.ingest import ingest
from profiler.store import connect


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
    :class:`profiler.ingest.IngestError` when no log file is found, ``ValueError`` when no valid
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
        if parent_ids:
            parents = [p for p in parent_ids if p in done]
        else:
            # latest earlier call already finished when this one arrived (ties: the later one)
            finished = [(f, r) for r, a, f in arrivals[wid] if f <= t_arr]
            parents = [max(finished)[1]] if finished else []
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
