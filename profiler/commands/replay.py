"""`profiler replay`: load-test an OpenAI-compatible endpoint with recorded workflows."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import JsonOption, app
from profiler.commands.common import console, err_console, fail, print_json
from profiler.commands.service_options import with_service_settings
from serving_hooks.settings import ReplaySettings

HELP_LOAD = "Load shape"


@app.command(no_args_is_help=True)
@with_service_settings(cls=ReplaySettings)
def replay(
    logs: Annotated[list[Path], typer.Argument(help="Log files or folders (any format `profiler fit` reads).")],
    target: Annotated[str, typer.Option("--target", "-t", help="Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:30000 (SGLang) or the gateway.")],
    model: Annotated[Optional[str], typer.Option(help="Model name to send (default: the first of the target's /v1/models).")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", "-c", help="Workflows in flight (closed loop). Default 4 without --rate; with --rate, an optional cap.", rich_help_panel=HELP_LOAD)] = None,
    rate: Annotated[Optional[float], typer.Option(help="Open loop: new workflows per second, gamma inter-arrivals.", rich_help_panel=HELP_LOAD)] = None,
    arrival_cv: Annotated[float, typer.Option(help="Coefficient of variation of inter-arrival times with --rate (1 = Poisson, >1 bursty).", rich_help_panel=HELP_LOAD)] = 1.0,
    time_scale: Annotated[float, typer.Option(help="Multiply every recorded tool/think gap by this (0.1 = 10x faster, 0 = no gaps).", rich_help_panel=HELP_LOAD)] = 1.0,
    workflows: Annotated[Optional[int], typer.Option("--workflows", "-n", help="Replay only the first N workflows (recorded start order).", rich_help_panel=HELP_LOAD)] = None,
    workflow_type: Annotated[Optional[list[str]], typer.Option(help="Only these workflow types (repeat).", rich_help_panel=HELP_LOAD)] = None,
    token_scale: Annotated[float, typer.Option(help="Multiply recorded input and output lengths by this (e.g. 0.05 to fit long-context traces on a small engine).", rich_help_panel=HELP_LOAD)] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic text and the arrival times.", rich_help_panel=HELP_LOAD)] = 0,
    out: Annotated[Optional[Path], typer.Option(help="Write one flat log record per replayed call (JSONL) here.")] = None,
    json_out: Annotated[bool, JsonOption("Print one JSON object with every figure instead of the table.")] = False,
    *,
    settings: ReplaySettings,
) -> None:
    """**Replay recorded workflows** against any OpenAI-compatible endpoint and measure JCT.

    Closed loop: each call is sent when its parents have finished plus its recorded tool/think
    gap (scaled by `--time-scale`), with a synthetic prompt of the recorded length that extends
    the session's previous context (so prefix caches see the original reuse) and
    `max_tokens` = the recorded output length. Reports per-workflow JCT (avg, P50, P95), TTFT,
    throughput, cached tokens and errors. Point it at plain SGLang, then at `profiler gateway`
    in front of the same engine, to measure what the hints buy on your cluster.

    Example: `profiler replay logs/ --target http://127.0.0.1:8080 --concurrency 8 --time-scale 0.1`
    """
    from store.ingest import IngestError
    from serving_hooks.replay import ReplayOptions, replay as run_replay
    from serving_hooks.replay_plan import load_plan
    from serving_hooks.replay_report import call_records, render_table, summarize

    ignore_eos, identity, extra_body, run_tag, timeout, progress = (
        settings.ignore_eos, settings.identity, settings.extra_body, settings.run_tag,
        settings.timeout, settings.progress)
    headers: dict[str, str] = {}
    for h in settings.headers:
        name, sep, value = h.partition(":")
        if not sep or not name.strip():
            fail(f"headers: {h!r}: expected 'Name: value'")
        headers[name.strip()] = value.strip()
    body: dict = {}
    if extra_body:
        try:
            body = json.loads(extra_body)
        except ValueError as exc:
            fail(f"extra_body is not JSON: {exc}")
        if not isinstance(body, dict):
            fail("extra_body must be a JSON object")
    try:
        opts = ReplayOptions(model=model, concurrency=concurrency if (concurrency or rate) else 4,
                             rate=rate, cv=arrival_cv, time_scale=time_scale, seed=seed, ignore_eos=ignore_eos,
                             identity=identity, timeout_s=timeout, extra_body=body, headers=headers,
                             **({} if run_tag is None else {"run_tag": run_tag}))
    except ValueError as exc:
        fail(str(exc))
    try:
        plan, ingest_summary = load_plan(logs, max_workflows=workflows, workflow_types=workflow_type,
                                           token_scale=token_scale)
    except (IngestError, ValueError) as exc:
        fail(str(exc))
    n_calls = sum(len(w.calls) for w in plan)
    if not json_out:
        err_console.print(f"[green]ingest:[/] {ingest_summary}")
        err_console.print(f"replaying {len(plan)} workflows, {n_calls} calls → {target}")

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("replay"), BarColumn(), MofNCompleteColumn(), TextColumn("calls"),
                  TextColumn("[red]{task.fields[errors]} errors"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=not progress) as bar:
        task = bar.add_task("replay", total=n_calls, errors=0)
        errors = 0

        def on_call(res) -> None:
            nonlocal errors
            errors += res.status != "ok"
            bar.update(task, advance=1, errors=errors)

        try:
            result = run_replay(plan, target, opts, on_call)
        except Exception as exc:  # connection refused before any call, bad /v1/models answer
            fail(f"replay against {target} failed: {type(exc).__name__}: {exc}")
    summary = summarize(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w") as fh:
            for rec in call_records(result):
                fh.write(json.dumps(rec) + "\n")
    if json_out:
        print_json(summary)
    else:
        console.print(render_table(summary))
        for e in summary["errors"]:
            err_console.print(f"[red]{e['count']}×[/] {e['error']}", markup=True, highlight=False)
    if summary["calls"]["count"] and summary["calls"]["errors"] == summary["calls"]["count"]:
        raise typer.Exit(1)
    sys.stdout.flush()
