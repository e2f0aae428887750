"""`profiler watch`: keep a profile fresh from a growing log folder (online refit)."""
from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import DbOption, JsonOption, ProfileOption, app
from profiler.commands.common import err_console, fail


@app.command(no_args_is_help=True)
def watch(
    profile: Annotated[Path, ProfileOption("Profile root to refit (its store.duckdb collects the logs; new versions go to versions/, CURRENT is switched atomically).")],
    logs: Annotated[list[Path], typer.Option("--logs", "-l", help="Log folder(s) to follow, e.g. the gateway's --log-dir. Repeat for several.")],
    every: Annotated[str, typer.Option(help="How often to look for new log files: 30s, 10m, 1h.")] = "10m",
    db: Annotated[Optional[Path], DbOption("DuckDB store (default: PROFILE/store.duckdb).")] = None,
    once: Annotated[bool, typer.Option("--once", help="Refit once (if there is anything new) and exit.")] = False,
    json_out: Annotated[bool, JsonOption("Print each refit's result as one JSON line on stdout.")] = False,
) -> None:
    """Refit a **profile** whenever new log files appear (online refit).

    Every `--every`, files under `--logs` that the store has not ingested (by content hash) are
    ingested and the profile is refit on everything in the store, with the fit options recorded
    in the active profile's manifest. The new version is written beside the old one and
    `CURRENT` is switched atomically: a running `profiler serve` or `profiler gateway --profile`
    picks it up by itself (they poll `CURRENT`). Nothing new → nothing is done.

    The gateway writes closed log files only (`*.jsonl`; the open one is `*.jsonl.open`), so a
    refit never reads a half-written line.

    Example: `profiler watch --profile profile/ --logs gateway-logs/ --every 10m`
    """
    from serving_hooks.refit import RefitLoop
    from serving_hooks.settings import parse_duration

    try:
        every_s = parse_duration(every)
    except ValueError as exc:
        fail(str(exc))
    if not (profile / "CURRENT").exists():
        fail(f"{profile} is not a profile root (no CURRENT file): create it with "
             f"`profiler fit LOGS --out {profile}` first")

    def report(result) -> None:
        if json_out:
            sys.stdout.write(json.dumps(dataclasses.asdict(result)) + "\n")
            sys.stdout.flush()
        style = "red" if result.error else ("green" if result.changed else "dim")
        err_console.print(f"[{style}]{result.summary()}[/]")

    loop = RefitLoop(profile_root=profile, logs=list(logs), every_s=every_s, db=db, subprocess=False,
                     on_result=report)
    first = loop.run_once()
    if once:
        raise typer.Exit(1 if first.error else 0)
    err_console.print(f"watching {', '.join(map(str, logs))} every {every} (Ctrl+C to stop)")
    loop.start()
    try:
        while loop.join(1.0):
            pass
    except KeyboardInterrupt:
        loop.stop()
