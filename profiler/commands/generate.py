"""`profiler generate`: synthetic agent workloads."""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import app
from profiler.commands.common import err_console, fail


def _until(records, n_calls: int):
    """Whole workflows until at least ``n_calls`` calls were yielded (never a cut workflow)."""
    seen = 0
    for _, group in itertools.groupby(records, key=lambda r: r["workflow_id"]):
        if seen >= n_calls:
            return
        for r in group:
            seen += 1
            yield r


@app.command(no_args_is_help=True)
def generate(
    out: Annotated[Path, typer.Option("--out", "-o", help="Output .jsonl (or .jsonl.gz) file.")],
    workload: Annotated[Optional[str], typer.Option(help="coding-assistant, deep-research, messy, agent-user, phased-team, drift-team, or a JSON spec file.")] = None,
    messy: Annotated[bool, typer.Option("--messy", help="The messy workload (same as --workload messy): bimodal and heavy-tailed lengths, a rare agent and transition, a release at the midpoint, tools slowing with load.")] = False,
    workflows: Annotated[int, typer.Option(help="Number of workflows (sessions) to generate.", min=1)] = 100,
    calls: Annotated[Optional[int], typer.Option(help="Instead of --workflows: generate workflows until at least this many calls.", min=1)] = None,
    seed: Annotated[int, typer.Option(help="Random seed (same seed, same logs).")] = 0,
    rate: Annotated[float, typer.Option(help="Workflow arrival rate (Poisson), workflows per second.", min=1e-6)] = 0.2,
    with_text: Annotated[bool, typer.Option("--with-text", help="Include prompts (messages) and response_text.")] = False,
) -> None:
    """Generate seeded synthetic logs (flat records): the two Pythia workflows, or `--messy`.

    Agents' output lengths follow the workload spec's mean/CV (lognormal, AR(1)-correlated for
    high-variance agents); tools have lognormal latencies (file ops ~45 ms, code execution ~180 ms
    with a heavy tail, web calls ~1.5 s, test runs seconds). Specs live in `store/workload_specs/`.

    `--messy` generates logs that break the models' easy assumptions on purpose (see
    docs/evaluation.md): use it for tests and benchmarks of the predictors.

    Example: `profiler generate --workload coding-assistant --workflows 500 --out logs/coding.jsonl`
    """
    from rich.progress import Progress

    from store.workloads import generate as gen, load_spec, write_jsonl

    if messy and workload not in (None, "messy"):
        fail(f"--messy and --workload {workload} contradict each other: give one")
    workload = "messy" if messy else workload
    if workload is None:
        fail("give --workload (coding-assistant, deep-research, messy, agent-user, phased-team, drift-team or a JSON spec file) or --messy")
    n_wf = None if calls else workflows
    try:
        spec = load_spec(workload)
        records = gen(spec, n_wf, seed=seed, with_text=with_text, arrival_rate=rate)
    except ValueError as exc:
        fail(str(exc))
    if calls:
        records = _until(records, calls)
    with Progress(transient=True, console=err_console) as bar:
        task = bar.add_task("generating", total=calls)

        def counted(it):
            for i, r in enumerate(it):
                if i % 1000 == 0:
                    bar.update(task, completed=i)
                yield r
        n = write_jsonl(counted(records), out, gzip_output=out.name.endswith(".gz"))
    err_console.print(f"[green]wrote {n:,} calls[/] to {out}")
