"""``profiler --version``: the installed distribution's version, read from its metadata."""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import typer

from profiler.commands.common import app

#: The distribution name in pyproject.toml (the import packages are profiler, synth, …).
DISTRIBUTION = "agent-workflow-profiler"


def installed_version() -> str:
    """The version pip installed, or ``unknown`` when run from a source tree without install."""
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"profiler {installed_version()}")
        raise typer.Exit()


@app.callback()
def root(version_: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                       help="Print the installed version and exit.")) -> None:
    """Options that apply before any sub-command."""
