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

from profiler.store import sql_string, store_counts  # noqa: F401  (the report's store summary)

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
    at 201 probability levels, enough for a plot at any data size."""
    rows = con.execute(f"""
        SELECT tool_name, count(*), quantile_cont(latency_s, {CDF_LEVELS})
        FROM store.tool_calls WHERE workflow_type_id = ? AND latency_s IS NOT NULL
        GROUP BY tool_name ORDER BY tool_name
    """, [workflow_type]).fetchall()
    return {tool: (int(n), np.asarray(q, dtype=float)) for tool, n, q in rows}
