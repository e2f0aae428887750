"""`profiler report`: a self-contained HTML page of a profile."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import DbOption, ProfileOption, app


@app.command("report", no_args_is_help=True)
def report(
    profile: Annotated[Path, ProfileOption("Profile root (or one version folder).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
    eval_logs: Annotated[Optional[list[Path]], typer.Option(
        "--eval", help="Held-out log files or folders: adds the evaluation figures (repeat for several).",
        exists=True)] = None,
    db: Annotated[Optional[Path], DbOption(
        help="DuckDB store with the calls behind the histograms (default: PROFILE/store.duckdb).")] = None,
    group: Annotated[Optional[list[str]], typer.Option(
        "--group", metavar="REGEX=ROLE",
        help="Draw agents whose name matches REGEX (re.search) as ROLE, on every team (first match wins; "
             "repeat for several). Replaces the default rules, which pool *_Expert agents on teams of "
             "more than 16 agents.")] = None,
    no_group: Annotated[bool, typer.Option("--no-group", help="Draw every agent on its own, however many.")] = False,
    show_pruned: Annotated[bool, typer.Option(
        "--show-pruned", help="Draw the transitions the pruned automaton dropped from the start "
                              "(hidden by default; the page's checkbox toggles them).")] = False,
) -> None:
    """Write one HTML page showing what a profile learned: the workflow graph per workflow type
    (agents as nodes, or roles on a team of more than 16 agents; transition probabilities on edges;
    pruned edges hidden until asked for) with its regex and the share of workflows it covers,
    per-agent output-length histograms with the predicted band, per-tool latency CDFs with the
    fitted lognormal, context growth, cached-token share, arrivals and concurrency, band
    calibration curves, and, with `--eval`, the held-out evaluation figures.

    The page is self-contained (inline SVG, CSS and JS; nothing loads from the network): open it
    in any browser or attach it to a ticket.

    Example: `profiler report --profile profile/ --out report.html --eval heldout/`
    """
    from rich.progress import Progress

    from profiler.commands.common import err_console, fail
    from store.profile_artifact import ProfileError
    from profiler.report import build_report
    from profiler.report.roles import DEFAULT_RULES, GROUP_ABOVE, parse_rule

    try:
        rules = () if no_group else tuple(parse_rule(g) for g in group) if group else DEFAULT_RULES
        with Progress(console=err_console, transient=True) as bar:
            task = bar.add_task("report", total=None)

            def step(label: str, done: int, total: int) -> None:
                bar.update(task, description=f"report: {label}", completed=done, total=total)

            path = build_report(profile, out, db=db, eval_logs=eval_logs or None, group_rules=rules,
                                group_above=0 if group else GROUP_ABOVE, show_pruned=show_pruned,
                                on_step=step)
    except (ProfileError, RuntimeError, ValueError) as exc:
        fail(str(exc))
    typer.echo(f"report written to {path} ({path.stat().st_size / 1024:.0f} KiB)")
