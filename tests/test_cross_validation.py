"""`profiler eval --cv K`: folds by workflow, a real fit and eval per fold, generic aggregation;
and the ours-vs-baselines table with keys missing."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from scoring.baseline_table import ROWS, baseline_rows, baseline_table
from profiler.cli import app
from scoring.cross_validation import aggregate, cross_validate, nest, numeric_leaves
from store.split import write_folds

REPO = Path(__file__).resolve().parents[1]
AGENTLESS = REPO / "datasets" / "real" / "agentless_pr28.jsonl"


def workflows(path: Path) -> set[str]:
    return {json.loads(line)["workflow_id"] for line in path.read_text().splitlines() if line.strip()}


def test_folds_partition_workflows(tmp_path):
    counts = write_folds([AGENTLESS], tmp_path, k=4, seed=1)
    every = workflows(AGENTLESS)
    tests = [workflows(tmp_path / f"fold{i}" / "test" / "logs.jsonl") for i in range(4)]
    assert set().union(*tests) == every and sum(map(len, tests)) == len(every)  # disjoint, complete
    assert max(map(len, tests)) - min(map(len, tests)) <= 1  # balanced
    for i, test in enumerate(tests):
        train = workflows(tmp_path / f"fold{i}" / "train" / "logs.jsonl")
        assert not train & test and train | test == every
        assert counts[i]["test_workflows"] == len(test) and counts[i]["train_workflows"] == len(train)
    again = write_folds([AGENTLESS], tmp_path / "again", k=4, seed=1)
    assert again == counts
    other = write_folds([AGENTLESS], tmp_path / "other", k=4, seed=2)
    assert workflows(tmp_path / "other" / "fold0" / "test" / "logs.jsonl") != tests[0]
    assert [c["test_workflows"] for c in other] == [c["test_workflows"] for c in counts]


def task(wf: str) -> str:
    return wf.split("/")[-1]


def test_grouped_folds_keep_every_trial_of_a_task_in_one_fold(tmp_path):
    # agentless: 85 workflows, 50 instances; 35 instances were both localized and repaired
    every = workflows(AGENTLESS)
    write_folds([AGENTLESS], tmp_path / "p", k=5)
    plain = [workflows(tmp_path / "p" / f"fold{i}" / "test" / "logs.jsonl") for i in range(5)]
    assert any(len({task(w) for w in f} & {task(w) for w in g}) for f in plain for g in plain if f is not g)
    counts = write_folds([AGENTLESS], tmp_path / "g", k=5, group_by="workflow_id", group_pattern="[^/]+$")
    tests = [workflows(tmp_path / "g" / f"fold{i}" / "test" / "logs.jsonl") for i in range(5)]
    assert set().union(*tests) == every and sum(map(len, tests)) == len(every)
    tasks = [{task(w) for w in t} for t in tests]
    assert all(not a & b for i, a in enumerate(tasks) for b in tasks[i + 1:])   # no task on two folds
    assert sum(len(t) for t in tasks) == len({task(w) for w in every})          # 50 groups dealt
    assert max(map(len, tasks)) - min(map(len, tasks)) <= 1
    assert [c["test_workflows"] for c in counts] == list(map(len, tests))
    # a field no record has: every workflow its own group, the same folds as plain CV
    write_folds([AGENTLESS], tmp_path / "n", k=5, group_by="no_such_field")
    assert [workflows(tmp_path / "n" / f"fold{i}" / "test" / "logs.jsonl") for i in range(5)] == plain
    with pytest.raises(ValueError, match="group-by takes a field name"):
        write_folds([AGENTLESS], tmp_path / "e", k=5, group_by="a;drop")
    with pytest.raises(ValueError, match="not a regular expression"):
        write_folds([AGENTLESS], tmp_path / "e", k=5, group_by="workflow_id", group_pattern="(")
    with pytest.raises(ValueError, match="2 group.*fewer than the 5 folds.*--cv 2"):   # the two types
        write_folds([AGENTLESS], tmp_path / "e", k=5, group_by="workflow_id", group_pattern="^agentless_[a-z]")


def test_time_split_trains_on_the_past(tmp_path):
    from store.split import split_logs
    counts = split_logs([AGENTLESS], tmp_path, train=0.7, order="time")
    recs = {side: [json.loads(x) for x in (tmp_path / side / "logs.jsonl").read_text().splitlines()]
            for side in ("train", "test")}
    start: dict = {}
    for side, rows in recs.items():
        for r in rows:
            key = (r["workflow_type_id"], side)
            wf = start.setdefault(key, {})
            wf[r["workflow_id"]] = min(wf.get(r["workflow_id"], 1e30), float(r["t_arrival"]))
    for wt, n_train in (("agentless_localize", 35), ("agentless_repair", 25)):   # 70 % of 50 and of 35
        # per type: the type's earliest workflows train (localize all ran before repair)
        assert max(start[wt, "train"].values()) <= min(start[wt, "test"].values())
        assert len(start[wt, "train"]) == n_train
    assert counts["test"] == len(recs["test"])
    with pytest.raises(ValueError, match="'hash' or 'time'"):
        split_logs([AGENTLESS], tmp_path, order="random")


def test_clear_errors(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text(AGENTLESS.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="1 workflow.*at least 2"):
        write_folds([one], tmp_path / "f", k=2)
    with pytest.raises(ValueError, match="85 workflow.*fewer than the 90 folds.*--cv 85"):
        write_folds([AGENTLESS], tmp_path / "f", k=90)
    with pytest.raises(ValueError, match="K >= 2"):
        write_folds([AGENTLESS], tmp_path / "f", k=1)


def test_aggregate_is_generic_and_weighted():
    folds = [
        {"calls": 10, "output_len": {"coverage": 1.0, "level": "global", "per_agent": {"a": {"calls": 1, "coverage": 0.0}}},
         "keep_alive": {"idle_gap_coverage": 0.5, "n": 4}, "regexes": ["x"], "flag": True, "missing": None},
        {"calls": 30, "output_len": {"coverage": 0.8, "level": "x", "per_agent": {"a": {"calls": 3, "coverage": 1.0}}},
         "keep_alive": {"idle_gap_coverage": 1.0, "n": 12}},
    ]
    s = aggregate(folds)
    assert set(s) == {"calls", "output_len.coverage", "output_len.per_agent.a.calls",
                      "output_len.per_agent.a.coverage", "keep_alive.idle_gap_coverage", "keep_alive.n"}
    cov = s["output_len.coverage"]
    assert cov["mean"] == pytest.approx(0.9) and cov["weighted_mean"] == pytest.approx((10 + 24) / 40)
    assert cov["std"] == pytest.approx(np.std([1.0, 0.8], ddof=1)) and (cov["min"], cov["max"], cov["folds"]) == (0.8, 1.0, 2)
    assert s["output_len.per_agent.a.coverage"]["weighted_mean"] == pytest.approx(3 / 4)  # its own calls
    assert s["keep_alive.idle_gap_coverage"]["weighted_mean"] == pytest.approx((2 + 12) / 16)  # its own n
    assert nest({"a.b": 1, "a.c.d": 2, "e": 3}) == {"a": {"b": 1, "c": {"d": 2}}, "e": 3}
    assert numeric_leaves({"x": float("nan"), "y": 2}, 1.0) == {"y": (2.0, 1.0)}


@pytest.mark.slow
def test_cross_validate_end_to_end_with_real_fit():
    r = cross_validate([AGENTLESS], 3, seed=0)
    assert r["k"] == 3 and len(r["folds"]) == 3 and r["workflows"] == 85 and r["calls"] == 227
    calls = np.array([f["result"]["calls"] for f in r["folds"]], float)
    cov = np.array([f["result"]["output_len"]["coverage"] for f in r["folds"]])
    s = r["summary"]["output_len.coverage"]
    assert s["folds"] == 3 and s["min"] <= s["mean"] <= s["max"]
    assert s["weighted_mean"] == pytest.approx(np.sum(cov * calls) / calls.sum())  # pooled over calls
    assert r["mean"]["output_len"]["coverage"] == pytest.approx(s["weighted_mean"])
    for f in r["folds"]:  # each fold's profile was fit without the fold's workflows
        assert f["result"]["workflows"] == f["test_workflows"]
        assert f["train_workflows"] + f["test_workflows"] == 85
    assert "next_agent.top1_accuracy" in r["summary"]  # keys from extensions are aggregated too


runner = CliRunner()


@pytest.mark.slow
def test_cli_cv_json_table_and_errors(tmp_path):
    small = tmp_path / "small.jsonl"  # the first 30 workflows: keeps the two CLI runs fast
    keep = sorted(workflows(AGENTLESS))[:30]
    small.write_text("".join(line + "\n" for line in AGENTLESS.read_text().splitlines()
                             if json.loads(line)["workflow_id"] in keep))
    res = runner.invoke(app, ["eval", "--cv", "2", "--json", "--group-by", "workflow_id", "--group-pattern", "[^/]+$",
                              str(small)])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert len(out["folds"]) == 2 and out["summary"]["output_len.coverage"]["folds"] == 2
    assert out["workflows"] == 30 and (out["group_by"], out["group_pattern"]) == ("workflow_id", "[^/]+$")
    res = runner.invoke(app, ["eval", "--group-by", "workflow_id", "--profile", "x", str(small)])
    assert res.exit_code == 2 and "add --cv K" in res.output
    res = runner.invoke(app, ["eval", "--cv", "2", "--group-pattern", "x", str(small)])
    assert res.exit_code == 2 and "needs --group-by" in res.output
    res = runner.invoke(app, ["eval", "--cv", "2", str(small)], terminal_width=200)
    assert res.exit_code == 0, res.output
    assert "ours vs baselines" in res.stdout and "markov_vo" in res.stdout and " ± " in res.stdout
    res = runner.invoke(app, ["eval", "--cv", "99", str(small)])
    assert res.exit_code == 2 and "fewer than the 99 folds" in res.output
    res = runner.invoke(app, ["eval", "--cv", "3", "--profile", "x", str(small)])
    assert res.exit_code == 2 and "drop --profile" in res.output


def render(results: dict) -> str:
    console = Console(record=True, width=200)
    console.print(baseline_table(results))
    return console.export_text()


def test_table_renders_with_missing_keys():
    old = {"calls": 10, "output_len": {"coverage": 0.97, "mean_width": 6005.0, "nominal": 0.99,
                                       "global_band_width": 1742.0, "global_band_coverage": 0.981},
           "next_agent": {"top1_accuracy": 0.6}}
    rows = {(r["metric"], r["method"]): r for r in baseline_rows(old)}
    assert rows[("output-length mean width", "global")]["value"] == 1742.0
    assert rows[("output-length mean width", "per_agent_empirical")]["value"] is None
    assert rows[("next-agent top-1", "markov1")]["value"] is None
    text = render({"single": old})
    assert text.count("n/a") == sum(r["value"] is None for r in rows.values()) > 5
    assert "6,005" in text and "1,742" in text and "(nominal 0.99)" in text


def test_table_reads_issue_keys_in_both_forms():
    full = {
        "output_len": {"coverage": 0.99, "mean_width": 1500.0, "nominal": 0.99,
                       "baselines": {"global": {"coverage": 0.981, "mean_width": 1742.0},
                                     "per_agent_empirical": {"coverage": 0.98, "mean_width": 1490.0}}},
        "next_agent": {"top1_accuracy": 0.81, "log_loss": 0.7, "scored_share": 1.0,
                       "baselines": {"markov1": 0.63, "markov_vo": {"top1_accuracy": 0.80, "log_loss": 0.75}}},
        "remaining_calls": {"mae": 3.0, "baselines": {"position_median": 3.07}},
        "keep_alive": {"idle_gap_coverage": 0.93, "nominal": 0.95,
                       "baselines": {"idle_gap_p95": 0.92, "tool_p95": {"idle_gap_coverage": 0.74}}},
    }
    rows = baseline_rows(full)
    missing = [(r["metric"], r["method"]) for r in rows
               if r["value"] is None and not r["metric"].startswith(("remaining-tokens", "keep-alive mean TTL", "keep-alive KV-s"))
               and r["method"] not in ("nat_trie", "markov_wb")]  # not in this result
    assert missing == [("next-agent log-loss", "markov1")]  # given as a bare top-1 number
    assert len(rows) == len(ROWS)
    text = render({"a": full})
    assert "0.630" in text and "0.750" in text and "3.07" in text and "0.740" in text
    cv = {"folds": [{}, {}], "mean": full, "summary": {"next_agent.top1_accuracy": {"std": 0.02}}}
    text = render({"cv": cv, "split": full})
    assert "0.810 ± 0.020" in text


def test_records_without_workflow_id_are_named_and_strict_refuses_them(tmp_path):
    logs = tmp_path / "logs.jsonl"
    logs.write_text(AGENTLESS.read_text() + "not json\n" + json.dumps({"request_id": "x"}) + "\n")
    unassigned: list[str] = []
    counts = write_folds([logs], tmp_path / "f", k=3, unassigned=unassigned)
    assert unassigned == [f"{logs}:228", f"{logs}:229"]
    assert sum(c["test_records"] for c in counts) == 227  # every other record held out once
    with pytest.raises(ValueError, match=r"2 record\(s\) without a readable workflow_id.*logs.jsonl:228"):
        cross_validate([logs], 3, strict=True)
