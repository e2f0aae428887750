"""`profiler fit` refuses a second, different log in an existing profile root unless --append
(issue 26 item 7: a second split fitted into one --out merged silently, leaking test workflows)."""
from __future__ import annotations

import json

import duckdb
import pytest
from typer.testing import CliRunner

from profiler.cli import app
from store.log_sources import SOURCES_FILE, DifferentLogError, check_sources
from store.workloads import generate, write_jsonl


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """Two splits of one log (different seeds: their training sides share workflows)."""
    root = tmp_path_factory.mktemp("splits")
    write_jsonl(generate("coding_assistant", 20, seed=0), root / "logs.jsonl")
    runner = CliRunner()
    for name, seed in (("a", "0"), ("b", "1")):
        r = runner.invoke(app, ["split", str(root / "logs.jsonl"), "--out", str(root / name), "--seed", seed])
        assert r.exit_code == 0, r.output
    return root


def fit(*args: str):
    return CliRunner().invoke(app, ["fit", *args, "-q"])


def workflows(root) -> set:
    con = duckdb.connect(str(root / "store.duckdb"), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT DISTINCT workflow_id FROM calls").fetchall()}
    finally:
        con.close()


@pytest.mark.slow
def test_a_second_split_is_refused_in_one_line_and_append_adds_it(splits, tmp_path):
    out = tmp_path / "p"
    assert fit(str(splits / "a" / "train"), "--out", str(out)).exit_code == 0
    before = workflows(out)
    assert fit(str(splits / "a" / "train"), "--out", str(out)).exit_code == 0          # same log again
    assert fit(str(splits / "a" / "train" / "logs.jsonl"), "--out", str(out)).exit_code == 0  # inside it
    r = fit(str(splits / "b" / "train"), "--out", str(out))
    assert r.exit_code == 2
    line = " ".join(r.output.split())
    assert "is a different log" in line and "--append" in line and r.output.count("error:") == 1
    assert workflows(out) == before                                # nothing was ingested
    r = fit(str(splits / "a"), "--out", str(out))                  # a folder holding the test side too
    assert r.exit_code == 2 and "different log" in r.output
    assert fit(str(splits / "b" / "train"), "--out", str(out), "--append").exit_code == 0
    assert workflows(out) > before
    recorded = json.loads((out / SOURCES_FILE).read_text())["sources"]
    assert recorded == [str(splits / "a" / "train"), str(splits / "b" / "train")]
    assert fit(str(splits / "b" / "train"), "--out", str(out)).exit_code == 0          # now a known source


def test_a_root_written_before_sources_json_is_judged_by_its_store(tmp_path):
    """A legacy root: the files its store ingested (and their folders) stand for its sources."""
    db = tmp_path / "p" / "store.duckdb"
    db.parent.mkdir()
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE ingested_files (path VARCHAR, sha256 VARCHAR)")
    con.execute("INSERT INTO ingested_files VALUES (?, 'x')", [str(tmp_path / "logs" / "a.jsonl")])
    con.close()
    assert check_sources(tmp_path / "p", db, [tmp_path / "logs"])          # the same folder again
    with pytest.raises(DifferentLogError, match="different log"):
        check_sources(tmp_path / "p", db, [tmp_path / "other"])
    assert check_sources(tmp_path / "p", db, [tmp_path / "other"], append=True)[-1] == tmp_path / "other"
    assert check_sources(tmp_path / "fresh", tmp_path / "fresh" / "store.duckdb", [tmp_path / "x"]) == [tmp_path / "x"]


def test_the_refusal_says_exactly_what_to_type_and_that_command_runs(splits, tmp_path):
    """The guard's message carries a whole command (a new root beside --out, named after the
    different log) and typing it fits the log (issue 35: the README's second fit met this guard)."""
    import re
    import shlex

    out = tmp_path / "profile"
    assert fit(str(splits / "a" / "train"), "--out", str(out)).exit_code == 0
    r = fit(str(splits / "b" / "train"), "--out", str(out))
    assert r.exit_code == 2
    typed = re.search(r"type `([^`]+)`, or the same command with --append", " ".join(r.output.split()))
    assert typed, r.output
    argv = shlex.split(typed.group(1))
    assert argv[:2] == ["profiler", "fit"] and argv[-1] == f"{tmp_path / 'profile-train'}/"
    assert fit(*argv[2:]).exit_code == 0
    assert workflows(tmp_path / "profile-train") not in (set(), workflows(out))   # split b alone, own root
