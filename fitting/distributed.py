"""``profiler fit --engine ray``: ingestion and per-workflow-type fits as Ray tasks.

The single-node fit streams every log through one DuckDB store. Past one machine the same work
splits along two axes that never need each other's rows:

1. **Ingest shards** (one Ray task per group of files, balanced by bytes): each task runs the
   ordinary ingester (:func:`store.ingest.ingest`: validation, quarantine, in-file
   de-duplication) into a private in-memory store and writes its valid calls as Parquet,
   partitioned by workflow type (``calls/shard-<i>/wt_key=<md5(wt)[:8]>/*.parquet``), plus its
   quarantine and file reports.
2. **Workflow-type fits** (one Ray task per workflow type): a task reads its type's partitions
   from every shard, drops request ids already seen in an earlier file (a different record
   under the same id is quarantined as a conflicting duplicate, as the single-node ingester
   does), derives the per-workflow columns and ``tool_calls`` (:func:`store.derive.insert_calls`
   — a workflow never spans two types, so its calls are all there) and runs the ordinary fit
   (:func:`fitting.profile_fit.fit_from_store`) on that type alone.
3. **Merge** (driver): the per-type calls and tool executions are loaded into the profile's
   DuckDB store; sections keyed by workflow type are united; the two pooled parts — the global
   output-length band (all output lengths) and the per-tool pooled latency fits — are computed
   on the merged store with the same estimators; one profile version is written with
   :func:`store.profile_artifact.write_profile`.

The result equals the single-node profile on the same logs (floating-point sums may differ in
the last bits because rows are added in another order). Sections registered in
:data:`fitting.profile_fit.SECTION_BUILDERS` must be keyed by workflow type (``workflows`` is).

On a cluster, ``work_dir`` must be a path every node sees (NFS, a mounted bucket); start Ray
with ``ray start --head`` / ``ray start --address=...`` and pass ``address="auto"``. Limits: the
unit of ingest parallelism is the file (split huge files first); the engine builds a new store
(it refuses a store that already holds calls — use the local engine to add logs to one).
"""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import duckdb
from rich.progress import Progress

from predictors.output_length import OutputLengthIntervals
from store import derive
from fitting.profile_fit import (SECTION_BUILDERS, FitOptions, fit_from_store, manifest_fields, ok_calls,
                                 time_sections)
from store.ingest import FileReport, IngestError, IngestReport, discover, ingest, reason_line
from store.profile_artifact import Profile, store_path, write_profile
from store.duckdb_store import BASE_CALL_COLUMNS, TABLE_DOCS, connect, sql_columns, sql_string

#: Sections whose value is {workflow_type: ...} and are united as is.
PER_TYPE_SECTIONS = ("agents", "workflow_types")
#: Input bytes per ingest shard at most (default plan): bounds each task's memory.
SHARD_BYTES = 256 * 2**20


def wt_key(workflow_type: str) -> str:
    """Partition key of a workflow type: 8 hex digits of its md5 (any name is a safe path)."""
    return hashlib.md5(workflow_type.encode()).hexdigest()[:8]


def plan_shards(files: Sequence[tuple[Path, str]], n_shards: int) -> list[list[str]]:
    """Split files into at most ``n_shards`` groups of similar total size (largest first into the
    lightest group), keeping each group's files in path order."""
    groups: list[tuple[int, list[Path]]] = [(0, []) for _ in range(max(1, min(n_shards, len(files))))]
    for path, _ in sorted(files, key=lambda f: -f[0].stat().st_size):
        size, members = min(groups, key=lambda g: g[0])
        groups.remove((size, members))
        groups.append((size + path.stat().st_size, members + [path]))
    return [[str(p) for p in sorted(members)] for _, members in groups if members]


# ------------------------------------------------------------------------------ Ray tasks
def task_store(work_dir: str, name: str, limits: dict[str, Any]) -> "duckdb.DuckDBPyConnection":
    """An in-memory store for one task, bounded: DuckDB threads = the task's CPUs and, when
    ``memory_limit`` is set, spilling to ``<work_dir>/spill/<name>`` past that much memory."""
    con = connect(None)
    con.execute(f"SET threads = {int(limits.get('threads') or 1)}")
    if limits.get("memory_limit"):
        spill = Path(work_dir) / "spill" / name
        spill.mkdir(parents=True, exist_ok=True)
        con.execute(f"SET memory_limit = {sql_string(limits['memory_limit'])}")
        con.execute(f"SET temp_directory = {sql_string(spill)}")
    return con


def ingest_shard(files: list[str], work_dir: str, shard: int, limits: dict[str, Any]) -> dict[str, Any]:
    """Ray task: ingest ``files`` into an in-memory store, write its calls as Parquet by type."""

    t0 = time.perf_counter()
    con = task_store(work_dir, f"shard-{shard}", limits)
    report = ingest(con, files)
    cols = sql_columns(BASE_CALL_COLUMNS)
    out = Path(work_dir) / "calls" / f"shard-{shard:04d}"
    types = dict(con.execute("SELECT workflow_type_id, count(*) FROM calls GROUP BY 1").fetchall())
    if types:
        out.parent.mkdir(parents=True, exist_ok=True)
        con.execute(f"""COPY (SELECT {cols}, substr(md5(workflow_type_id), 1, 8) AS wt_key FROM calls)
                        TO {sql_string(out)} (FORMAT parquet, PARTITION_BY (wt_key))""")
    quarantine = Path(work_dir) / "quarantine" / f"shard-{shard:04d}.parquet"
    if con.execute("SELECT count(*) FROM quarantine").fetchone()[0]:
        quarantine.parent.mkdir(parents=True, exist_ok=True)
        con.execute(f"COPY quarantine TO {sql_string(quarantine)} (FORMAT parquet)")
    files_rows = con.execute("SELECT * FROM ingested_files").fetchall()
    con.close()
    return {"workflow_types": {k: int(v) for k, v in types.items()}, "ingested_files": files_rows,
            "loaded": report.loaded, "quarantined": report.quarantined, "seconds": time.perf_counter() - t0}


def fit_workflow_type(workflow_type: str, work_dir: str, options: dict[str, Any],
                      limits: dict[str, Any]) -> dict[str, Any]:
    """Ray task: gather one workflow type from every shard, derive, fit it alone."""

    t0 = time.perf_counter()
    key = wt_key(workflow_type)
    work = Path(work_dir)
    con = task_store(work_dir, f"wt-{key}", limits)
    cols = sql_columns(BASE_CALL_COLUMNS)
    src = sql_string(work / "calls" / "*" / f"wt_key={key}" / "*.parquet")
    # Earliest (file, line) of a request id wins, as in the single-node ingester; a later record
    # with other content under the same id is a conflicting duplicate.
    con.execute(f"""
        CREATE TEMP TABLE gathered AS
        SELECT {cols},
          row_number() OVER w AS rn,
          first_value(content_hash) OVER w AS first_hash,
          first_value(source_file || ':' || source_line) OVER w AS first_at
        FROM read_parquet({src}, hive_partitioning = false)
        WHERE workflow_type_id = {sql_string(workflow_type)}
        WINDOW w AS (PARTITION BY request_id ORDER BY source_file, source_line)
    """)
    derive.insert_calls(con, f"SELECT {cols} FROM gathered WHERE rn = 1 ORDER BY source_file, source_line")
    con.execute("""
        INSERT INTO quarantine
        SELECT source_file, source_line, 'request_id',
          'conflicting duplicate request_id ' || request_id || ': different content from the record at ' || first_at,
          NULL, now()
        FROM gathered WHERE rn > 1 AND content_hash <> first_hash
    """)
    con.execute("DROP TABLE gathered")
    fit_options = FitOptions(**options)
    n_ok = con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()[0]
    data = fit_from_store(con, fit_options) if n_ok else {}
    final = work / "final"
    final.mkdir(parents=True, exist_ok=True)
    call_cols = sql_columns(TABLE_DOCS["calls"])
    con.execute(f"COPY (SELECT {call_cols} FROM calls) TO {sql_string(final / f'calls-{key}.parquet')} (FORMAT parquet)")
    con.execute(f"COPY tool_calls TO {sql_string(final / f'tool_calls-{key}.parquet')} (FORMAT parquet)")
    conflicts = con.execute("SELECT count(*) FROM quarantine").fetchone()[0]
    if conflicts:
        con.execute(f"COPY quarantine TO {sql_string(final / f'quarantine-{key}.parquet')} (FORMAT parquet)")
    con.close()
    return {"workflow_type": workflow_type, "data": data, "conflicts": int(conflicts),
            "seconds": time.perf_counter() - t0}


# ------------------------------------------------------------------------------ merging
def _output_length_section(con, params: dict[str, Any]) -> dict[str, Any]:
    """The output-length section fit once over every valid call of the final store: bands are
    chosen top-down by validation (global → workflow type → agent, each against its parent on
    the same workflow folds), which per-type fits cannot reproduce; it is a small share of a fit."""

    return OutputLengthIntervals(**params).fit(ok_calls(con)).to_dict()


def merge_sections(parts: list[dict[str, Any]], global_band: dict[str, Any],
                   tool_latency: dict[str, Any]) -> dict[str, Any]:
    """One profile's data from per-type fits: sections keyed by type united, pooled parts set.

    An agent that fell back to the global band (``level == "global"``) in its type's fit got that
    *type's* pooled band; it is given the true global band here.
    """

    parts = [p for p in parts if p]
    data: dict[str, Any] = {}
    if parts:
        first = parts[0]["output_length"]
        agents: dict[str, Any] = {}
        for p in parts:
            for wt, per_agent in p["output_length"]["agents"].items():
                agents[wt] = {a: ({**global_band, "n": b["n"], "level": "global", "conditional": None,
                                   "mean": b["mean"], "cv": b["cv"]} if b["level"] == "global" else b)
                              for a, b in per_agent.items()}
        data["output_length"] = {
            "coverage": first["coverage"], "params": first["params"], "global": global_band,
            "workflow_types": {wt: b for p in parts for wt, b in p["output_length"]["workflow_types"].items()},
            "agents": agents,
        }
    data["tool_latency"] = tool_latency
    remaining = [p["remaining_tokens"] for p in parts if p.get("remaining_tokens")]
    if remaining:   # every table of the section is keyed by workflow type: unite them
        data["remaining_tokens"] = {**remaining[0], **{
            key: dict(sorted((wt, v) for r in remaining for wt, v in r[key].items()))
            for key in ("workflow_types", "params", "selection", "baselines")}}
    for name in (*PER_TYPE_SECTIONS, *SECTION_BUILDERS):
        merged: dict[str, Any] = {}
        for p in parts:
            merged.update(p.get(name) or {})
        data[name] = dict(sorted(merged.items()))
    return data


def _load_final_store(con, work: Path, shard_results: list[dict[str, Any]]) -> None:
    final = work / "final"
    call_cols = sql_columns(TABLE_DOCS["calls"])
    if any(final.glob("calls-*.parquet")):
        con.execute(f"INSERT INTO calls ({call_cols}) SELECT {call_cols} FROM "
                    f"read_parquet({sql_string(final / 'calls-*.parquet')}) ORDER BY source_file, source_line")
    if any(final.glob("tool_calls-*.parquet")):
        con.execute(f"INSERT INTO tool_calls SELECT * FROM read_parquet({sql_string(final / 'tool_calls-*.parquet')})")
    for pattern in (work / "quarantine" / "*.parquet", final / "quarantine-*.parquet"):
        if any(pattern.parent.glob(pattern.name)):
            con.execute(f"INSERT INTO quarantine SELECT * FROM read_parquet({sql_string(pattern)})")
    rows = [r for s in shard_results for r in s["ingested_files"]]
    if rows:
        con.executemany(f"INSERT INTO ingested_files VALUES ({', '.join('?' * len(rows[0]))})", rows)


def fit_with_ray(paths: Sequence[str | Path], out: str | Path, options: FitOptions | None = None, *,
                 db: str | Path | None = None, address: str | None = None, num_cpus: int | None = None,
                 shards: int | None = None, work_dir: str | Path | None = None,
                 task_memory: str | None = "2GB", strict: bool = False, progress: bool = False,
                 timings: dict[str, float] | None = None) -> Profile:
    """Fit a profile from ``paths`` with Ray (see the module docstring); returns the new version.

    ``address``: an existing Ray cluster (``"auto"``) or None for a local one (``num_cpus``
    workers). ``shards``: ingest tasks (default: 2 per CPU of the cluster, and at least one per
    ``SHARD_BYTES`` of input). ``work_dir``: where the Parquet partitions go (default: a
    temporary folder next to ``out``, removed afterwards). ``task_memory``: DuckDB memory limit
    of each task (it spills to ``work_dir`` beyond; None = :func:`store.duckdb_store.default_memory_limit`
    per task, ``PROFILER_DUCKDB_MEMORY_LIMIT`` or a quarter of the node's RAM, with DuckDB's own
    spill folder). ``strict``: raise :class:`store.ingest.IngestError` before writing a
    profile when any record was quarantined. ``timings`` (when given) receives the seconds spent
    per stage.
    """
    ray = _import_ray(local=address is None)


    options = options or FitOptions()
    out = Path(out)
    db_path = store_path(out, db)
    if db_path.exists():
        with connect(db_path) as check:
            held = check.execute("SELECT count(*) FROM calls").fetchone()[0]
        if held:
            raise ValueError(f"{db_path} already holds {held:,} calls: the ray engine builds a new store; "
                             "fit into a fresh --out/--db, or add logs with the local engine")
    files = discover(paths)
    if not files:
        raise IngestError("no log files found under " + ", ".join(map(str, paths)))
    clock = {"start": time.perf_counter()}
    started_ray = False
    if not ray.is_initialized():
        if address is None:
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
        else:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        started_ray = True
    out.mkdir(parents=True, exist_ok=True)
    work = Path(work_dir) if work_dir is not None else Path(tempfile.mkdtemp(prefix=".ray-fit-", dir=out))
    own_work = work_dir is None
    try:
        clock["ray_ready"] = time.perf_counter()
        cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
        total_bytes = sum(p.stat().st_size for p, _ in files)
        plan = plan_shards(files, shards or max(2 * cpus, -(-total_bytes // SHARD_BYTES)))
        limits = {"threads": 1, "memory_limit": task_memory}
        ingest_task = ray.remote(num_cpus=1)(ingest_shard)
        fit_task = ray.remote(num_cpus=1)(fit_workflow_type)
        with Progress(transient=True, disable=not progress) as bar:
            task = bar.add_task(f"ingest: {len(plan)} shards", total=len(plan))
            pending = [ingest_task.remote(group, str(work), i, limits) for i, group in enumerate(plan)]
            shard_results = _gather(ray, pending, bar, task)
            clock["ingested"] = time.perf_counter()
            if strict and sum(r["quarantined"] for r in shard_results):
                raise IngestError(f"{sum(r['quarantined'] for r in shard_results)} records quarantined "
                                  "(strict mode): no profile written")
            types = sorted({wt for s in shard_results for wt in s["workflow_types"]})
            if not types:
                raise ValueError("no valid calls in the logs (see the quarantine table)")
            task = bar.add_task(f"fit: {len(types)} workflow types", total=len(types))
            fit_limits = {**limits, "threads": max(1, cpus // len(types))}  # few types: DuckDB may thread
            pending = [fit_task.remote(wt, str(work), dict(options.__dict__), fit_limits) for wt in types]
            fit_results = _gather(ray, pending, bar, task)
            clock["fitted"] = time.perf_counter()
            if strict and sum(r["conflicts"] for r in fit_results):
                raise IngestError(f"{sum(r['conflicts'] for r in fit_results)} conflicting duplicate "
                                  "request ids across files (strict mode): no profile written")
        con = connect(db_path)
        try:
            _load_final_store(con, work, shard_results)
            params = next((r["data"]["output_length"]["params"] for r in fit_results if r["data"]), None)
            ol_section = _output_length_section(con, params) if params else None
            global_band = ol_section["global"] if ol_section else {}
            # tool latency and the idle-gap fit (drift weights chosen on each type's newest
            # workflows) are fit on the merged store, exactly as the single-node fit does them
            times = time_sections(con, options)
            data = merge_sections([r["data"] for r in fit_results], global_band, times["tool_latency"])
            if ol_section:
                data["output_length"] = ol_section
            data["idle_gap"], data["limitations"] = times["idle_gap"], times["limitations"]
            data["human_wait"] = times.get("human_wait", {})
            profile = write_profile(out, data, {
                **manifest_fields(con, options, db_path),
                "engine": {"name": "ray", "shards": len(plan), "workflow_types": len(types), "cpus": cpus}})
        finally:
            con.close()
        clock["merged"] = time.perf_counter()
    finally:
        if own_work:
            shutil.rmtree(work, ignore_errors=True)
        if started_ray:
            ray.shutdown()
    if timings is not None:
        marks = list(clock.items())
        timings.update({name: round(t - marks[i - 1][1], 3) for i, (name, t) in enumerate(marks) if i})
        timings["total"] = round(clock["merged"] - clock["start"], 3)
        timings["ingest_task_s"] = round(sum(s["seconds"] for s in shard_results), 3)
        timings["fit_task_s"] = round(sum(r["seconds"] for r in fit_results), 3)
    return profile


def _import_ray(local: bool):
    """Import Ray; for a private local instance first make it loopback-only and silent.

    Ray binds a local instance to the machine's outward address unless it believes clusters are
    off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read when Ray is imported, also by its worker
    processes); usage reporting is turned off too. A cluster (``address`` given) is left as is.
    """
    if local:
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    already = "ray" in sys.modules
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError("--engine ray needs Ray: pip install 'agent-workflow-profiler[ray]'") from exc
    if local and already and not ray.is_initialized():
        from ray._private import ray_constants  # imported before our setting: apply it here too

        ray_constants.ENABLE_RAY_CLUSTER = os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] not in ("0", "false")
    return ray


def _gather(ray, pending: list, bar, task) -> list:
    """Results of ``pending`` Ray tasks in submission order, advancing the progress bar."""
    order = {ref: i for i, ref in enumerate(pending)}
    results: list = [None] * len(pending)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        for ref in done:
            results[order[ref]] = ray.get(ref)
            bar.advance(task)
    return results


def fit_profile_ray(paths: Sequence[str | Path], out: str | Path, *, db: str | Path | None = None,
                    options: FitOptions | None = None, strict: bool = False, progress: bool = False,
                    **ray_options: Any) -> "tuple[Profile, IngestReport]":
    """:func:`fit_with_ray` with the signature and return value of
    :func:`fitting.profile_fit.fit_profile`: ``(profile, ingest report)``, so that a command can
    pick its engine with one line. ``ray_options``: ``address``, ``num_cpus``, ``shards``,
    ``work_dir``, ``task_memory``, ``timings``.
    """

    profile = fit_with_ray(paths, out, options, db=db, strict=strict, progress=progress, **ray_options)
    db_path = store_path(out, db)
    report = IngestReport()
    with connect(db_path, read_only=True) as con:
        for path, fmt, read, loaded, bad in con.execute("""
            SELECT f.path, f.format, f.rows_read,
              (SELECT count(*) FROM calls c WHERE c.source_file = f.path),
              (SELECT count(*) FROM quarantine q WHERE q.file = f.path)
            FROM ingested_files f ORDER BY f.path""").fetchall():
            report.files.append(FileReport(path, fmt, int(read), int(loaded),
                                           max(int(read) - int(loaded) - int(bad), 0), int(bad)))
        report.first_reasons = [reason_line(f, ln, r) for f, ln, r in con.execute(
            "SELECT file, line, reason FROM quarantine ORDER BY file, line NULLS FIRST LIMIT 10").fetchall()]
    return profile, report
