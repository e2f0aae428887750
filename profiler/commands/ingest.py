"""`profiler ingest`: load logs into a DuckDB store without fitting."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profiler.commands.common import DbOption, StrictOption, app
from profiler.commands.common import fail, report_ingest


@app.command(no_args_is_help=True)
def ingest(
    logs: Annotated[list[Path], typer.Argument(help="Log files or folders (JSONL, JSONL.gz, Parquet, CSV).")],
    db: Annotated[Path, DbOption("DuckDB store file (created if missing).")] = Path("profile/store.duckdb"),
    strict: Annotated[bool, StrictOption("Exit non-zero if any record is quarantined.")] = False,
) -> None:
    """Load logs into the DuckDB store (tables `calls`, `tool_calls`, `quarantine`,
    `ingested_files`) without fitting. Re-ingesting a file or a request id never duplicates.

    Example: `profiler ingest logs/ --db store.duckdb && duckdb store.duckdb "FROM quarantine"`
    """
    import duckdb

    from store.ingest import IngestError, ingest as run
    from store.duckdb_store import StoreError, connect, one_line_error

    try:
        con = connect(db)
        try:
            report = run(con, logs, strict=strict, progress=True)
        finally:
            con.close()
    except IngestError as exc:
        fail(str(exc))
    except (StoreError, OSError, duckdb.Error) as exc:  # lock conflict, read-only store or folder, full disk
        message = one_line_error(exc, db)
        if message is None:
            raise
        fail(message)
    report_ingest(report)
