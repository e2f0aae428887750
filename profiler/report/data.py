"""What the report reads from the DuckDB store: aggregates only, so a store of millions of calls
costs a few grouped queries, not a copy into Python.

The store is attached **read-only** to an in-memory DuckDB connection; workflow sequences for
the graph are read from a deterministic sample of at most ``max_workflows`` workflows per type
(chosen by a hash of the workflow id), copied into a temporary ``calls`` table so that
:func:`synth.sequences.load_sequences` can group fan-out steps exactly as the fit did.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import duckdb
import numpy as np

from store.duckdb_store import sql_string, store_counts  # noqa: F401  (the report's store summary)

#: Histogram bins per agent (log-spaced between the agent's shortest and longest output).
HIST_BINS = 40
#: Probability levels at which each tool's empirical latency CDF is sampled.
CDF_LEVELS = [round(float(q), 4) for q in np.linspace(0.0, 1.0, 201)]


class StoreUnavailable(Exception):
    """The store cannot be opened (missing, or locked by a running fit)."""


def open_store(path: Path) -> duckdb.DuckDBPyConnection:
    """In-memory connection with the store attached read-only as ``store``."""
    if not Path(path).exists():
        raise StoreUnavailable(f"no store at {path}")
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH {sql_string(path)} AS store (READ_ONLY)")
    except duckdb.Error as exc:
        con.close()
        raise StoreUnavailable(f"cannot open {path} read-only ({str(exc).splitlines()[0]}); "
                               "is a fit writing to it right now?") from exc
    return con


def symbol_sequences(con: duckdb.DuckDBPyConnection, workflow_type: str,
                     max_workflows: int) -> tuple[list[tuple[str, ...]], int]:
    """Step-symbol sequences of up to ``max_workflows`` workflows of one type, and how many
    workflows the type has in all."""
    from synth.sequences import load_sequences

    total = con.execute("SELECT count(DISTINCT workflow_id) FROM store.calls WHERE workflow_type_id = ?",
                        [workflow_type]).fetchone()[0]
    con.execute("""
        CREATE OR REPLACE TEMP TABLE calls AS
        SELECT c.* FROM store.calls c
        JOIN (SELECT DISTINCT workflow_id FROM store.calls WHERE workflow_type_id = $wt
              ORDER BY hash(workflow_id), workflow_id LIMIT $n) s USING (workflow_id)
        WHERE c.workflow_type_id = $wt
    """, {"wt": workflow_type, "n": int(max_workflows)})
    try:
        seqs = load_sequences(con, workflow_type).get(workflow_type, [])
    finally:
        con.execute("DROP TABLE IF EXISTS temp.calls")
    return [s.step_symbols for s in seqs], int(total)


@dataclass
class Histogram:
    """Output-length histogram of one agent (log-spaced bins) and how its band covers it."""

    agent: str
    edges: np.ndarray     # HIST_BINS + 1 bin edges in tokens
    counts: np.ndarray    # HIST_BINS counts
    n: int
    inside: int | None = None  # calls with lo <= output_tokens <= hi (set by band_coverage)


def output_histograms(con: duckdb.DuckDBPyConnection, workflow_type: str) -> dict[str, Histogram]:
    """Per agent: counts of ``output_tokens`` in log-spaced bins, computed in SQL.

    Bin k of an agent with range [lo, hi] holds tokens t with
    ``floor(K · (ln(t+1) − ln(lo+1)) / (ln(hi+1) − ln(lo+1))) = k`` (the last bin closed).
    """
    rows = con.execute(f"""
        WITH r AS (
          SELECT agent_id, min(output_tokens) AS lo, max(output_tokens) AS hi, count(*) AS n
          FROM store.calls WHERE workflow_type_id = $wt AND status = 'ok' GROUP BY agent_id
        )
        SELECT c.agent_id, any_value(r.lo), any_value(r.hi), any_value(r.n),
          least({HIST_BINS - 1}, CASE WHEN any_value(r.hi) = any_value(r.lo) THEN 0 ELSE
            floor({HIST_BINS} * (ln(c.output_tokens + 1) - ln(any_value(r.lo) + 1))
                  / (ln(any_value(r.hi) + 1) - ln(any_value(r.lo) + 1))) END)::INTEGER AS bin,
          count(*) AS k
        FROM store.calls c JOIN r USING (agent_id)
        WHERE c.workflow_type_id = $wt AND c.status = 'ok'
        GROUP BY c.agent_id, c.output_tokens
    """, {"wt": workflow_type}).fetchall()
    out: dict[str, Histogram] = {}
    for agent, lo, hi, n, b, k in rows:
        h = out.get(agent)
        if h is None:
            edges = np.expm1(np.linspace(np.log1p(lo), np.log1p(hi if hi > lo else lo + 1), HIST_BINS + 1))
            h = out[agent] = Histogram(agent, edges, np.zeros(HIST_BINS, dtype=np.int64), int(n))
        h.counts[int(b)] += int(k)
    return dict(sorted(out.items()))


def band_coverage(con: duckdb.DuckDBPyConnection, workflow_type: str,
                  bands: dict[str, tuple[int, int]]) -> dict[str, int]:
    """Per agent: calls of the store whose output length lies inside the agent's band."""
    if not bands:
        return {}
    con.execute("CREATE OR REPLACE TEMP TABLE _bands (agent_id VARCHAR, lo BIGINT, hi BIGINT)")
    con.executemany("INSERT INTO _bands VALUES (?, ?, ?)", [(a, lo, hi) for a, (lo, hi) in bands.items()])
    rows = con.execute("""
        SELECT b.agent_id, count(*) FILTER (WHERE c.output_tokens BETWEEN b.lo AND b.hi)
        FROM store.calls c JOIN _bands b USING (agent_id)
        WHERE c.workflow_type_id = ? AND c.status = 'ok' GROUP BY 1
    """, [workflow_type]).fetchall()
    con.execute("DROP TABLE _bands")
    return {a: int(k) for a, k in rows}


def tool_latency_quantiles(con: duckdb.DuckDBPyConnection, workflow_type: str) -> dict[str, tuple[int, np.ndarray]]:
    """Per tool: (executions, latency at each of :data:`CDF_LEVELS`) — the empirical CDF sampled
    at 201 probability levels, enough for a plot at any data size. Discrete quantiles (observed
    values, no interpolation), so the curve is the true step function, not a diagonal."""
    rows = con.execute(f"""
        SELECT tool_name, count(*), quantile_disc(latency_s, {CDF_LEVELS})
        FROM store.tool_calls WHERE workflow_type_id = ? AND latency_s IS NOT NULL
        GROUP BY tool_name ORDER BY tool_name
    """, [workflow_type]).fetchall()
    return {tool: (int(n), np.asarray(q, dtype=float)) for tool, n, q in rows}


#: Below this many observations a distribution is drawn as a strip of dots, not a histogram/CDF.
SMALL_N = 20


def small_sample_outputs(con: duckdb.DuckDBPyConnection, workflow_type: str,
                         below: int = SMALL_N) -> dict[str, list[int]]:
    """Per agent with fewer than ``below`` ok calls: every output length (for a strip plot)."""
    rows = con.execute("""
        SELECT agent_id, list(output_tokens ORDER BY output_tokens)
        FROM store.calls WHERE workflow_type_id = ? AND status = 'ok' AND output_tokens IS NOT NULL
        GROUP BY agent_id HAVING count(*) < ? ORDER BY count(*) DESC, agent_id
    """, [workflow_type, below]).fetchall()
    return {a: [int(v) for v in vals] for a, vals in rows}


def small_sample_latencies(con: duckdb.DuckDBPyConnection, workflow_type: str,
                           below: int = SMALL_N) -> dict[str, list[float]]:
    """Per tool with fewer than ``below`` timed executions: every latency (for a strip plot)."""
    rows = con.execute("""
        SELECT tool_name, list(latency_s ORDER BY latency_s)
        FROM store.tool_calls WHERE workflow_type_id = ? AND latency_s IS NOT NULL
        GROUP BY tool_name HAVING count(*) < ? ORDER BY tool_name
    """, [workflow_type, below]).fetchall()
    return {t: [float(v) for v in vals] for t, vals in rows}


@dataclass
class Timeline:
    """One workflow's calls and tool executions in time (or, for order-only logs, in order).

    ``calls``: (agent, start, end) per call; ``tools``: (tool, start, end) per execution;
    ``real_times`` is False when the log has no real times (``extra.timing`` =
    ``synthetic_order``, or every call at the same instant): then start/end are call positions.
    """

    workflow_id: str
    calls: list[tuple[str, float, float]]
    tools: list[tuple[str, float, float]]
    real_times: bool


def sample_timelines(con: duckdb.DuckDBPyConnection, workflow_type: str, k: int = 3) -> list[Timeline]:
    """``k`` workflows of the type, taken at evenly spaced quantiles of their call count (short,
    typical, long; a hash of the id breaks ties, so the choice is stable)."""
    ids = [r[0] for r in con.execute("""
        SELECT workflow_id FROM store.calls WHERE workflow_type_id = ?
        GROUP BY workflow_id ORDER BY count(*), hash(workflow_id), workflow_id
    """, [workflow_type]).fetchall()]
    if not ids:
        return []
    picks = sorted({ids[round(q * (len(ids) - 1))] for q in np.linspace(0.2, 0.95, k)},
                   key=ids.index)
    out = []
    for wid in picks:
        calls = con.execute("""
            SELECT agent_id, t_arrival, t_finish, json_extract_string(extra, '$.timing')
            FROM store.calls WHERE workflow_type_id = ? AND workflow_id = ?
            ORDER BY call_index, t_arrival, request_id
        """, [workflow_type, wid]).fetchall()
        tools = con.execute("""
            SELECT tool_name, t_start, t_end FROM store.tool_calls
            WHERE workflow_type_id = ? AND workflow_id = ? AND t_start IS NOT NULL AND t_end IS NOT NULL
            ORDER BY t_start
        """, [workflow_type, wid]).fetchall()
        synthetic = any(c[3] == "synthetic_order" for c in calls)
        spans = [(c[1], c[2]) for c in calls if c[1] is not None and c[2] is not None]
        same_instant = len(calls) > 1 and len({s for s, _ in spans}) <= 1
        if synthetic or len(spans) < len(calls) or same_instant:
            out.append(Timeline(wid, [(c[0], float(i), float(i) + 0.8) for i, c in enumerate(calls)], [], False))
        else:
            t0 = min(s for s, _ in spans)
            out.append(Timeline(wid, [(c[0], c[1] - t0, c[2] - t0) for c in calls],
                                [(t, s - t0, e - t0) for t, s, e in tools], True))
    return out
