"""Fit a profile: ingest logs into the store, fit every model, write a new profile version.

The profile is fit on *everything in the store* (logs accumulate across runs, which is what online
refit wants); point ``--out``/``--db`` somewhere fresh to fit a separate data set.

Sections of ``profile.json`` and who builds them:

``output_length``   :class:`predictors.output_length.OutputLengthIntervals`
``tool_latency``    :class:`predictors.tool_latency.ToolLatencyModel`
``idle_gap``        :class:`predictors.idle_gap.IdleGapModel` (keep-alive TTL from call finish to
                    the session's next arrival)
``agents``          per-agent timing and size statistics (SQL over ``calls``)
``workflow_types``  counts per workflow type
others              :data:`SECTION_BUILDERS` (e.g. ``workflows``: the synthesized automata)
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import duckdb
import pandas as pd

from predictors.idle_gap import IdleGapModel
from predictors.output_length import OutputLengthIntervals
from predictors.tool_latency import ToolLatencyModel
from profiler import ingest as ingest_mod
from profiler.data_limits import (calls_by_timing, is_order_only, limitations,
                                  note_order_only_types, order_only_types)
from profiler.frames import query_frame
from profiler.profile_artifact import Profile, store_path, write_profile
from profiler.store import connect, store_counts
from synth.profile_section import build_workflows_section

#: Extra profile sections: name -> ``(con, options) -> dict`` that builds it.
SECTION_BUILDERS: dict[str, Callable[[duckdb.DuckDBPyConnection, dict[str, Any]], dict[str, Any]]] = {
    "workflows": build_workflows_section,
}


@dataclass
class FitOptions:
    """Every knob of a fit, recorded in the profile manifest."""

    coverage: float = 0.99
    prune: float = 0.05
    seed: int = 0
    min_calls: int = 50
    conditional: bool = True
    ks_threshold: float = 0.1
    ttl_quantile: float = 0.95
    max_ttl_s: float | None = 600.0
    max_output_tokens: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "extra"}
        return {**d, **self.extra}


#: Columns of ``calls`` the output-length model is fit and scored on.
CALL_COLUMNS = ("workflow_type_id", "workflow_id", "agent_id", "input_tokens", "output_tokens",
                "prev_agent_output_tokens", "agent_call_index")


def ok_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """:data:`CALL_COLUMNS` of every call with status ``ok``, workflow by workflow in call order.

    The order is fixed (a table's row order is not: parallel inserts interleave), so the same
    store always gives the same fit, down to the last bit of every float sum."""
    return query_frame(con, f"SELECT {', '.join(CALL_COLUMNS)} FROM calls WHERE status = 'ok' "
                            "ORDER BY workflow_type_id, workflow_id, call_index")


def timed_tool_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """``workflow_type_id, tool_name, latency_s`` of every tool execution with a latency, in a
    fixed order (see :func:`ok_calls`)."""
    return query_frame(con, "SELECT workflow_type_id, tool_name, latency_s FROM tool_calls "
                            f"WHERE latency_s IS NOT NULL{_real_times(con)} ORDER BY request_id, tool_index")


def _real_times(con: duckdb.DuckDBPyConnection) -> str:
    """SQL ``AND …`` that leaves out the workflow types whose times are call positions
    (:func:`profiler.data_limits.order_only_types`): no time model is fit or scored on them."""
    types = order_only_types(con)
    if not types:
        return ""
    quoted = ", ".join("'" + t.replace("'", "''") + "'" for t in types)
    return f" AND workflow_type_id NOT IN ({quoted})"


def fit_tool_latency(con: duckdb.DuckDBPyConnection, options: FitOptions) -> ToolLatencyModel:
    """The tool-latency model of ``options`` fit on every timed tool execution in the store, with
    recency weighting per workflow type (half-life chosen on a later slice; ``extra={"drift":
    False}`` turns it off)."""
    rows = query_frame(con, "SELECT workflow_type_id, workflow_id, tool_name, t_start, latency_s FROM tool_calls "
                            f"WHERE latency_s IS NOT NULL{_real_times(con)} ORDER BY request_id, tool_index")
    half_lives = IdleGapModel().half_lives if options.extra.get("drift", True) else (None,)
    return ToolLatencyModel(ks_threshold=options.ks_threshold, ttl_quantile=options.ttl_quantile,
                            max_ttl_s=options.max_ttl_s, half_lives=half_lives).fit(rows)


def idle_gap_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every call with its idle gap (``gap_after_s``, NULL at a session's end) and the first tool
    its response named (``""`` when none), in a fixed order (see :func:`ok_calls`).

    A zero-latency call (``t_finish = t_arrival``, e.g. logs with request times only) is its own
    ASOF match in ``gap_after_s`` (gap 0) in a store written before that was fixed; its gap is
    taken to the next call in order instead. The window that finds that call (a sort of every
    call, ~0.5 s per million) runs only when the store holds such a call."""
    zero_latency = con.execute("SELECT count(*) FROM calls WHERE t_finish <= t_arrival").fetchone()[0]
    gap, window = "gap_after_s", ""
    if zero_latency:
        gap = "CASE WHEN t_finish <= t_arrival THEN lead(t_arrival) OVER w - t_finish ELSE gap_after_s END"
        window = "WINDOW w AS (PARTITION BY workflow_type_id, workflow_id ORDER BY call_index) "
    return query_frame(
        con,
        "SELECT workflow_type_id, workflow_id, agent_id, coalesce(tool_names[1], '') AS tool, call_index, "
        f"t_arrival, {gap} AS gap_after_s FROM calls WHERE true{_real_times(con)} {window}"
        "ORDER BY workflow_type_id, workflow_id, call_index")


def fit_idle_gap(con: duckdb.DuckDBPyConnection, options: FitOptions) -> IdleGapModel:
    """The idle-gap keep-alive model (quantile ``ttl_quantile``, cap ``max_ttl_s``) on every call;
    ``extra={"drift": False}`` turns recency weighting off."""
    drift = {} if options.extra.get("drift", True) else {"half_lives": (None,)}
    return IdleGapModel(quantile=options.ttl_quantile, max_ttl_s=options.max_ttl_s,
                        random_state=options.seed, **drift).fit(idle_gap_calls(con))


#: The per-agent statistics measured in time (None in an order-only profile).
TIME_STATS = ("mean_latency_s", "p95_latency_s", "mean_ttft_s", "decode_tok_s", "mean_gap_after_s")


def agent_stats(con: duckdb.DuckDBPyConnection, times: bool = True) -> dict[str, dict[str, dict[str, Any]]]:
    """Per (workflow type, agent): call count, latency, TTFT, sizes, decode speed, gap after
    (``times=False``: the time statistics are None, for logs whose times are call positions)."""
    rows = con.execute("""
        WITH a AS (
          SELECT workflow_type_id, agent_id, count(*) AS calls,
            avg(latency_s) AS mean_latency_s, quantile_cont(latency_s, 0.95) AS p95_latency_s,
            avg(ttft_s) AS mean_ttft_s, avg(input_tokens) AS mean_input_tokens,
            avg(output_tokens) AS mean_output_tokens,
            sum(output_tokens) FILTER (WHERE t_first_token IS NOT NULL AND t_finish > t_first_token)
              / nullif(sum(t_finish - t_first_token) FILTER (WHERE t_first_token IS NOT NULL AND t_finish > t_first_token), 0)
              AS decode_tok_s,
            avg(gap_after_s) AS mean_gap_after_s
          FROM calls WHERE status = 'ok' GROUP BY ALL
        ), t AS (
          SELECT workflow_type_id, agent_id, map(list(tool_name ORDER BY tool_name), list(n ORDER BY tool_name)) AS tools
          FROM (SELECT workflow_type_id, agent_id, tool_name, count(*) AS n FROM tool_calls GROUP BY ALL)
          GROUP BY ALL
        )
        SELECT a.*, t.tools FROM a LEFT JOIN t USING (workflow_type_id, agent_id)
        ORDER BY 1, 2
    """).fetchall()
    cols = [d[0] for d in con.description]
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        r = dict(zip(cols, row))
        wt, agent = r.pop("workflow_type_id"), r.pop("agent_id")
        r["tools"] = {k: int(v) for k, v in (r["tools"] or {}).items()}
        if not times:
            r.update(dict.fromkeys(TIME_STATS))
        out.setdefault(wt, {})[agent] = {k: (float(v) if isinstance(v, float) else v) for k, v in r.items()}
    return out


def time_sections(con: duckdb.DuckDBPyConnection, options: FitOptions) -> dict[str, Any]:
    """``tool_latency``, ``idle_gap`` and ``limitations`` of a profile. When the store's calls
    have no real times (every call ``timing = synthetic_order``) or ``options.extra["order_only"]``,
    the time models are fit on nothing: stand-in times (call positions) never become latency or
    TTL predictions, and ``limitations`` says so (:mod:`profiler.data_limits`)."""
    counts = calls_by_timing(con)
    order_only = is_order_only(counts, bool(options.extra.get("order_only")))
    if order_only:
        tl = ToolLatencyModel(ks_threshold=options.ks_threshold, ttl_quantile=options.ttl_quantile,
                              max_ttl_s=options.max_ttl_s).fit(pd.DataFrame(
                                  columns=["workflow_type_id", "workflow_id", "tool_name", "t_start", "latency_s"]))
        ig = IdleGapModel(quantile=options.ttl_quantile, max_ttl_s=options.max_ttl_s,
                          random_state=options.seed).fit(idle_gap_calls(con).iloc[0:0])
        timed_tools = 0
    else:
        tl, ig = fit_tool_latency(con, options), fit_idle_gap(con, options)
        timed_tools = con.execute("SELECT count(*) FROM tool_calls WHERE latency_s IS NOT NULL").fetchone()[0]
    return {"tool_latency": tl.to_dict(), "idle_gap": ig.to_dict(),
            "limitations": note_order_only_types(limitations(counts, order_only, int(timed_tools)),
                                                 order_only_types(con))}


def fit_from_store(con: duckdb.DuckDBPyConnection, options: FitOptions,
                   progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Fit every section of a profile from the calls in the store; returns profile data."""
    n_calls = con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()[0]
    if n_calls == 0:
        raise ValueError("the store holds no valid calls to fit on (see the quarantine table)")
    progress(f"output-length bands over {n_calls:,} calls")
    ol = OutputLengthIntervals(coverage=options.coverage, min_calls=options.min_calls,
                               conditional=options.conditional, max_output_tokens=options.max_output_tokens,
                               random_state=options.seed).fit(ok_calls(con))
    progress("time models (tool latency, idle-gap keep-alive TTLs)")
    times = time_sections(con, options)
    order_only = times["limitations"]["timing"] == "order_only"
    data: dict[str, Any] = {
        "output_length": ol.to_dict(),
        **times,
        "agents": agent_stats(con, times=not order_only),
        "workflow_types": {
            wt: {"workflows": int(w), "calls": int(c)} for wt, w, c in con.execute(
                "SELECT workflow_type_id, count(DISTINCT workflow_id), count(*) FROM calls "
                "GROUP BY 1 ORDER BY 1").fetchall()},
    }
    for name, build in SECTION_BUILDERS.items():
        progress(f"section {name}")
        data[name] = build(con, options.as_dict())
    return data


def manifest_fields(con: duckdb.DuckDBPyConnection, options: FitOptions, db_path: Path) -> dict[str, Any]:
    """What a fit records in the manifest about its data: ``sources`` (every ingested file),
    ``options``, ``counts`` (:func:`store_counts`) and ``store`` (the store's absolute path)."""
    sources = [{"path": p, "sha256": h, "rows": int(n)} for p, h, n in con.execute(
        "SELECT path, sha256, rows_loaded FROM ingested_files ORDER BY path, ingested_at").fetchall()]
    return {"sources": sources, "options": options.as_dict(), "counts": store_counts(con),
            "store": str(db_path.resolve())}


def fit_profile(paths: Sequence[str | Path], out: str | Path, *, db: str | Path | None = None,
                options: FitOptions | None = None, strict: bool = False,
                progress: bool = False) -> tuple[Profile, ingest_mod.IngestReport]:
    """Ingest ``paths`` into the store, fit, and write a new profile version under ``out``."""
    options = options or FitOptions()
    out = Path(out)
    db_path = store_path(out, db)
    con = connect(db_path)
    try:
        report = ingest_mod.ingest(con, paths, strict=strict, progress=progress)
        from rich.console import Console

        console = Console(stderr=True)
        with console.status("fitting", spinner="dots") if progress else nullcontext() as status:
            def step(msg: str) -> None:
                if status is not None:
                    status.update(f"fitting: {msg}")
            data = fit_from_store(con, options, step)
        profile = write_profile(out, data, manifest_fields(con, options, db_path))
    finally:
        con.close()
    return profile, report

