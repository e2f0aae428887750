"""`profiler eval` prints readable lines, never raw Python dicts (the JSON is `--json`)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from profiler.commands.evaluate import readable_lines, score_rows


def test_readable_lines_nest_and_format():
    lines = readable_lines("next_agent", {"top1_accuracy": 0.81395, "n": 1290,
                                          "baselines": {"markov1": 0.78294, "markov_vo": float("nan")}})
    assert lines == ["next_agent:", "  top1_accuracy 0.814, n 1,290",
                     "  baselines: markov1 0.783, markov_vo n/a"]
    assert readable_lines("path", {"regex_acceptance": 1.0, "known": True}) == \
        ["path: regex_acceptance 1.000, known true"]
    assert readable_lines("empty", {}) == ["empty: (none)"]


def test_score_rows_name_each_section_path():
    rows = score_rows({"keep_alive": {"idle_gap_coverage": 0.97531, "baselines": {"tool_p95": 1.0}},
                       "path": {"regex_acceptance": 1.0}})
    assert rows == [("keep_alive", "idle_gap_coverage", "0.975"), ("keep_alive / baselines", "tool_p95", "1.000"),
                    ("path", "regex_acceptance", "1.000")]


@pytest.mark.slow
def test_eval_table_fits_80_columns(tmp_path):
    import os

    env = {**os.environ, "COLUMNS": "80"}
    run = lambda *a: subprocess.run([sys.executable, "-m", "profiler", *a], cwd=tmp_path, env=env,  # noqa: E731
                                    capture_output=True, text=True, check=True)
    run("generate", "--workload", "coding-assistant", "--workflows", "30", "--out", "l.jsonl")
    run("split", "l.jsonl", "--out", "s")
    run("fit", "s/train", "--out", "p")
    for args in (("eval", "--profile", "p", "s/test"), ("show", "--profile", "p"),
                 ("show", "--profile", "p", "--full"),
                 ("simulate", "--workload", "coding-assistant", "--workflows", "12", "--load", "peak")):
        out = run(*args).stdout
        assert max(len(line) for line in out.splitlines()) <= 80, (args, out)
        assert "…" not in out, (args, out)  # folded, not squeezed to ellipses
    assert "scores by section" in run("eval", "--profile", "p", "s/test").stdout


@pytest.mark.slow
def test_eval_prints_no_python_dicts(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "profiler", *a], cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, check=True)
    run("generate", "--workload", "coding-assistant", "--workflows", "30", "--out", "l.jsonl")
    run("split", "l.jsonl", "--out", "s")
    run("fit", "s/train", "--out", "p")
    text = run("eval", "--profile", "p", "s/test").stdout
    assert "next_agent" in text and "scores by section" in text and "ours vs baselines" in text
    assert "{'" not in text and "': " not in text, text
    assert json.loads(run("eval", "--profile", "p", "s/test", "--json").stdout)["next_agent"]["top1_accuracy"] >= 0
