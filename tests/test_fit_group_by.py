"""`profiler fit --group-by FIELD [--group-pattern RE]`: the fit's own selection CVs (remaining
work, output-length bands) keep a task's workflows in one fold, as `profiler eval --cv K
--group-by` does for the evaluation folds. Agentless runs each SWE-bench instance twice (localize,
then repair, two workflow types): grouped by instance, both land in one fold."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from fitting.profile_fit import ok_calls
from predictors.output_length import OutputLengthIntervals
from predictors.remaining_tokens import RemainingTokens
from profiler.cli import app
from store import ingest as ingest_mod
from store.duckdb_store import connect

ROOT = Path(__file__).resolve().parents[1]
AGENTLESS = ROOT / "datasets" / "real" / "agentless_pr28.jsonl"


@pytest.fixture(scope="module")
def con():
    c = connect(None)
    ingest_mod.ingest(c, [AGENTLESS])
    yield c
    c.close()


def test_calls_carry_their_group_and_a_call_without_one_is_its_own_workflow(con):
    assert "group_id" not in ok_calls(con)                       # default: nothing added
    calls = ok_calls(con, "workflow_id", "[^/]+$")
    instance = calls["workflow_id"].str.split("/").str[-1]
    assert (calls["group_id"] == instance).all()
    per_group = calls.groupby("group_id")["workflow_type_id"].nunique()
    assert (per_group == 2).sum() >= 10                         # localize and repair of one instance
    missing = ok_calls(con, "no_such_field")
    assert (missing["group_id"] == "workflow:" + missing["workflow_type_id"] + "/" + missing["workflow_id"]).all()


def test_band_folds_keep_a_group_together_across_types(con):
    calls = ok_calls(con, "workflow_id", "[^/]+$")
    _, fold = OutputLengthIntervals(n_folds=5)._lengths_and_folds(calls)
    assert (pd.Series(fold).groupby(calls["group_id"].to_numpy()).nunique() == 1).all()
    _, by_workflow = OutputLengthIntervals(n_folds=5)._lengths_and_folds(calls.drop(columns="group_id"))
    assert (pd.Series(by_workflow).groupby(calls["group_id"].to_numpy()).nunique() > 1).any()


def test_remaining_selection_counts_groups_not_workflows():
    rng = np.random.default_rng(0)
    rows = [{"workflow_type_id": "t", "workflow_id": f"w{k}", "agent_id": "a",
             "output_tokens": int(rng.integers(50, 500)), "group_id": f"task{k % 4}"}
            for k in range(40) for _ in range(int(rng.integers(2, 12)))]
    calls = pd.DataFrame(rows)
    grouped = RemainingTokens(cv_folds=5).fit(calls)
    assert grouped.selection_["t"]["reason"] == "4 groups of workflows: too few to validate"
    assert "best" in RemainingTokens(cv_folds=5).fit(calls.drop(columns="group_id")).selection_["t"]


def test_cli_records_the_grouping_and_refuses_bad_options(tmp_path):
    runner = CliRunner()
    bad = runner.invoke(app, ["fit", str(AGENTLESS), "--out", str(tmp_path / "x"), "--group-pattern", "[^/]+$", "-q"])
    assert bad.exit_code == 2 and "--group-pattern needs --group-by FIELD" in bad.output
    bad = runner.invoke(app, ["fit", str(AGENTLESS), "--out", str(tmp_path / "x"), "--group-by", "workflow_id",
                              "--group-pattern", "(", "-q"])
    assert bad.exit_code == 2 and "is not a regular expression" in bad.output
    ok = runner.invoke(app, ["fit", str(AGENTLESS), "--out", str(tmp_path / "p"), "--group-by", "workflow_id",
                             "--group-pattern", "[^/]+$", "--json", "-q"])
    assert ok.exit_code == 0, ok.output
    options = json.loads(ok.output[ok.output.index("{"):])["options"]
    assert options["group_by"] == "workflow_id" and options["group_pattern"] == "[^/]+$"
