"""`profiler import`: convert other tools' traces (OpenTelemetry, OpenInference, SWE-agent,
mini-SWE-agent, OpenHands, Dynamo request traces and agentic Mooncake, AIPerf agentic traces,
ATIF, ...) into flat log records, with one line per source file."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from profiler.commands.common import JsonOption, StrictOption, app
from profiler.commands.common import fail

FORMAT_HELP = (
    "Source format: `auto` (default: detect each file's), `claude-code` (Claude Code session JSONL, "
    "~/.claude/projects), `codex` (Codex CLI rollouts, ~/.codex/sessions), `tracelab` (TraceLab "
    "normalized rounds), `otel` (OpenTelemetry GenAI or OpenInference spans: OTLP JSON, OTel SDK JSON, "
    "Phoenix rows; alias `openinference`), `swe-agent` (.traj, timed with its .debug.log, else "
    "order-only), `mini-swe-agent` (.traj.json), `openhands` (V0/V1 output.jsonl, V1 conversation "
    "folders), `dynamo` (dynamo.request.trace.v1 JSONL), `atif` (ATIF v1.x trajectory.json), "
    "`dynamo-agentic` (Dynamo agentic Mooncake v2/v1 and plain Mooncake JSONL; alias `mooncake`), "
    "`aiperf-agentic` (AIPerf agentic / SemiAnalysis cc-traces 'Weka' JSON, nested sub-agents; alias "
    "`weka`). `profiler export` writes the last two."
)


@app.command("import")
def import_command(
    sources: Annotated[list[Path], typer.Argument(help="Files or folders to convert (folders are searched "
                                                     "recursively for the format's files).", exists=True)],
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)] = "auto",
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the flat JSONL files (created).")] = Path("logs"),
    workflow_type: Annotated[Optional[str], typer.Option(
        help="workflow_type_id for every record (default: from the source; swe_agent / openhands / "
             "the OTel gen_ai.workflow.name or service.name).")] = None,
    timezone: Annotated[Optional[str], typer.Option(
        help="IANA time zone of timestamps written without offset (SWE-agent logs, OpenHands events, "
             "ATIF). Default: detected where the file allows (OpenHands), else UTC, with a warning.")] = None,
    text: Annotated[bool, typer.Option("--text/--no-text", help="Keep prompts and responses when present.")] = True,
    strict: Annotated[bool, StrictOption("Stop at the first malformed input instead of skipping it.")] = False,
    estimate_tokens: Annotated[bool, typer.Option(
        "--estimate-tokens", help="Where a source holds no per-call token counts (SWE-agent .traj with run "
        "totals only), estimate them from the text (UTF-8 bytes / 4), flagged tokens_estimated.")] = False,
    as_json: Annotated[bool, JsonOption("Print one JSON object (per-file calls, reasons, "
                                          "problems; totals) instead of lines.")] = False,
) -> None:
    """Convert other tools' traces into our flat records (one JSONL file per source file).

    Every field is taken from the source; what it lacks is never invented: a source without
    times (a SWE-agent `.traj` without its `.debug.log`) is imported in order only and flagged
    (`timing: synthetic_order`; `profiler fit` then says which predictions it cannot make).
    Claude Code and Codex sessions mark the calls a person answered (`wait_after: human`):
    that think time is kept out of keep-alive and tool-latency fits.
    Each source file gets one line: its call count, or why it gave none. Malformed input is
    reported with file and line and skipped (`--strict`: stop instead).

    Example: `profiler import ~/.claude/projects ~/.codex/sessions --out logs/ && profiler fit logs/ --out profile/`
    """
    from store.importers import ImportFormatError, convert, get_format

    try:
        if fmt.strip().lower() != "auto":
            fmt = get_format(fmt).NAME
        result = convert(fmt, sources, out, strict=strict, progress=not as_json, workflow_type=workflow_type,
                         timezone=timezone, with_text=text, estimate_tokens=estimate_tokens)
    except (ImportFormatError, ValueError, FileNotFoundError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(_as_json(result, fmt, out)))
        if result.records == 0:
            raise typer.Exit(1)
        return
    for one in result.per_file[:200]:
        typer.secho(one.line(), fg=None if one.calls else "yellow")
    if len(result.per_file) > 200:
        empty = sum(1 for one in result.per_file[200:] if not one.calls)
        typer.echo(f"... and {len(result.per_file) - 200} more files ({empty} with 0 calls)")
    for err in result.warnings[:20]:
        typer.secho(f"warning: {err}", err=True, fg="yellow")
    problems = [e for one in result.per_file if one.calls for e in one.problems]
    for err in problems[:20]:
        typer.secho(f"skipped: {err}", err=True, fg="yellow")
    if len(problems) > 20:
        typer.secho(f"... and {len(problems) - 20} more problems", err=True, fg="yellow")
    typer.echo(f"imported {result.records} calls from {result.sources} {fmt} files "
               f"into {len(result.files)} files under {out}/"
               + (f" ({len(result.errors)} problems skipped)" if result.errors else ""))
    if result.records == 0:
        raise typer.Exit(1)


def _as_json(result: Any, fmt: str, out: Path) -> dict[str, Any]:
    """The ``--json`` form of a :class:`store.importers.ConversionReport`."""
    return {
        "format": fmt, "out": str(out), "calls": result.records, "sources": result.sources,
        "outputs": len(result.files), "problems": len(result.errors), "warnings": len(result.warnings),
        "files": [{"source": one.source, "format": one.fmt, "calls": one.calls, "output": one.output,
                   "reason": one.reason, "problems": [str(e) for e in one.problems[:20]],
                   "warnings": [str(e) for e in one.warnings[:20]]} for one in result.per_file],
    }
