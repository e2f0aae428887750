"""`profiler fit`: logs → DuckDB store → profile."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.cli import app
from profiler.commands.common import err_console, fail, print_json, report_ingest


@app.command(no_args_is_help=True)
def fit(
    logs: Annotated[list[Path], typer.Argument(help="Log files or folders (JSONL, JSONL.gz, Parquet, CSV; flat or gateway records).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile root folder (created; new versions are added to it).")] = Path("profile"),
    db: Annotated[Optional[Path], typer.Option(help="DuckDB store to load into (default: OUT/store.duckdb).")] = None,
    coverage: Annotated[float, typer.Option(help="Target coverage of the output-length bands.", min=0.5, max=0.9999)] = 0.99,
    prune: Annotated[float, typer.Option(help="Drop automaton transitions rarer than this probability.", min=0.0, max=0.5)] = 0.05,
    seed: Annotated[int, typer.Option(help="Seed of the calibration splits.")] = 0,
    min_calls: Annotated[int, typer.Option(help="Fewest calls for an agent to get its own band (else workflow type, then global).")] = 50,
    no_conditional: Annotated[bool, typer.Option("--no-conditional", help="Never use the history-conditioned (CQR) length model.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit non-zero if any record is quarantined.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the new profile's manifest as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
) -> None:
    """Ingest request logs and fit a **profile**: per-agent output-length bands, per-tool latency
    lognormals, per-agent timings and the workflow automata.

    Logs accumulate in the DuckDB store: re-running on the same files adds nothing, new files add
    their calls, and the new profile version is fit on everything in the store.

    Example: `profiler fit logs/ --out profile/ && profiler show --profile profile/`
    """
    from profiler.fitting import FitOptions, fit_profile
    from profiler.ingest import IngestError

    options = FitOptions(coverage=coverage, prune=prune, seed=seed, min_calls=min_calls,
                         conditional=not no_conditional)
    try:
        profile, report = fit_profile(logs, out, db=db, options=options, strict=strict,
                                      progress=not quiet)
    except IngestError as exc:
        fail(str(exc))
    except ValueError as exc:
        fail(str(exc))
    report_ingest(report, quiet)
    if json_out:
        print_json(profile.manifest)
    elif not quiet:
        c = profile.manifest["counts"]
        err_console.print(
            f"[green]profile {profile.version}[/] written to {profile.path} "
            f"({c['calls']:,} calls, {c['workflows']:,} workflows, {c['workflow_types']} workflow types)")
