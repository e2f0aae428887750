"""Exporters: our logs -> the agent-trace formats other tools benchmark with (``profiler export``).

The reverse of :mod:`store.importers`: the logs are read through the store (any file
``profiler fit`` reads: flat or gateway records, JSONL / Parquet / CSV; bad records quarantined
exactly as at ingest), grouped into workflows with their parents resolved
(:mod:`store.exporters._graph`), and written in one format:

``dynamo-agentic``  Dynamo's agentic Mooncake v2 JSONL (:mod:`.dynamo_agentic`)
``aiperf-agentic``  AIPerf's agentic / SemiAnalysis cc-traces "Weka" JSON (:mod:`.aiperf_agentic`)

``profiler import`` reads both back (auto-detected); export then import gives the same calls,
tokens, gaps and parents (``tests/test_trace_interchange.py`` checks it on every bundled set).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Sequence

from store.duckdb_store import connect
from store.exporters import aiperf_agentic, dynamo_agentic
from store.exporters._graph import Workflow, group_workflows
from store.ingest import ingest

FORMATS: dict[str, ModuleType] = {m.NAME: m for m in (dynamo_agentic, aiperf_agentic)}

__all__ = ["FORMATS", "ExportReport", "load_records", "export", "export_records", "group_workflows", "Workflow"]

_CALLS_SQL = """
SELECT request_id, workflow_type_id, workflow_id, agent_id, model, t_arrival, t_first_token, t_finish,
       input_tokens, output_tokens, cached_tokens, status, parent_request_ids, tool_calls,
       json_extract_string(extra, '$.wait_after') AS wait_after,
       json_extract_string(extra, '$.timing') AS timing,
       json_extract_string(extra, '$.tool_timing') AS tool_timing,
       TRY_CAST(json_extract(extra, '$.tokens_unknown') AS BOOLEAN) AS tokens_unknown,
       TRY_CAST(json_extract(extra, '$.tokens_estimated') AS BOOLEAN) AS tokens_estimated,
       json_extract_string(extra, '$.stage') AS stage
FROM calls ORDER BY workflow_type_id, workflow_id, t_arrival, request_id
"""


@dataclass
class ExportReport:
    """What one export wrote: files, workflows and calls, records quarantined at reading, and the
    workflows the format could not carry (each with its reason)."""

    fmt: str
    out: str
    files: int = 0
    workflows: int = 0
    calls: int = 0
    quarantined: int = 0
    skipped: list[str] = field(default_factory=list)


def load_records(paths: Sequence[str | Path]) -> tuple[list[dict], int]:
    """Flat records of every log under ``paths`` (read and validated as ``profiler fit`` does, in
    an in-memory store) and the number of records quarantined."""
    con = connect(None)
    try:
        report = ingest(con, [str(p) for p in paths])
        cur = con.execute(_CALLS_SQL)
        cols = [d[0] for d in cur.description]
        records = []
        for row in cur.fetchall():
            rec = {k: v for k, v in zip(cols, row) if v is not None}
            if isinstance(rec.get("tool_calls"), str):
                rec["tool_calls"] = json.loads(rec["tool_calls"])
            if rec.get("status") == "ok":
                rec.pop("status")
            for flag in ("tokens_unknown", "tokens_estimated"):
                if rec.get(flag) is False:
                    rec.pop(flag)
            if "parent_request_ids" in rec:
                rec["parent_request_ids"] = list(rec["parent_request_ids"])
            records.append(rec)
    finally:
        con.close()
    return records, report.quarantined


def export_records(fmt: str, records: Sequence[dict], out: Path, *, block_size: int = 64) -> ExportReport:
    """Write ``records`` (flat records) to ``out`` in format ``fmt``."""
    module = FORMATS.get(fmt.strip().lower().replace("_", "-"))
    if module is None:
        raise ValueError(f"unknown export format {fmt!r}; known formats: {', '.join(FORMATS)}")
    if not records:
        raise ValueError("no calls to export")
    res = module.write(group_workflows(records), Path(out), block_size=block_size)
    return ExportReport(module.NAME, str(out), res["files"], res["workflows"], res["calls"],
                        skipped=res.get("skipped", []))


def export(fmt: str, paths: Sequence[str | Path], out: Path, *, block_size: int = 64) -> ExportReport:
    """Read the logs under ``paths`` and write them to ``out`` in format ``fmt``."""
    if fmt.strip().lower().replace("_", "-") not in FORMATS:
        raise ValueError(f"unknown export format {fmt!r}; known formats: {', '.join(FORMATS)}")
    records, quarantined = load_records(paths)
    report = export_records(fmt, records, out, block_size=block_size)
    report.quarantined = quarantined
    return report
