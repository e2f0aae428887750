"""The keep-alive TTL checked forward in time against the pooled per-type quantile (issue 37 item 4).

Cross-validation by workflow shuffles time: an agent whose gaps grow over the log looks well
covered by its own entry in every fold, yet the entry fit on the past under-covers the future.
The fit now scores the chosen TTL and one pooled (unweighted, type-level) quantile at rolling
origins on the training side, and serves the pooled one where the chosen stays under nominal and
the pooled covers more beyond one standard error."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from fitting import profile_fit as fitting
from store import ingest
from store.duckdb_store import connect
from predictors.idle_gap import IdleGapModel
from store.workloads import generate, write_jsonl


def two_agents(n_wf: int, seed: int, grow: float, start: int = 0, total: int | None = None) -> pd.DataFrame:
    """Gap rows of a type with a fast agent (gaps ~0.5 s, growing ``grow``× over ``total``
    workflows) and a slow one (~30 s), alternating, seven gaps and an END per workflow."""
    rng = np.random.default_rng(seed)
    total = total or n_wf
    rows = []
    for i in range(n_wf):
        wf = start + i
        scale = 1 + (grow - 1) * wf / max(total - 1, 1)
        for k in range(8):
            fast = k % 2 == 0
            gap = (rng.lognormal(math.log(0.5 * scale if fast else 30.0), 0.3)) if k < 7 else np.nan
            rows.append({"workflow_type_id": "w", "workflow_id": f"t{wf:04d}", "agent_id": "fast" if fast else "slow",
                         "tool": "", "call_index": k, "t_arrival": wf * 86400.0 + k * 60, "gap_after_s": gap})
    return pd.DataFrame(rows)


def future_coverage(model: IdleGapModel, test: pd.DataFrame) -> tuple[float, float]:
    """(coverage, mean TTL) of the test gaps, TTLs held as the keep/drop policy holds them."""
    ttl = np.clip(model.predict_sessions(test), 0.5, 120.0)
    gap = test["gap_after_s"].to_numpy(dtype=float)
    has = ~np.isnan(gap)
    return float(np.mean(gap[has] <= ttl[has])), float(np.mean(ttl[has]))


def test_pooled_quantile_serves_where_the_agent_entry_fails_forward():
    train = two_agents(60, 0, grow=20.0, total=86)
    test = two_agents(26, 1, grow=20.0, start=60, total=86)
    off = IdleGapModel(forward_origins=()).fit(train)
    on = IdleGapModel().fit(train)
    assert off.workflow_types_["w"]["level"] == "agent"       # what shuffled CV chooses
    fwd = on.workflow_types_["w"]["forward"]
    assert fwd["served"] == "pooled"
    assert fwd["scores"]["chosen"]["coverage"] < 0.9 < fwd["scores"]["pooled"]["coverage"]
    assert fwd["diff"] > fwd["diff_se"] > 0
    info = on.workflow_types_["w"]
    assert (info["level"], info["prior_weight"], info["half_life"]) == ("workflow_type", None, None)
    cov_off, ttl_off = future_coverage(off, test)
    cov_on, ttl_on = future_coverage(on, test)
    assert cov_off < 0.8 and cov_on >= 0.93       # the future: under nominal → at nominal
    assert ttl_on < 2 * ttl_off                   # without a many-fold KV cost


def test_stationary_gaps_keep_the_chosen_fit():
    train = two_agents(60, 0, grow=1.0)
    off = IdleGapModel(forward_origins=()).fit(train).workflow_types_["w"]
    on = IdleGapModel().fit(train).workflow_types_["w"]
    assert on["forward"]["served"] == "chosen"
    assert on["level"] == off["level"] and on["entries"] == off["entries"]


def test_too_few_workflows_skip_the_check():
    on = IdleGapModel().fit(two_agents(12, 0, grow=20.0)).workflow_types_["w"]
    assert on["forward"] is None


def test_fit_option_turns_the_check_off(tmp_path):
    path = tmp_path / "messy.jsonl"
    write_jsonl(generate("messy", 40, seed=0), path)
    con = connect(None)
    ingest.ingest(con, [path])
    on = fitting.fit_idle_gap(con, fitting.FitOptions())
    off = fitting.fit_idle_gap(con, fitting.FitOptions(forward_validation=False))
    assert any(v.get("forward") for v in on.to_dict()["workflow_types"].values())
    assert not any(v.get("forward") for v in off.to_dict()["workflow_types"].values())
