"""`profiler import` end to end: converted files load into the real DuckDB store with nothing
quarantined, and `convert_to_folder` (the record count of `convert`, which `profiler fit --format`
also uses) agrees."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from store.importers import FORMATS, convert_to_folder, get_format
from store.ingest import ingest
from store.duckdb_store import connect

FIXTURES = Path(__file__).parent / "fixtures" / "importers"
EXPECTED = {"otel": (FIXTURES / "otel", 7, 3), "swe-agent": (FIXTURES / "swe_agent", 4, 3),
            "openhands": (FIXTURES / "openhands", 7, 5), "dynamo": (FIXTURES / "dynamo", 8, 2),
            "atif": (FIXTURES / "atif", 5, 0), "mini-swe-agent": (FIXTURES / "mini_swe_agent", 6, 0)}  # format -> (source, calls, tool executions)

runner = CliRunner()


def test_registry_names_and_aliases():
    assert set(FORMATS) == {"otel", "swe-agent", "mini-swe-agent", "openhands", "dynamo", "atif", "claude-code",
                            "codex", "tracelab", "dynamo-agentic", "aiperf-agentic"}
    assert get_format("swe_agent") is FORMATS["swe-agent"]
    assert get_format("OpenInference") is FORMATS["otel"]
    with pytest.raises(ValueError, match="known formats: otel, swe-agent, mini-swe-agent, openhands"):
        get_format("langfuse")


@pytest.mark.parametrize("fmt", sorted(EXPECTED))
def test_import_then_ingest_loads_every_call(tmp_path, fmt):
    src, n_calls, n_tools = EXPECTED[fmt]
    out = tmp_path / "logs"
    result = runner.invoke(app, ["import", "--format", fmt, str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"imported {n_calls} calls" in result.output
    con = connect(tmp_path / "store.duckdb")
    report = ingest(con, [out])
    assert (report.loaded, report.quarantined) == (n_calls, 0)
    assert con.execute("SELECT count(*) FROM tool_calls WHERE timing_source = 'explicit'").fetchone()[0] == n_tools
    # a second import of the same sources rewrites identical files: nothing new for the store
    runner.invoke(app, ["import", "--format", fmt, str(src), "--out", str(out)])
    assert ingest(con, [out]).loaded == 0


def test_convert_to_folder_counts_records(tmp_path):
    n = convert_to_folder("otel", [FIXTURES / "otel" / "agent_traces.jsonl"], tmp_path / "o")
    assert n == 5
    assert [p.name for p in (tmp_path / "o").iterdir()] == ["agent_traces.jsonl"]


def test_strict_mode_stops_with_file_and_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = (FIXTURES / "otel" / "agent_traces.jsonl").read_text().splitlines()[0]
    bad.write_text(good + "\n{oops\n")
    lenient = runner.invoke(app, ["import", "-f", "otel", str(bad), "-o", str(tmp_path / "a")])
    assert lenient.exit_code == 0 and "1 problems skipped" in lenient.output
    strict = runner.invoke(app, ["import", "-f", "otel", str(bad), "-o", str(tmp_path / "b"), "--strict"])
    assert strict.exit_code == 2
    assert f"{bad}:2: not valid JSON" in strict.output


def test_console_script_help_lists_import():
    script = Path(sys.executable).parent / "profiler"
    out = subprocess.run([str(script), "import", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--format" in out.stdout and "swe-agent" in out.stdout
