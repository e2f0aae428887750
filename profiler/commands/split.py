"""`profiler split`: train/test split of logs by workflow."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profiler.commands.common import app
from profiler.commands.common import err_console, fail


@app.command(no_args_is_help=True)
def split(
    logs: Annotated[list[Path], typer.Argument(help="Log files or folders.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Writes OUT/train/logs.jsonl and OUT/test/logs.jsonl.")],
    train: Annotated[float, typer.Option(help="Share of workflows in the training side.")] = 0.7,
    seed: Annotated[int, typer.Option(help="Seed of the (hash-based, deterministic) assignment.")] = 0,
    by: Annotated[str, typer.Option(help="hash (seeded hash of the workflow id) or time (the "
                                         "earliest-starting TRAIN share of workflows is train).")] = "hash",
) -> None:
    """Split logs by **workflow** (every call of a session lands on the same side), so a profile
    can be scored on sessions it never saw.

    Example: `profiler split datasets/swe_agent --out split/ --train 0.7`
    """
    from profiler.ingest import IngestError
    from profiler.split import split_logs

    try:
        counts = split_logs(logs, out, train=train, seed=seed, by=by)
    except (IngestError, ValueError) as exc:
        fail(str(exc))
    err_console.print(f"[green]train:[/] {counts['train']:,} records → {out / 'train'}   "
                      f"[green]test:[/] {counts['test']:,} records → {out / 'test'}")
