"""The `profiler` command line.

Every sub-command lives in its own module under ``profiler/commands/`` and registers itself on
:data:`profiler.commands.common.app` when imported; this file imports those modules — the list of
commands is the import list below — and runs the app. Adding a command is one new module plus
one name here.
"""
from __future__ import annotations

# Imported to register their commands; `profiler --help` lists them in this order.
from profiler.commands import generate, ingest, fit, show, evaluate, split  # noqa: F401
from profiler.commands import import_, export, report  # noqa: F401
from profiler.commands import serve, gateway, watch  # noqa: F401
from profiler.commands import simulate, replay  # noqa: F401
from profiler.commands import version  # noqa: F401  (the root callback: --version)
from profiler.commands.common import app

__all__ = ["app", "main"]


def main() -> None:  # console-script entry point
    app()
