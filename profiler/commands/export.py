"""`profiler export`: write our logs (or a generated workload) as the agent traces other
benchmarks replay: Dynamo's agentic Mooncake, AIPerf's agentic (Weka) traces."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import JsonOption, app, fail

FORMAT_HELP = (
    "Target format: `dynamo-agentic` (Dynamo agentic Mooncake v2 JSONL: plays, sessions, "
    "dependencies with delays, hash_ids; replay with `python -m dynamo.replay --trace-format "
    "agentic_mooncake`), `aiperf-agentic` (AIPerf agentic / SemiAnalysis cc-traces 'Weka' JSON: one "
    "trace per workflow, sub-agents nested; --out a folder, or FILE.jsonl for one trace per line)."
)


@app.command("export")
def export_command(
    logs: Annotated[Optional[list[Path]], typer.Argument(
        help="Log files or folders (anything `profiler fit` reads). Leave out with --workload.")] = None,
    fmt: Annotated[str, typer.Option("--format", "-f", help=FORMAT_HELP)] = "dynamo-agentic",
    out: Annotated[Path, typer.Option("--out", "-o", help="Output file (dynamo-agentic; aiperf-agentic "
                                      "with .jsonl) or folder (aiperf-agentic).")] = Path("trace.jsonl"),
    workload: Annotated[Optional[str], typer.Option(
        help="Export a generated workload instead of logs: coding-assistant, deep-research, messy, "
             "agent-user, phased-team, or a JSON spec file (as `profiler generate`).")] = None,
    workflows: Annotated[int, typer.Option(help="--workload: workflows generated.", min=1)] = 100,
    seed: Annotated[int, typer.Option(help="--workload: generator seed.")] = 0,
    block_size: Annotated[int, typer.Option(help="Tokens per hash_ids block (Dynamo's examples use 64).",
                                            min=1)] = 64,
    as_json: Annotated[bool, JsonOption("Print one JSON object instead of a line.")] = False,
) -> None:
    """Write calls as an agent-trace benchmark replays them, so the workload you profiled can be
    replayed by Dynamo or AIPerf (and `profiler import` reads the file back).

    Each call keeps its tokens, its parents (previous call or `parent_request_ids`) and the gap
    after them (tool or think time); prompts become `hash_ids` blocks that repeat where a call's
    prompt extends its agent's previous one (the prefix structure the simulator assumes). What a
    format has no field for is said in docs/importers.md: Dynamo rows carry it in an `agentprof`
    object Dynamo ignores. AIPerf forbids extra keys and replays adjacent sub-agents as one
    concurrent group, so a fan-out becomes sub-agents (named by agent) and a call that runs alone
    a top-level request (its agent read back from its hash_ids chain: main, agent_1, ...); tool
    names are lost there (their time stays in think_time). A workflow that nesting cannot express
    is left out and named, never written with other parents.

    Examples: `profiler export logs/ --format dynamo-agentic --out trace.jsonl`;
    `profiler export --workload deep-research --workflows 50 --format aiperf-agentic --out traces/`
    """
    from store.duckdb_store import StoreError
    from store.exporters import FORMATS, export, export_records
    from store.ingest import IngestError

    key = fmt.strip().lower().replace("_", "-")
    if key not in FORMATS:
        fail(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    if bool(logs) == bool(workload):
        fail("give LOGS or --workload (one of them)")
    try:
        if workload:
            from store.workloads import generate, load_spec

            records = list(generate(load_spec(workload), workflows, seed=seed))
            report = export_records(key, records, out, block_size=block_size)
        else:
            report = export(key, logs or [], out, block_size=block_size)
    except (IngestError, StoreError, ValueError, FileNotFoundError, OSError) as exc:
        fail(str(exc))
    if as_json:
        typer.echo(json.dumps(report.__dict__))
    else:
        typer.echo(f"wrote {report.calls:,} calls of {report.workflows:,} workflows as {report.fmt} to "
                   f"{report.out}" + (f" ({report.files} files)" if report.files > 1 else ""))
        if report.quarantined:
            typer.secho(f"warning: {report.quarantined} records quarantined at reading (not exported; "
                        "`profiler fit` lists why)", err=True, fg="yellow")
        for why in report.skipped[:20]:
            typer.secho(f"left out: {why}", err=True, fg="yellow")
        if len(report.skipped) > 20:
            typer.secho(f"... and {len(report.skipped) - 20} more workflows left out", err=True, fg="yellow")
    if report.calls == 0:
        raise typer.Exit(1)
