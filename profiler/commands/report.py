"""`profiler report`: a self-contained HTML page of a profile."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import app


@app.command("report", no_args_is_help=True)
def report(
    profile: Annotated[Path, typer.Option("--profile", "-p", help="Profile root (or one version folder).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    eval_logs: Annotated[Optional[list[Path]], typer.Option(
        "--eval", help="Held-out log files or folders: adds the evaluation figures (repeat for several).",
        exists=True)] = None,
    db: Annotated[Optional[Path], typer.Option(
        help="DuckDB store with the calls behind the histograms (default: PROFILE/store.duckdb).")] = None,
) -> None:
    """Write one HTML page showing what a profile learned: the workflow graph per workflow type
    (agents as nodes, transition probabilities on edges, pruned edges greyed) with its regex,
    per-agent output-length histograms with the predicted band, per-tool latency CDFs with the
    fitted lognormal, and, with `--eval`, the held-out evaluation figures.

    The page is self-contained (inline SVG, CSS and JS; nothing loads from the network): open it
    in any browser or attach it to a ticket.

    Example: `profiler report --profile profile/ --out report.html --eval heldout/`
    """
    from profiler.commands.common import fail
    from store.profile_artifact import ProfileError
    from profiler.report import build_report

    try:
        path = build_report(profile, out, db=db, eval_logs=eval_logs or None)
    except (ProfileError, RuntimeError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"report written to {path} ({path.stat().st_size / 1024:.0f} KiB)")
