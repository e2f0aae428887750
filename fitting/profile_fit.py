"""Fit a profile: ingest logs into the store, fit every model, write a new profile version.

The profile is fit on *everything in the store* (logs accumulate across runs, which is what online
refit wants); point ``--out``/``--db`` somewhere fresh to fit a separate data set.

Sections of ``profile.json`` and who builds them:

``output_length``   :class:`predictors.output_length.OutputLengthIntervals`
``tool_latency``    :class:`predictors.tool_latency.ToolLatencyModel`
``idle_gap``        :class:`predictors.idle_gap.IdleGapModel` (keep-alive TTL from call finish to
                    the session's next arrival; gaps that end in a person's turn left out)
``human_wait``      those think-time gaps per workflow type (:func:`human_wait_section`)
``agents``          per-agent timing and size statistics (SQL over ``calls``)
``workflow_types``  counts per workflow type
others              :data:`SECTION_BUILDERS` (e.g. ``workflows``: the synthesized automata)
"""
from __future__ import annotations

import shutil

from contextlib import nullcontext
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import duckdb
import pandas as pd

from predictors.idle_gap import IdleGapModel
from predictors.nat_trie import build_nat_trie_section
from predictors.output_length import OutputLengthIntervals
from predictors.remaining_tokens import RemainingTokens
from predictors.tool_latency import ToolLatencyModel
from store import ingest as ingest_mod
from store.data_limits import (calls_by_timing, is_order_only, limitations,
                               note_order_only_types, order_only_types)
from store.frames import query_frame
from store.profile_artifact import Profile, store_path, write_profile
from store.split import call_group_sql
from store.duckdb_store import connect, store_counts
from synth.fit import DEFAULT_ALPHA
from synth.profile_section import DEFAULT_MAX_WORKFLOWS, DEFAULT_PROMPT_WORKFLOWS, build_workflows_section
from synth.regex_synth import LOOP_QUANTILES

#: Extra profile sections: name -> ``(con, options) -> dict`` that builds it.
SECTION_BUILDERS: dict[str, Callable[[duckdb.DuckDBPyConnection, dict[str, Any]], dict[str, Any]]] = {
    "workflows": build_workflows_section,
    "nat_trie": build_nat_trie_section,     # the NAT prediction-trie baseline, scored by eval
}


@dataclass
class FitOptions:
    """Every knob of a fit, one declaration each with its default; recorded in the manifest.

    A typo is an error, not a silent default: ``FitOptions(alergia_alpah=...)`` is a
    ``TypeError`` and :meth:`from_dict` (a manifest, a Ray task) refuses an unknown key by name.
    The section builders (:data:`SECTION_BUILDERS`, below ``fitting`` in the layers) read
    :meth:`knobs`, every knob by name."""

    # output-length bands and tool latency
    coverage: float = 0.99
    prune: float = 0.05
    seed: int = 0
    min_calls: int = 50
    conditional: bool = True
    ks_threshold: float = 0.1
    ttl_quantile: float = 0.95
    max_ttl_s: float | None = 600.0
    max_output_tokens: int | None = None
    # written to the manifest only when changed from the default (after the knobs above)
    order_only: bool = False                      # fit as if the times were call positions
    group_by: str | None = None                   # selection folds keep a group's workflows together
    group_pattern: str | None = None              # the part of ``group_by`` that names the group
    drift: bool = True                            # recency weighting of tool latency and idle gap
    forward_validation: bool = True               # next-agent/remaining/tokens ranking/keep-alive checked forward
    alergia_alpha: float = DEFAULT_ALPHA          # the workflow automaton's ALERGIA test level
    loop_quantiles: tuple[float, float] = LOOP_QUANTILES      # loop round bounds of the regexes
    prompt_workflows: int = DEFAULT_PROMPT_WORKFLOWS          # workflows per type mined for prompts
    synth_max_workflows: int = DEFAULT_MAX_WORKFLOWS          # workflows per type training the automaton (0: all)

    _ALWAYS = ("coverage", "prune", "seed", "min_calls", "conditional", "ks_threshold",
               "ttl_quantile", "max_ttl_s", "max_output_tokens")

    @classmethod
    def from_dict(cls, values: Mapping[str, Any], source: str = "fit options") -> FitOptions:
        """The options in ``values`` (a manifest's ``options``, :meth:`as_dict`); an unknown key
        is refused with a ``ValueError`` naming it and ``source``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{source}: unknown fit option(s) {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(sorted(known))})")
        out = dict(values)
        if out.get("loop_quantiles") is not None:
            out["loop_quantiles"] = tuple(out["loop_quantiles"])
        return cls(**out)

    def knobs(self) -> dict[str, Any]:
        """Every knob by name (what the section builders read)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def as_dict(self) -> dict[str, Any]:
        """The manifest's record: the core knobs, then each other knob only where changed."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name in self._ALWAYS or getattr(self, f.name) != f.default}


#: Columns of ``calls`` the output-length model is fit and scored on.
CALL_COLUMNS = ("workflow_type_id", "workflow_id", "agent_id", "input_tokens", "output_tokens",
                "prev_agent_output_tokens", "agent_call_index", "t_arrival", "t_finish")


#: Calls whose token counts the source did not hold (``tokens_unknown: true``, log-format extra
#: field; e.g. a SWE-agent ``.traj`` with run totals only): they teach order, not lengths.
_TOKENS_UNKNOWN_SQL = "json_extract_string(extra, '$.tokens_unknown') = 'true'"


def tokens_unknown_calls(con: duckdb.DuckDBPyConnection) -> int:
    """How many ok calls are flagged ``tokens_unknown``."""
    return int(con.execute(f"SELECT count(*) FROM calls WHERE status = 'ok' AND extra IS NOT NULL "
                           f"AND {_TOKENS_UNKNOWN_SQL}").fetchone()[0])


def ok_calls(con: duckdb.DuckDBPyConnection, group_by: str | None = None,
             group_pattern: str | None = None) -> pd.DataFrame:
    """:data:`CALL_COLUMNS` of every call with status ``ok``, workflow by workflow in call order;
    calls flagged ``tokens_unknown`` are left out (their counts are placeholders). With
    ``group_by`` (``profiler fit --group-by``) also ``group_id``, the call's group
    (:func:`store.split.call_group_sql`): the selection folds of the estimators fit on these
    calls then keep a group's workflows together.

    The order is fixed (a table's row order is not: parallel inserts interleave), so the same
    store always gives the same fit, down to the last bit of every float sum."""
    unknown = (f"AND (extra IS NULL OR {_TOKENS_UNKNOWN_SQL} IS NOT TRUE) "
               if tokens_unknown_calls(con) else "")
    group = f", {call_group_sql(group_by, group_pattern)} AS group_id" if group_by else ""
    return query_frame(con, f"SELECT {', '.join(CALL_COLUMNS)}{group} FROM calls WHERE status = 'ok' {unknown}"
                            "ORDER BY workflow_type_id, workflow_id, call_index")


#: ``wait_after`` value (log-format extra field) of a call after which a *person* took the next
#: turn: the gap after it is think time, not tool time (Claude Code / Codex importers set it).
HUMAN_WAIT = "human"
_HUMAN_SQL = f"json_extract_string(extra, '$.wait_after') = '{HUMAN_WAIT}'"


def has_human_waits(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether any call in the store is marked ``wait_after = human`` (stores without one are fit
    with exactly the queries they always were)."""
    return bool(con.execute(f"SELECT count(*) FROM calls WHERE extra IS NOT NULL AND {_HUMAN_SQL}").fetchone()[0])


def _tool_rows_sql(columns: str, con: duckdb.DuckDBPyConnection) -> str:
    """Timed tool executions, less those timed by a gap that ended in a person's turn (a tool
    with no logged times whose call is ``wait_after = human``: that gap is think time) and those
    of workflow types whose times are call positions (:func:`_real_times`)."""
    human = (f"AND NOT (timing_source = 'gap' AND request_id IN (SELECT request_id FROM calls "
             f"WHERE extra IS NOT NULL AND {_HUMAN_SQL})) ") if has_human_waits(con) else ""
    return (f"SELECT {columns} FROM tool_calls WHERE latency_s IS NOT NULL {human}{_real_times(con)} "
            "ORDER BY request_id, tool_index")


def timed_tool_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """``workflow_type_id, tool_name, latency_s`` of every tool execution with a latency, in a
    fixed order (see :func:`ok_calls`); gaps that ended in a person's turn are not tool time, and
    workflow types whose times are call positions are left out."""
    return query_frame(con, _tool_rows_sql("workflow_type_id, tool_name, latency_s", con))


def _real_times(con: duckdb.DuckDBPyConnection) -> str:
    """SQL ``AND …`` that leaves out the workflow types whose times are call positions
    (:func:`store.data_limits.order_only_types`): no time model is fit or scored on them."""
    types = order_only_types(con)
    if not types:
        return ""
    quoted = ", ".join("'" + t.replace("'", "''") + "'" for t in types)
    return f" AND workflow_type_id NOT IN ({quoted})"


def fit_tool_latency(con: duckdb.DuckDBPyConnection, options: FitOptions) -> ToolLatencyModel:
    """The tool-latency model of ``options`` fit on every timed tool execution in the store, with
    recency weighting per workflow type (half-life chosen on a later slice; ``FitOptions(drift=
    False)`` turns it off)."""
    rows = query_frame(con, _tool_rows_sql("workflow_type_id, workflow_id, tool_name, t_start, latency_s", con))
    half_lives = IdleGapModel().half_lives if options.drift else (None,)
    return ToolLatencyModel(ks_threshold=options.ks_threshold, ttl_quantile=options.ttl_quantile,
                            max_ttl_s=options.max_ttl_s, half_lives=half_lives).fit(rows)


def idle_gap_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every call with its idle gap (``gap_after_s``, NULL at a session's end) and the first tool
    its response named (``""`` when none), in a fixed order (see :func:`ok_calls`).

    A zero-latency call (``t_finish = t_arrival``, e.g. logs with request times only) is its own
    ASOF match in ``gap_after_s`` (gap 0) in a store written before that was fixed; its gap is
    taken to the next call in order instead. The window that finds that call (a sort of every
    call, ~0.5 s per million) runs only when the store holds such a call.

    A gap that ended in a person's turn (the call is ``wait_after = human``) is think time, not
    a wait the engine can plan a keep-alive on: those calls are left out here (their gaps are
    summarised apart in the profile's ``human_wait`` section, :func:`human_wait_section`)."""
    zero_latency = con.execute("SELECT count(*) FROM calls WHERE t_finish <= t_arrival").fetchone()[0]
    gap, window = "gap_after_s", ""
    if zero_latency:
        gap = "CASE WHEN t_finish <= t_arrival THEN lead(t_arrival) OVER w - t_finish ELSE gap_after_s END"
        window = "WINDOW w AS (PARTITION BY workflow_type_id, workflow_id ORDER BY call_index) "
    columns = ("workflow_type_id, workflow_id, agent_id, coalesce(tool_names[1], '') AS tool, call_index, "
               f"t_arrival, {gap} AS gap_after_s")
    if has_human_waits(con):  # the window runs over every call; the human turns are dropped after it
        return query_frame(
            con, f"SELECT * EXCLUDE (human) FROM (SELECT {columns}, coalesce({_HUMAN_SQL}, false) AS human "
                 f"FROM calls WHERE true{_real_times(con)} {window}) WHERE NOT human ORDER BY workflow_type_id, workflow_id, call_index")
    return query_frame(con, f"SELECT {columns} FROM calls WHERE true{_real_times(con)} {window}"
                            "ORDER BY workflow_type_id, workflow_id, call_index")


def human_wait_section(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Per workflow type, the gaps that ended in a person's turn (``wait_after = human``): how
    many, their share of all gaps, and their quantiles in seconds. Kept apart from the idle-gap
    keep-alive TTLs and the tool latencies, which a person's think time would stretch; a
    consumer that keeps KV through a human turn reads them here. ``{}`` when no call is marked."""
    if not has_human_waits(con):
        return {}
    rows = con.execute(f"""
        SELECT workflow_type_id, count(*) FILTER (WHERE human) AS n, count(*) AS gaps,
          quantile_cont(gap_after_s, 0.5) FILTER (WHERE human), quantile_cont(gap_after_s, 0.9) FILTER (WHERE human),
          quantile_cont(gap_after_s, 0.95) FILTER (WHERE human), max(gap_after_s) FILTER (WHERE human)
        FROM (SELECT workflow_type_id, gap_after_s, coalesce({_HUMAN_SQL}, false) AS human
              FROM calls WHERE status = 'ok' AND gap_after_s IS NOT NULL)
        GROUP BY 1 HAVING count(*) FILTER (WHERE human) > 0 ORDER BY 1""").fetchall()
    return {wt: {"waits": int(n), "share_of_gaps": n / gaps, "p50_s": p50, "p90_s": p90, "p95_s": p95,
                 "max_s": mx} for wt, n, gaps, p50, p90, p95, mx in rows}


def agent_tool_ttls(con: duckdb.DuckDBPyConnection, tl: ToolLatencyModel) -> dict[tuple[str, str], float]:
    """Per (workflow type, agent), the keep-alive TTL of its tool as the Predictor serves it
    (``retain_s``: :meth:`predictors.served.ToolLatencyTable.retain_s` over the agent's calls per
    tool); agents without one are left out."""
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for wt, agent, tool, n in con.execute("SELECT workflow_type_id, agent_id, tool_name, count(*) "
                                          "FROM tool_calls GROUP BY ALL").fetchall():
        counts.setdefault((wt, agent), {})[tool] = int(n)
    out = {key: tl.retain_s(key[0], c) for key, c in counts.items()}
    return {key: float(v) for key, v in out.items() if v is not None}


def fit_idle_gap(con: duckdb.DuckDBPyConnection, options: FitOptions,
                 tl: ToolLatencyModel | None = None) -> IdleGapModel:
    """The idle-gap keep-alive model (quantile ``ttl_quantile``, cap ``max_ttl_s``) on every call;
    ``FitOptions(drift=False)`` turns recency weighting off, ``forward_validation=False`` the
    forward check against the pooled per-type quantile (and with it the online keep-alive
    selector's warm start, whose tool candidate is each agent's TTL under ``tl``)."""
    drift = {} if options.drift else {"half_lives": (None,)}
    forward = {} if options.forward_validation else {"forward_origins": ()}
    return IdleGapModel(quantile=options.ttl_quantile, max_ttl_s=options.max_ttl_s,
                        random_state=options.seed, **drift, **forward).fit(
        idle_gap_calls(con), tool_ttls=agent_tool_ttls(con, tl) if tl is not None else None)


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
    have no real times (every call ``timing = synthetic_order``) or ``options.order_only``,
    the time models are fit on nothing: stand-in times (call positions) never become latency or
    TTL predictions, and ``limitations`` says so (:mod:`store.data_limits`)."""
    counts = calls_by_timing(con)
    order_only = is_order_only(counts, options.order_only)
    if order_only:
        # a tool whose duration is real though its place in time is not (``tool_timing =
        # duration_only``: SWE-agent's execution_time) still teaches tool latency; no drift
        # weighting, since its start is a call position
        durations = query_frame(con, "SELECT workflow_type_id, workflow_id, tool_name, t_start, latency_s "
                                     "FROM tool_calls WHERE latency_s IS NOT NULL AND request_id IN "
                                     "(SELECT request_id FROM calls WHERE extra IS NOT NULL AND "
                                     "json_extract_string(extra, '$.tool_timing') = 'duration_only') "
                                     "ORDER BY request_id, tool_index")
        tl = ToolLatencyModel(ks_threshold=options.ks_threshold, ttl_quantile=options.ttl_quantile,
                              max_ttl_s=options.max_ttl_s, half_lives=(None,)).fit(durations)
        ig = IdleGapModel(quantile=options.ttl_quantile, max_ttl_s=options.max_ttl_s,
                          random_state=options.seed).fit(idle_gap_calls(con).iloc[0:0])
        timed_tools = len(durations)
    else:
        tl = fit_tool_latency(con, options)
        ig = fit_idle_gap(con, options, tl)
        timed_tools = con.execute(f"SELECT count(*) FROM ({_tool_rows_sql('1', con)})").fetchone()[0]
    section = limitations(counts, order_only, int(timed_tools))
    if order_only and timed_tools:
        section["unavailable"].pop("tool_latency", None)
        section["notes"] = [n.replace("; no time is predicted", "; of times, only tool durations are fit")
                            for n in section["notes"]]
        section["notes"].append(f"tool latency fit from {int(timed_tools):,} real tool execution times "
                                "(tool_timing = duration_only: durations are real, their place in time is not)")
    if (unknown := tokens_unknown_calls(con)):
        section["notes"].append(f"{unknown:,} calls have unknown token counts (tokens_unknown): left out of the "
                                "output-length bands; they still teach order, paths and tools")
    estimated = con.execute("SELECT count(*) FROM calls WHERE status = 'ok' AND extra IS NOT NULL AND "
                            "json_extract_string(extra, '$.tokens_estimated') = 'true'").fetchone()[0]
    if estimated:
        section["notes"].append(f"{int(estimated):,} calls have estimated token counts (tokens_estimated): "
                                "output-length bands are only as good as the estimate")
    human = {} if order_only else human_wait_section(con)
    if human:
        n = sum(v["waits"] for v in human.values())
        section["notes"].append(f"{n:,} gaps end in a person's turn (wait_after = human): think time, kept out of "
                                "the idle-gap keep-alive TTLs and tool latencies (see human_wait)")
    section = note_order_only_types(section, order_only_types(con))
    return {"tool_latency": tl.to_dict(), "idle_gap": ig.to_dict(), "human_wait": human, "limitations": section}


def fit_from_store(con: duckdb.DuckDBPyConnection, options: FitOptions,
                   progress: Callable[[str], None] = lambda msg: None) -> dict[str, Any]:
    """Fit every section of a profile from the calls in the store; returns profile data."""
    n_calls = con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()[0]
    if n_calls == 0:
        raise ValueError("the store holds no valid calls to fit on (see the quarantine table)")
    progress(f"output-length bands over {n_calls:,} calls")
    sized = ok_calls(con, options.group_by, options.group_pattern)
    if sized.empty:
        raise ValueError(f"none of the {n_calls:,} calls has token counts (all flagged tokens_unknown, e.g. "
                         "SWE-agent .traj files with run totals only): import them with --estimate-tokens, or "
                         "with the debug logs beside the .traj files")
    ol = OutputLengthIntervals(coverage=options.coverage, min_calls=options.min_calls,
                               conditional=options.conditional, max_output_tokens=options.max_output_tokens,
                               random_state=options.seed).fit(sized)
    progress("remaining output tokens per session (CV by workflow)")
    rt = RemainingTokens(random_state=options.seed,
                         **({} if options.forward_validation else {"forward_origins": ()})).fit(sized)
    progress("time models (tool latency, idle-gap keep-alive TTLs)")
    times = time_sections(con, options)
    order_only = times["limitations"]["timing"] == "order_only"
    data: dict[str, Any] = {
        "output_length": ol.to_dict(),
        "remaining_tokens": rt.to_dict(),
        **times,
        "agents": agent_stats(con, times=not order_only),
        "workflow_types": {
            wt: {"workflows": int(w), "calls": int(c)} for wt, w, c in con.execute(
                "SELECT workflow_type_id, count(DISTINCT workflow_id), count(*) FROM calls "
                "GROUP BY 1 ORDER BY 1").fetchall()},
    }
    for name, build in SECTION_BUILDERS.items():
        progress(f"section {name}")
        data[name] = build(con, options.knobs())
    return data


def manifest_fields(con: duckdb.DuckDBPyConnection, options: FitOptions, db_path: Path) -> dict[str, Any]:
    """What a fit records in the manifest about its data: ``sources`` (every ingested file),
    ``options``, ``counts`` (:func:`store_counts`) and ``store`` (the store's absolute path)."""
    sources = [{"path": p, "sha256": h, "rows": int(n)} for p, h, n in con.execute(
        "SELECT path, sha256, rows_loaded FROM ingested_files ORDER BY path, ingested_at").fetchall()]
    return {"sources": sources, "options": options.as_dict(), "counts": store_counts(con),
            "store": str(db_path.resolve())}


class NoValidCallsError(ValueError):
    """Nothing to fit on: no valid call in the store after the ingest. ``report`` is that
    ingest's report (its ``first_reasons`` say why the records were refused); ``removed`` lists
    what the run had created and took away again (the store, the output folder)."""

    def __init__(self, message: str, report: ingest_mod.IngestReport, removed: list[Path]) -> None:
        super().__init__(message)
        self.report = report
        self.removed = removed


def _remove_created(db_path: Path, db_existed: bool, out: Path, out_existed: bool) -> list[Path]:
    """Take away the store and output folder a failed first fit created (never older ones)."""
    removed = []
    if not db_existed:
        for path in (db_path, db_path.with_name(db_path.name + ".wal")):
            if path.exists():
                path.unlink()
                removed.append(path)
    if not out_existed and out.is_dir():
        shutil.rmtree(out)
        removed.append(out)
    return removed


def fit_profile(paths: Sequence[str | Path], out: str | Path, *, db: str | Path | None = None,
                options: FitOptions | None = None, strict: bool = False,
                progress: bool = False) -> tuple[Profile, ingest_mod.IngestReport]:
    """Ingest ``paths`` into the store, fit, and write a new profile version under ``out``.

    When the store then holds no valid call (every record was refused), raises
    :class:`NoValidCallsError` with the ingest report, after removing the store and ``out`` if
    this call created them: a failed first fit leaves nothing behind."""
    options = options or FitOptions()
    out = Path(out)
    db_path = store_path(out, db)
    out_existed, db_existed = out.exists(), db_path.exists()
    con = connect(db_path)
    try:
        report = ingest_mod.ingest(con, paths, strict=strict, progress=progress)
        if con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()[0] == 0:
            con.close()
            removed = _remove_created(db_path, db_existed, out, out_existed)
            raise NoValidCallsError(
                f"no valid call to fit on: {report.loaded} loaded, {report.quarantined} records "
                f"refused, {report.duplicates} duplicates" + ("; nothing was written" if removed else ""),
                report, removed)
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

