"""The `profiler` command line.

Every sub-command lives in its own module under ``profiler/commands/`` and registers itself on
:data:`app` at import time; this file only lists those modules, so adding a command is one new
module plus one line in :data:`COMMAND_MODULES`.
"""
from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="profiler",
    help=(
        "Mine agent request logs into workflow profiles (output-length bands, tool latencies, "
        "workflow automata) and serve them to the LLM serving engine.\n\n"
        "Typical flow: `profiler fit logs/ --out profile/` → `profiler show --profile profile/` → "
        "`profiler eval --profile profile/ heldout/`."
    ),
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_show_locals=False,
)

#: Modules under ``profiler.commands`` that register sub-commands on :data:`app`.
COMMAND_MODULES: list[str] = [
    "generate",
    "ingest",
    "fit",
    "show",
    "evaluate",
    "split",
    "import_",
    "report",
    "serve", "gateway", "watch",
    "simulate",
    "replay",
    "version",
]


def _register() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(f"profiler.commands.{name}")


def main() -> None:  # console-script entry point
    _register()
    app()
