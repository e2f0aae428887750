"""Profile artifact (versioned, atomic) and the fit → show → eval command path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from store import profile_artifact as pa
from tests.conftest import SWE_TRACES


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "profiler", *args], capture_output=True, text=True)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version_is_content_hash_and_current_switches(tmp_path):
    p1 = pa.write_profile(tmp_path, {"x": 1}, {"sources": []})
    p2 = pa.write_profile(tmp_path, {"x": 2}, {"sources": []})
    assert p1.version != p2.version and pa.current_version(tmp_path) == p2.version
    assert pa.write_profile(tmp_path, {"x": 1}, {}).version == p1.version
    assert pa.load_profile(tmp_path).data["x"] == 1
    assert pa.load_profile(tmp_path / "versions" / p2.version).data["x"] == 2


def test_crash_mid_write_leaves_old_profile_intact(tmp_path, monkeypatch):
    old = pa.write_profile(tmp_path, {"x": 1}, {})
    real_replace = os.replace

    def crash(src, dst):
        if str(dst).endswith("CURRENT") or "versions" in str(dst):
            raise OSError("disk full")
        return real_replace(src, dst)
    monkeypatch.setattr(pa.os, "replace", crash)
    with pytest.raises(OSError):
        pa.write_profile(tmp_path, {"x": 99}, {})
    monkeypatch.setattr(pa.os, "replace", real_replace)
    loaded = pa.load_profile(tmp_path)
    assert loaded.version == old.version and loaded.data["x"] == 1
    assert not [p for p in (tmp_path / "versions").iterdir() if p.name.startswith(".tmp")]


def test_not_a_profile_is_a_clear_error(tmp_path):
    with pytest.raises(pa.ProfileError, match="profiler fit"):
        pa.load_profile(tmp_path)


def test_fitted_profile_has_every_section(fitted_profile):
    prof = pa.load_profile(fitted_profile)
    d = prof.data
    assert set(d) >= {"output_length", "tool_latency", "agents", "workflow_types"}
    assert d["workflow_types"]["coding_assistant"]["workflows"] == 120
    assert d["agents"]["coding_assistant"]["engineer"]["tools"]["edit_file"] > 0
    assert d["tool_latency"]["workflow_types"]["coding_assistant"]["run_tests"]["p50_s"] == pytest.approx(4.0, rel=0.25)
    assert prof.manifest["sources"][0]["rows"] == prof.manifest["counts"]["calls"]
    assert (fitted_profile / "store.duckdb").exists()


@pytest.mark.slow
def test_cli_fit_show_eval_json(tmp_path, coding_logs, coding_test_logs):
    out = tmp_path / "p"
    run("fit", str(coding_logs), "--out", str(out), "-q")
    shown = run("show", "--profile", str(out), "--full").stdout    # agents and tools: --full
    assert "engineer" in shown and "run_tests" in shown
    res = json.loads(run("eval", "--profile", str(out), str(coding_test_logs), "--json").stdout)
    assert res["calls"] > 500 and res["workflows"] == 60
    ol = res["output_len"]
    assert set(ol) >= {"nominal", "coverage", "mean_width", "global_band_width", "per_agent"}
    assert ol["coverage"] > 0.95 and ol["mean_width"] < ol["global_band_width"]
    tl = res["tool_latency"]
    assert set(tl) >= {"p95_coverage", "ks_max", "per_tool"} and 0.85 < tl["p95_coverage"] <= 1.0


@pytest.mark.slow
def test_cli_generate_split_fit_on_real_traces(tmp_path):
    split = tmp_path / "split"
    run("split", str(SWE_TRACES), "--out", str(split), "--train", "0.7")
    train = sum(1 for _ in open(split / "train" / "logs.jsonl"))
    test = sum(1 for _ in open(split / "test" / "logs.jsonl"))
    assert train + test == 3037 and 0.55 < train / 3037 < 0.85
    wf_train = {json.loads(l)["workflow_id"] for l in open(split / "train" / "logs.jsonl")}
    wf_test = {json.loads(l)["workflow_id"] for l in open(split / "test" / "logs.jsonl")}
    assert not wf_train & wf_test
    gen = tmp_path / "gen.jsonl"
    run("generate", "--workload", "deep-research", "--calls", "300", "--out", str(gen))
    lines = [json.loads(l) for l in open(gen)]
    assert len(lines) >= 300 and len({r["workflow_id"] for r in lines}) < len(lines)


@pytest.mark.slow
def test_cli_errors_are_clear(tmp_path):
    proc = run("show", "--profile", str(tmp_path), check=False)
    assert proc.returncode == 2 and "not a profile" in proc.stderr
    proc = run("generate", "--workload", "nope", "--out", str(tmp_path / "x.jsonl"), check=False)
    assert proc.returncode == 2 and "unknown workload" in proc.stderr


@pytest.mark.slow
def test_cli_fit_reads_other_trace_formats(tmp_path):
    fixtures = Path(__file__).parent / "fixtures" / "importers" / "otel"
    out = tmp_path / "p"
    run("fit", str(fixtures), "--format", "otel", "--out", str(out), "-q")
    prof = pa.load_profile(out)
    assert prof.manifest["counts"]["calls"] > 0
    assert all("imported/otel" in s["path"] for s in prof.manifest["sources"])
    bad = run("fit", str(fixtures), "--format", "nope", "--out", str(out), check=False)
    assert bad.returncode == 2 and "unknown import format" in bad.stderr


def test_split_reads_the_workflow_id_wherever_ingest_does(tmp_path):
    """Every placement of app_metadata the ingester accepts decides the side (record level too)."""
    from store.split import split_logs
    from tests.conftest import write_jsonl

    placements = (lambda m: {"request": {"extra_body": {"app_metadata": m}}},
                  lambda m: {"request": {"app_metadata": m}},
                  lambda m: {"request": {}, "app_metadata": m})
    recs = [{"request_id": f"{i}-{k}", "t_arrival": 10.0 + k, "t_finish": 11.0 + k, "response": {},
             **placements[i % 3]({"workflow_type_id": "app", "workflow_id": f"s-{i}", "agent_id": "a"})}
            for i in range(60) for k in range(2)]
    split_logs([write_jsonl(tmp_path / "gw.jsonl", recs)], tmp_path / "split", train=0.5)
    side_of: dict[str, set[str]] = {}
    for side in ("train", "test"):
        for line in open(tmp_path / "split" / side / "logs.jsonl"):
            side_of.setdefault(json.loads(line)["request_id"].split("-")[0], set()).add(side)
    assert len(side_of) == 60 and all(len(s) == 1 for s in side_of.values())
    for p in range(3):  # each placement is split, none stuck on the train side
        assert {next(iter(side_of[str(i)])) for i in range(p, 60, 3)} == {"train", "test"}


def test_help_shows_no_type_placeholder_on_flags():
    """Issue 24: every flag (``--json``, ``--help``) showed ``<bool>`` although it takes no value;
    options that take one keep their type (``<path>``)."""
    import typer
    from typer.testing import CliRunner

    from profiler.cli import app

    group = typer.main.get_command(app)
    names = group.list_commands(group.make_context("profiler", ["--help"], resilient_parsing=True))
    assert len(names) >= 10
    runner = CliRunner()
    for args in ([], *([name] for name in names)):
        result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0, (args, result.output)
        assert "<bool>" not in result.output, args
        assert "--help" in result.output
    assert "<path>" in runner.invoke(app, ["split", "--help"], env={"COLUMNS": "200"}).output


def test_fit_on_all_invalid_input_says_why_and_leaves_nothing_behind(tmp_path):
    """Issue 24: every record refused used to print only "no valid calls" and leave a store
    behind; now the first reasons are printed, exit 2, and the run's folder is gone. An existing
    profile root is never removed."""
    logs = tmp_path / "bad.jsonl"
    logs.write_text('{"workflow_type_id": "a", "workflow_id": "w", "agent_id": "x", "request_id": "r1"}\n'
                    '{"foo": 1}\n')
    out = tmp_path / "profile"
    proc = run("fit", str(logs), "--out", str(out), check=False)
    assert proc.returncode == 2, proc.stderr
    assert "no valid call to fit on" in proc.stderr and "nothing was written" in proc.stderr
    assert f"{logs}:1: " in proc.stderr and f"{logs}:2: " in proc.stderr  # the reasons, per record
    assert "Traceback" not in proc.stderr
    assert not out.exists()
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    proc = run("fit", str(logs), "--out", str(out), check=False)
    assert proc.returncode == 2 and f"{logs}:1: " in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]      # the store it made is gone
