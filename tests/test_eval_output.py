"""`profiler eval` prints readable lines, never raw Python dicts (the JSON is `--json`)."""
from __future__ import annotations

import json
import subprocess
import sys

from profiler.commands.evaluate import readable_lines


def test_readable_lines_nest_and_format():
    lines = readable_lines("next_agent", {"top1_accuracy": 0.81395, "n": 1290,
                                          "baselines": {"markov1": 0.78294, "markov_vo": float("nan")}})
    assert lines == ["next_agent:", "  top1_accuracy 0.814, n 1,290",
                     "  baselines: markov1 0.783, markov_vo n/a"]
    assert readable_lines("path", {"regex_acceptance": 1.0, "known": True}) == \
        ["path: regex_acceptance 1.000, known true"]
    assert readable_lines("empty", {}) == ["empty: (none)"]


def test_eval_prints_no_python_dicts(tmp_path):
    run = lambda *a: subprocess.run([sys.executable, "-m", "profiler", *a], cwd=tmp_path,  # noqa: E731
                                    capture_output=True, text=True, check=True)
    run("generate", "--workload", "coding-assistant", "--workflows", "30", "--out", "l.jsonl")
    run("split", "l.jsonl", "--out", "s")
    run("fit", "s/train", "--out", "p")
    text = run("eval", "--profile", "p", "s/test").stdout
    assert "next_agent:" in text and "ours vs baselines" in text
    assert "{'" not in text and "': " not in text, text
    assert json.loads(run("eval", "--profile", "p", "s/test", "--json").stdout)["next_agent"]["top1_accuracy"] >= 0
