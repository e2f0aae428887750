"""The CLI's front door (issue 35): every command's --help fits 80 columns with no cell cut to
"…", `--admin-token` lists every endpoint it guards, and `profiler show` prints a short summary
first (`--full` for the rest) that says why a workflow type has no tool-latency fit."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from profiler.commands.common import RICH_HELP_MIN_COLUMNS

FIX = Path(__file__).parent / "fixtures" / "importers"
COMMANDS = [[]] + [[c.name or c.callback.__name__] for c in app.registered_commands]
runner = CliRunner()


def help_text(args: list[str], columns: int) -> str:
    r = runner.invoke(app, [*args, "--help"], env={"COLUMNS": str(columns)})
    assert r.exit_code == 0, r.output
    return r.output


@pytest.mark.parametrize("columns", [80, 100, RICH_HELP_MIN_COLUMNS])
@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a) or "profiler")
def test_help_fits_the_terminal_and_cuts_no_cell(args, columns):
    """At 80 columns rich cut 26 cells of `profiler gateway --help` (option names, URLs) with
    "…"; below RICH_HELP_MIN_COLUMNS the help uses click's plain layout, at and above it rich's."""
    text = help_text(args, columns)
    assert "…" not in text
    too_wide = [line for line in text.splitlines() if len(line) > columns]
    assert not too_wide, too_wide


def test_every_command_is_checked():
    names = {a[0] for a in COMMANDS if a}
    assert {"fit", "show", "eval", "import", "serve", "gateway", "simulate", "replay"} <= names, names


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_admin_token_help_lists_autoscale(command):
    words = " ".join(help_text([command], 80).split())
    guarded = words[words.index("--admin-token"):]
    assert "/v1/autoscale" in guarded[:400] and "/v1/sessions" in guarded[:400]


@pytest.fixture(scope="module")
def claude_profile(tmp_path_factory):
    """A profile of TraceLab's public Claude Code sessions: 13 tool calls over 8 tools, each
    below the 5 timed executions a tool fit needs."""
    tmp = tmp_path_factory.mktemp("cc")
    assert runner.invoke(app, ["import", str(FIX / "claude_code"), "--out", str(tmp / "logs")]).exit_code == 0
    r = runner.invoke(app, ["fit", str(tmp / "logs"), "--out", str(tmp / "p"), "-q"])
    assert r.exit_code == 0, r.output
    return tmp / "p"


def test_show_says_why_a_claude_code_profile_has_no_tool_latency(claude_profile):
    out = " ".join(runner.invoke(app, ["show", "--profile", str(claude_profile)]).output.split())
    assert "no tool latency for claude_code: no tool has the 5 timed executions a fit needs" in out
    assert "(13 tool calls over 8 tools: Bash 3, WebSearch 3, Write 2, Edit 1, +4 more)" in out
    full = " ".join(runner.invoke(app, ["show", "--profile", str(claude_profile), "--full"]).output.split())
    assert "Tool latency (lognormal MLE" in full and "(no rows for claude_code: no tool has the 5" in full


def test_show_prints_a_summary_and_full_adds_the_rest(claude_profile):
    """In a real process at 80 columns (the consoles take their width when the CLI starts)."""
    def show(*extra: str) -> str:
        r = subprocess.run([sys.executable, "-m", "profiler", "show", "--profile", str(claude_profile), *extra],
                           env={**os.environ, "COLUMNS": "80"}, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout
    short, full = show(), show("--full")
    lines = short.splitlines()
    assert len(lines) <= 40 and "Workflow types" in short and "claude_code" in short
    assert "(continued)" not in short, short                  # one table, not folded at 80
    assert "Band selection" not in short and "dominant paths" not in short
    assert all(len(line) <= 80 for line in lines), lines
    assert full.startswith(short)
    assert "Band selection" in full and "claude_code dominant paths" in full
