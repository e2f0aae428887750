"""What the sub-commands share: the Typer :data:`app`, consoles, error exits, ingest summaries."""
from __future__ import annotations

import json
import math
import shutil
import sys
from typing import Any, NoReturn

import typer
import typer.core
from rich.markup import escape

from profiler.commands.folding import FoldingConsole

def _flags_without_type(params: list) -> list:
    """``params`` with every boolean flag's type placeholder blanked (``metavar=""``).

    Typer's rich help prints a type column for every option, and since 0.2x that column says
    ``<bool>`` beside every flag (``--json``, ``--help``), which takes no value at all (issue 24).
    An option's ``metavar`` replaces that column, so an empty one leaves it blank; options that
    take a value keep theirs (``<path>``, ``<float>``)."""
    for param in params:
        if getattr(param, "is_bool_flag", False) and getattr(param, "metavar", "") is None:
            param.metavar = ""
    return params


#: Narrowest terminal that gets Typer's rich option tables. Rich lays each option out in one table
#: row of up to six columns; below this width the long option names of ``profiler gateway``
#: (``--allow-client-scheduler-fields``) leave the help column a few characters wide, and rich
#: cuts option names, URLs and variable names with "…" (issue 35: 26 cut cells at 80 columns).
RICH_HELP_MIN_COLUMNS = 140


def _narrow_help(command) -> None:
    """Lay ``command``'s ``--help`` out in click's plain layout (names on one line, the help
    wrapped below them: nothing is ever cut) when the terminal is narrower than
    :data:`RICH_HELP_MIN_COLUMNS`, in rich's tables otherwise; markdown's ``**bold**`` marks are
    dropped from the plain text. Decided at each call (one process may print both: tests)."""
    if not hasattr(command, "_rich_help"):
        command._rich_help = (getattr(command, "rich_markup_mode", None), command.help, command.short_help)
    mode, text, short = command._rich_help
    # The width rich itself would lay the help out in: COLUMNS, the terminal, or 80 when piped.
    if mode is None or shutil.get_terminal_size((80, 24)).columns >= RICH_HELP_MIN_COLUMNS:
        command.rich_markup_mode, command.help, command.short_help = mode, text, short
    else:
        command.rich_markup_mode = None
        command.help = text.replace("**", "") if text else text
        command.short_help = short.replace("**", "") if short else short


class _ProfilerGroup(typer.core.TyperGroup):
    """The ``profiler`` group: its own and every sub-command's flags shown without ``<bool>``, and
    ``--help`` in click's plain layout on a terminal too narrow for rich's option tables."""

    def get_params(self, ctx):  # the group's own --help / --version
        return _flags_without_type(super().get_params(ctx))

    def get_command(self, ctx, cmd_name):
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            _flags_without_type(cmd.get_params(ctx))
            _narrow_help(cmd)
        return cmd

    def format_help(self, ctx, formatter):
        _narrow_help(self)
        return super().format_help(ctx, formatter)


#: The ``profiler`` application: every sub-command module registers itself on it at import;
#: :mod:`profiler.cli` imports those modules (the list of commands) and runs it.
app = typer.Typer(
    cls=_ProfilerGroup,
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

# The flags several commands share, each declared here once (names, short form, default help);
# a command passes its own help where the flag means a little more there.
HELP_PROFILE = "Profile root (a `profiler fit` output) or one of its version folders."


def ProfileOption(help: str = HELP_PROFILE) -> Any:  # noqa: N802 (reads as a type in signatures)
    """``--profile/-p DIR``."""
    return typer.Option("--profile", "-p", help=help)


def DbOption(help: str = "DuckDB store file.") -> Any:  # noqa: N802
    """``--db FILE``."""
    return typer.Option("--db", help=help)


def StrictOption(help: str = "Exit non-zero if any record is quarantined.") -> Any:  # noqa: N802
    """``--strict/--no-strict``."""
    return typer.Option("--strict/--no-strict", help=help)


def GroupByOption(help: str) -> Any:  # noqa: N802
    """``--group-by FIELD``: keep the workflows sharing a record field in one fold."""
    return typer.Option("--group-by", help=help)


def GroupPatternOption() -> Any:  # noqa: N802
    """``--group-pattern REGEX`` (with ``--group-by``)."""
    return typer.Option("--group-pattern", help="With --group-by: the group is this regex's first "
                        "capture group (else whole match) in the field, e.g. '[^/]+$'.")


def JsonOption(help: str = "Print one JSON object instead of tables.") -> Any:  # noqa: N802
    """``--json``."""
    return typer.Option("--json", help=help)


def terminal_width(fallback: int = 150) -> int:
    """Columns to lay tables out in: ``COLUMNS`` when set, else the terminal's width, else
    ``fallback`` (piped output stays wide enough to read; rich alone would fall back to 80)."""
    return max(40, shutil.get_terminal_size((fallback, 24)).columns)


# Wide tables fold to this width: split into column groups, first column repeated (folding.py).
console = FoldingConsole(width=terminal_width())
err_console = FoldingConsole(stderr=True, width=terminal_width())


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``message`` as an error and exit with ``code``.

    The message is printed as is: brackets in it (a path, a record's text) are not rich markup."""
    err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)  # one line, never wrapped
    raise typer.Exit(code)


def print_json(obj: Any) -> None:
    """One JSON object on stdout (NaN becomes null so any JSON parser accepts it)."""
    def clean(o: Any) -> Any:
        if isinstance(o, float) and not math.isfinite(o):
            return None
        if isinstance(o, dict):
            return {k: clean(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [clean(v) for v in o]
        return o
    sys.stdout.write(json.dumps(clean(obj), indent=2) + "\n")


def report_ingest(report: Any, quiet: bool = False) -> None:
    """Tell the user what the load did (to stderr, so --json output stays clean)."""
    if quiet:
        return
    style = "yellow" if report.quarantined else "green"
    err_console.print(f"[{style}]ingest:[/] {report.summary()}")
    if report.quarantined:
        err_console.print("  first problems (all of them are in the store's `quarantine` table):")
        for reason in report.first_reasons[:5]:
            err_console.print(f"    {reason}", markup=False, highlight=False)
