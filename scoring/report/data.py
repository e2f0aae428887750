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


# ------------------------------------------------------------------ context, cache and load
@dataclass
class ContextGrowth:
    """Input tokens by call index over the workflows of a type.

    ``index``: call positions (0 = a workflow's first call) seen in at least ``MIN_AT_INDEX``
    workflows; ``q10``/``q50``/``q90``: quantiles of ``input_tokens`` at each; ``n``: workflows
    reaching it. ``lines``: a deterministic sample of whole workflows (call index, input tokens).
    ``cached_share[i]``: Σ cached_tokens / Σ input_tokens at each index over the calls that
    report ``cached_tokens`` (``None`` when no call of the type does); ``cached_calls``, ``calls``:
    how many calls report it, of all.
    """

    index: np.ndarray
    q10: np.ndarray
    q50: np.ndarray
    q90: np.ndarray
    n: np.ndarray
    lines: list[tuple[np.ndarray, np.ndarray]]
    cached_share: np.ndarray | None
    cached_calls: int
    calls: int
    cached_total_share: float | None


#: A call index enters the context-growth quantiles only when this many workflows reach it.
MIN_AT_INDEX = 3


def context_growth(con: duckdb.DuckDBPyConnection, workflow_type: str, lines: int = 40) -> ContextGrowth | None:
    """Input tokens (and the cached share of them) by call index, in a few grouped queries."""
    rows = con.execute("""
        SELECT call_index, count(DISTINCT workflow_id), quantile_cont(input_tokens, [0.1, 0.5, 0.9]),
               sum(cached_tokens) FILTER (WHERE cached_tokens IS NOT NULL),
               sum(input_tokens) FILTER (WHERE cached_tokens IS NOT NULL)
        FROM store.calls WHERE workflow_type_id = ? AND input_tokens IS NOT NULL AND call_index IS NOT NULL
        GROUP BY call_index ORDER BY call_index
    """, [workflow_type]).fetchall()
    if not rows:
        return None
    calls, cached_calls, cached_sum, cached_in = con.execute("""
        SELECT count(*), count(cached_tokens), coalesce(sum(cached_tokens), 0),
               coalesce(sum(input_tokens) FILTER (WHERE cached_tokens IS NOT NULL), 0)
        FROM store.calls WHERE workflow_type_id = ? AND input_tokens IS NOT NULL
    """, [workflow_type]).fetchone()
    keep = [r for r in rows if r[1] >= MIN_AT_INDEX] or rows[:1]
    q = np.array([r[2] for r in keep], dtype=float)
    share = None
    if cached_calls:
        share = np.array([(r[3] / r[4]) if r[4] else np.nan for r in keep], dtype=float)
    sample = con.execute("""
        SELECT list(call_index ORDER BY call_index), list(input_tokens ORDER BY call_index)
        FROM store.calls WHERE workflow_type_id = $wt AND input_tokens IS NOT NULL AND call_index IS NOT NULL
          AND workflow_id IN (SELECT DISTINCT workflow_id FROM store.calls WHERE workflow_type_id = $wt
                              ORDER BY hash(workflow_id), workflow_id LIMIT $n)
        GROUP BY workflow_id ORDER BY workflow_id
    """, {"wt": workflow_type, "n": int(lines)}).fetchall()
    return ContextGrowth(np.array([r[0] for r in keep]), q[:, 0], q[:, 1], q[:, 2],
                         np.array([r[1] for r in keep]),
                         [(np.asarray(i, dtype=float), np.asarray(t, dtype=float)) for i, t in sample],
                         share, int(cached_calls), int(calls),
                         float(cached_sum) / float(cached_in) if cached_in else None)


@dataclass
class Load:
    """Arrivals and concurrency of one workflow type over its log's time span.

    ``t``: seconds since the first call at ``len(t)`` evenly spaced instants; ``calls`` and
    ``workflows``: calls running and workflows open (first arrival ≤ t < last finish) at each;
    ``arrivals``: workflows started in each bin ``[t_k, t_k+1)`` (one fewer value than ``t``).
    """

    t: np.ndarray
    calls: np.ndarray
    workflows: np.ndarray
    arrivals: np.ndarray
    bin_s: float


def has_real_times(con: duckdb.DuckDBPyConnection, workflow_type: str) -> bool:
    """False for order-only logs (``extra.timing = synthetic_order``, or no finish times)."""
    synthetic, timed = con.execute("""
        SELECT count(*) FILTER (WHERE json_extract_string(extra, '$.timing') = 'synthetic_order'),
               count(*) FILTER (WHERE t_arrival IS NOT NULL AND t_finish IS NOT NULL AND t_finish > t_arrival)
        FROM store.calls WHERE workflow_type_id = ?
    """, [workflow_type]).fetchone()
    return synthetic == 0 and timed > 0


def load_over_time(con: duckdb.DuckDBPyConnection, workflow_type: str, points: int = 200) -> Load | None:
    """Calls in flight, open workflows and workflow arrivals over time, sampled at ``points``
    instants by range joins in DuckDB (no per-call data leaves the database). ``None`` for
    order-only logs, whose times are not times."""
    if not has_real_times(con, workflow_type):
        return None
    t0, t1 = con.execute("SELECT min(t_arrival), max(t_finish) FROM store.calls WHERE workflow_type_id = ?",
                         [workflow_type]).fetchone()
    if t0 is None or t1 is None or t1 <= t0:
        return None
    grid = np.linspace(float(t0), float(t1), points)
    con.execute("CREATE OR REPLACE TEMP TABLE _grid AS SELECT unnest(?::DOUBLE[]) AS t", [grid.tolist()])
    try:
        calls = dict(con.execute("""
            SELECT g.t, count(c.t_arrival) FROM _grid g LEFT JOIN store.calls c
              ON c.workflow_type_id = $wt AND c.t_arrival <= g.t AND c.t_finish > g.t GROUP BY g.t
        """, {"wt": workflow_type}).fetchall())
        wfs = dict(con.execute("""
            WITH w AS (SELECT min(t_arrival) AS s, max(coalesce(t_finish, t_arrival)) AS e
                       FROM store.calls WHERE workflow_type_id = $wt GROUP BY workflow_id)
            SELECT g.t, count(w.s) FROM _grid g LEFT JOIN w ON w.s <= g.t AND w.e > g.t GROUP BY g.t
        """, {"wt": workflow_type}).fetchall())
    finally:
        con.execute("DROP TABLE IF EXISTS _grid")
    starts = np.array([r[0] for r in con.execute(
        "SELECT min(t_arrival) FROM store.calls WHERE workflow_type_id = ? GROUP BY workflow_id",
        [workflow_type]).fetchall()], dtype=float)
    arrivals, _ = np.histogram(starts, bins=grid)
    return Load(grid - t0, np.array([calls[t] for t in grid]), np.array([wfs[t] for t in grid]),
                arrivals, float(grid[1] - grid[0]))


# ----------------------------------------------------------------------- calibration curves
#: Nominal coverages at which the calibration curves are drawn.
CALIBRATION_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
#: Folds (by workflow) of the cross-validated calibration curves.
CALIBRATION_FOLDS = 5


def calibration_curves(con: duckdb.DuckDBPyConnection, workflow_type: str, groups: dict[str, list[str]],
                       levels: tuple[float, ...] = CALIBRATION_LEVELS, folds: int = CALIBRATION_FOLDS,
                       max_workflows: int = 20_000, seed: int = 0) -> dict[str, tuple[np.ndarray, int]]:
    """Observed vs nominal coverage of the order-statistic output-length band
    (:func:`predictors.band_selection.order_stat_bands`, the profile's marginal band rule),
    cross-validated by workflow: per group (a name -> the agents whose calls it pools; one agent
    per group for a per-agent curve), the band at each nominal level is fit on the other folds'
    calls and scored on the held-out fold's. Returns group -> (observed coverage per level,
    held-out calls). Reads a deterministic sample of at most ``max_workflows`` workflows."""
    from predictors.band_selection import ceiling_of, order_stat_bands
    from store.folds import group_folds

    arr = con.execute("""
        SELECT agent_id, workflow_id, output_tokens FROM store.calls
        WHERE workflow_type_id = $wt AND status = 'ok' AND output_tokens IS NOT NULL
          AND workflow_id IN (SELECT DISTINCT workflow_id FROM store.calls WHERE workflow_type_id = $wt
                              ORDER BY hash(workflow_id), workflow_id LIMIT $n)
    """, {"wt": workflow_type, "n": int(max_workflows)}).fetchnumpy()
    if not len(arr["agent_id"]):
        return {}
    agent = np.asarray(arr["agent_id"], dtype=object)
    fold = group_folds(np.asarray(arr["workflow_id"], dtype=object), folds, seed)
    y = np.asarray(arr["output_tokens"], dtype=float)
    out: dict[str, tuple[np.ndarray, int]] = {}
    for name, members in groups.items():
        mask = np.isin(agent, members)
        hits, total = np.zeros(len(levels)), 0
        for k in range(folds):
            train, test = y[mask & (fold != k)], y[mask & (fold == k)]
            if not len(train) or not len(test):
                continue
            for j, (lo, hi) in enumerate(order_stat_bands(train, levels, ceiling_of(train))):
                hits[j] += np.count_nonzero((test >= lo) & (test <= hi))
            total += len(test)
        if total:
            out[name] = (hits / total, total)
    return out
