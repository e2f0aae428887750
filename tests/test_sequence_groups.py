"""`profiler fit --group-by`: the next-agent order/context selection and the remaining-work
selection deal whole groups (tasks) to their folds. A log where every task runs several
identical trials is the case that tells them apart: folded by workflow, a held-out trial's
exact path sits in training and rewards the longest context; folded by task it does not."""
from __future__ import annotations

import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from typer.testing import CliRunner

from profiler.cli import app
from store.split import call_group_sql
from synth.sequence_select import group_fold_counts, select_models, subsample_groups
from synth.sequences import load_sequence_counts, load_sequence_groups

AGENTS = ("a", "b", "c")


def task_paths(n_tasks: int = 15, length: int = 8, seed: int = 0) -> list[tuple[str, ...]]:
    """One random agent path per task (no structure shared between tasks; kept short: the
    automaton of many long random paths is slow to synthesize)."""
    rng = np.random.default_rng(seed)
    return [tuple(rng.choice(AGENTS, size=length)) for _ in range(n_tasks)]


def test_group_folds_deal_whole_groups_and_keep_every_workflow():
    groups = [{"t1": 3, "t2": 1}, {"t2": 2}, {"t3": 4}, {"t1": 1, "t4": 2}]
    split = group_fold_counts(groups, folds=3, seed=1)
    assert split.sum(axis=1).tolist() == [4, 2, 4, 3]
    fold_of: dict[str, set[int]] = {}
    for j, m in enumerate(groups):
        for g in m:
            fold_of.setdefault(g, set()).update(np.flatnonzero(split[j]).tolist())
    # a path of one group lies in one fold; t1's and t2's paths share their group's fold
    assert all(np.count_nonzero(split[j]) == 1 for j in (1, 2))
    assert np.flatnonzero(split[1]).tolist()[0] in fold_of["t2"]
    sub = subsample_groups(groups, 6, seed=0)
    assert sum(sum(m.values()) for m in sub) == 6
    assert all(set(s) <= set(m) and all(s[g] <= m[g] for g in s) for s, m in zip(sub, groups))
    with pytest.raises(ValueError, match="groups must split"):
        select_models([("a",)], [2], groups=[{"t": 1}])


def test_grouped_folds_stop_repeated_trials_leaking_into_the_order_choice():
    paths = task_paths()
    counts = [4] * len(paths)                       # four identical trials per task
    groups = [{f"task{t}": 4} for t in range(len(paths))]
    leaky = select_models(paths, counts, folds=3)["next"]
    grouped = select_models(paths, counts, folds=3, groups=groups)
    held_out = grouped["next"]
    # by workflow the held-out trial's path is in training: a long context looks near-perfect
    assert leaky["max_order"] >= 6 and leaky["validation_log_loss"] < 0.5
    # by task the paths are new: nothing beyond a short context, and the loss says so
    assert held_out["max_order"] < leaky["max_order"]
    assert held_out["validation_log_loss"] > 1.0 > 2 * leaky["validation_log_loss"]
    assert held_out["validation_top1"] < leaky["validation_top1"] - 0.3
    assert grouped["groups"] == len(paths)
    few = select_models(paths[:2], [4, 4], folds=3, groups=groups[:2])
    assert few["next"]["reason"] == "2 groups of workflows: too few to cross-validate"


def write_log(path: Path, paths: list[tuple[str, ...]], trials: int) -> None:
    """Flat records (log format): every task ``task{t}`` run ``trials`` times, each trial one
    workflow taking the task's path; the task id is the record field ``task``."""
    with path.open("w") as f:
        t = 1.7e9
        for k, agents in enumerate(paths):
            for r in range(trials):
                wf = f"task{k}-trial{r}"
                for i, agent in enumerate(agents):
                    f.write(json.dumps({
                        "request_id": f"{wf}#{i}", "workflow_type_id": "app", "workflow_id": wf,
                        "agent_id": agent, "t_arrival": t, "t_finish": t + 1.0,
                        "input_tokens": 100 + i, "output_tokens": 20 + 3 * i,
                        "task": f"task{k}"}) + "\n")
                    t += 2.0


def test_store_sequences_carry_their_groups(tmp_path):
    from store import ingest
    from store.duckdb_store import connect

    log = tmp_path / "trials.jsonl"
    write_log(log, task_paths(6, 5), trials=3)
    con = connect(None)
    ingest.ingest(con, [log])
    seqs, counts, groups = load_sequence_groups(con, call_group_sql("task"))["app"]
    plain = load_sequence_counts(con)["app"]
    assert (seqs, counts) == (plain[0], plain[1])
    assert groups == [{f"task{k}": 3} for k in range(6)]
    con.close()


def test_fit_group_by_keeps_a_tasks_trials_in_one_fold(tmp_path):
    log = tmp_path / "trials.jsonl"
    write_log(log, task_paths(), trials=4)
    runner = CliRunner()
    selections = {}
    for name, extra in (("plain", []), ("grouped", ["--group-by", "task"])):
        out = tmp_path / name
        res = runner.invoke(app, ["fit", str(log), "--out", str(out), "-q", *extra])
        assert res.exit_code == 0, res.output
        profile = json.loads(next(out.rglob("profile.json")).read_text())
        selections[name] = profile["workflows"]["app"]["sequence_model"]["selection"]
    plain, grouped = selections["plain"], selections["grouped"]
    assert "groups" not in plain and grouped["groups"] == 15
    assert grouped["validation_log_loss"] > 1.0 > 2 * plain["validation_log_loss"]
    assert grouped["max_order"] < plain["max_order"]
