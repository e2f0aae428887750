"""`profiler simulate` end to end on small workloads (generated and a log folder)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app

DATA = Path(__file__).resolve().parents[1] / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"
REQUIRED = {"avg_jct_s", "p95_jct_s", "throughput_tok_s", "recomputed_prefill_tokens", "preemptions"}

runner = CliRunner()


def invoke(*args: str, env: dict | None = None):
    res = runner.invoke(app, ["simulate", *args], env=env)
    assert res.exit_code == 0, res.output
    return res


@pytest.mark.slow
def test_generated_workload_json_table_and_plot(tmp_path):
    plot = tmp_path / "jct.png"
    res = invoke("--workload", "coding-assistant", "--load", "low,peak", "--workflows", "16",
                 "--replicas", "1", "--kv-capacity-tokens", "60000",
                 "--policies", "sglang-default,continuum-ttl,belady,ours", "--json",
                 "--plot", str(plot), "--profile", str(tmp_path / "prof"),
                 env={"PROFILER_SIMULATE_TRAIN_WORKFLOWS": "40"})   # a config key
    out = json.loads(res.stdout)
    assert set(out["policies"]) == {"sglang-default", "continuum-ttl", "belady", "ours"}
    for row in out["policies"].values():
        assert REQUIRED <= set(row)
        assert row["avg_jct_s"] > 0 and row["throughput_tok_s"] > 0
    assert out["policies"]["belady"]["recompute_vs_belady"] == 1.0
    assert set(out["loads"]) == {"low", "peak"}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the profile was fit on the train side, in the folder of that split (reused by a next run)
    assert len(list((tmp_path / "prof").glob("split-*/profile/CURRENT"))) == 1


@pytest.mark.slow
def test_log_folder_replay_prints_tables(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    shutil.copy(DATA, logs / "swe.jsonl")
    md = tmp_path / "t.md"
    res = invoke("--workload", str(logs), "--load", "medium", "--workflows", "12",
                 "--replicas", "2", "--policies", "sglang-default,autellix-plas,ours",
                 "--markdown", str(md))
    assert "sglang-default" in res.stdout and "autellix-plas" in res.stdout
    assert "| ours |" in md.read_text()


def test_bad_arguments_are_clear_errors():
    res = runner.invoke(app, ["simulate", "--workload", "coding-assistant", "--policies", "fifo"])
    assert res.exit_code == 2 and "unknown policy 'fifo'" in res.output
    res = runner.invoke(app, ["simulate", "--workload", "no/such/folder"])
    assert res.exit_code == 2 and "no such log file or folder" in res.output
    res = runner.invoke(app, ["simulate", "--workload", "coding-assistant", "--load", "huge"])
    assert res.exit_code == 2 and "--load" in res.output
