"""`profiler import`: convert OpenTelemetry / SWE-agent / OpenHands traces into flat log records."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import app
from profiler.commands.common import fail

FORMAT_HELP = (
    "Source format: `otel` (OTLP JSON GenAI spans), `swe-agent` (.traj + .debug.log), "
    "`openhands` (evaluation output.jsonl)."
)


@app.command("import")
def import_command(
    sources: Annotated[list[Path], typer.Argument(help="Files or folders to convert (folders are searched "
                                                     "recursively for the format's files).", exists=True)],
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)],
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the flat JSONL files (created).")] = Path("logs"),
    workflow_type: Annotated[Optional[str], typer.Option(
        help="workflow_type_id for every record (default: from the source; swe_agent / openhands / "
             "the OTel gen_ai.workflow.name or service.name).")] = None,
    timezone: Annotated[str, typer.Option(
        help="Time zone of timestamps written without offset (SWE-agent logs, OpenHands events).")] = "UTC",
    text: Annotated[bool, typer.Option("--text/--no-text", help="Keep prompts and responses when present.")] = True,
    strict: Annotated[bool, typer.Option(help="Stop at the first malformed input instead of skipping it.")] = False,
) -> None:
    """Convert other tools' traces into our flat records (one JSONL file per source file).

    Every field is taken from the source; what it lacks is never invented (a SWE-agent `.traj`
    needs the `<instance>.debug.log` SWE-agent writes beside it for call times and token counts).
    Malformed input is reported with file and line and skipped (`--strict`: stop instead).

    Example: `profiler import --format otel traces/ --out logs/ && profiler fit logs/ --out profile/`
    """
    from profiler.importers import ImportFormatError, convert, get_format

    try:
        module = get_format(fmt)
        result = convert(fmt, sources, out, strict=strict, progress=True, workflow_type=workflow_type,
                         timezone=timezone, with_text=text)
    except (ImportFormatError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    for err in result.errors[:20]:
        typer.secho(f"skipped: {err}", err=True, fg="yellow")
    if len(result.errors) > 20:
        typer.secho(f"... and {len(result.errors) - 20} more problems", err=True, fg="yellow")
    typer.echo(f"imported {result.records} calls from {result.sources} {module.NAME} files "
               f"into {len(result.files)} files under {out}/"
               + (f" ({len(result.errors)} problems skipped)" if result.errors else ""))
    if result.records == 0:
        raise typer.Exit(1)
