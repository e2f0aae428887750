"""`profiler eval`: score a profile on held-out logs."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profiler.cli import app
from profiler.commands.common import console, fail, print_json, report_ingest


@app.command("eval", no_args_is_help=True)
def eval_(
    logs: Annotated[list[Path], typer.Argument(help="Held-out log files or folders.")],
    profile: Annotated[Path, typer.Option("--profile", "-p", help="Profile root (or one version folder).")],
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object with every score.")] = False,
    strict: Annotated[bool, typer.Option(help="Exit non-zero if any held-out record is quarantined.")] = False,
) -> None:
    """Score a profile on logs it never saw: output-length band coverage and width (vs one global
    band), tool-latency p95 coverage and KS distance, and (when the profile has automata)
    next-agent accuracy, path acceptance and remaining-calls error.

    Split logs by workflow first so no session is on both sides:
    `profiler split logs/ --out split/ && profiler fit split/train --out p/ && profiler eval --profile p/ split/test --json`
    """
    from profiler.evaluation import evaluate
    from profiler.ingest import IngestError
    from profiler.profile_artifact import ProfileError, load_profile

    try:
        prof = load_profile(profile)
        result, report = evaluate(prof, logs, strict=strict, progress=not json_out)
    except (ProfileError, IngestError, ValueError) as exc:
        fail(str(exc))
    report_ingest(report, quiet=json_out and not report.quarantined)
    if json_out:
        print_json(result)
        return
    from rich.table import Table

    ol, tl = result["output_len"], result["tool_latency"]
    console.print(f"[bold]profile {prof.version}[/] on {result['calls']:,} calls / "
                  f"{result['workflows']:,} workflows")
    console.print(f"output length: coverage {ol['coverage']:.3f} (nominal {ol['nominal']:.3f}), "
                  f"mean width {ol['mean_width']:.0f} tokens vs {ol['global_band_width']:.0f} for one global band")
    for name, b in (ol.get("baselines") or {}).items():
        console.print(f"  baseline {name}: coverage {b['coverage']:.3f}, mean width {b['mean_width']:.0f} tokens",
                      highlight=False)
    t = Table(title_justify="left")
    for col in ("agent", "calls", "coverage", "mean width", "served by"):
        t.add_column(col)
    for key, v in ol["per_agent"].items():
        t.add_row(key, f"{v['calls']:,}", f"{v['coverage']:.3f}", f"{v['mean_width']:.0f}", v["level"])
    console.print(t)
    console.print(f"tool latency: p95 coverage {tl['p95_coverage']:.3f} (nominal 0.95), "
                  f"max KS distance {tl['ks_max']:.3f}")
    for key in result:
        if key not in ("profile_version", "calls", "workflows", "output_len", "tool_latency"):
            console.print(f"{key}: {result[key]}", highlight=False)
