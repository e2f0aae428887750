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
from profiler.evaluation import keep_alive_dominated, keep_alive_vs
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


def future_cost(model: IdleGapModel, test: pd.DataFrame) -> float:
    """KV-seconds held per covered test gap (``Σ min(TTL, gap) / #covered``, TTLs held as served)."""
    ttl = np.clip(model.predict_sessions(test), 0.5, 120.0)
    gap = test["gap_after_s"].to_numpy(dtype=float)
    has = ~np.isnan(gap)
    return float(np.minimum(ttl[has], gap[has]).sum() / np.sum(gap[has] <= ttl[has]))


def test_on_stationary_gaps_the_served_ttl_is_not_behind_on_the_future():
    # the agent level covers as the pooled quantile does; the pooled one holds less per covered
    # gap (its misses are the slow agent's, held for a shorter TTL), so it may serve: on the
    # future it must not be behind the chosen fit on either
    train, test = two_agents(60, 0, grow=1.0), two_agents(30, 1, grow=1.0, start=60)
    off = IdleGapModel(forward_origins=()).fit(train)
    on = IdleGapModel().fit(train)
    assert on.workflow_types_["w"]["forward"]["served"] in ("chosen", "pooled")
    assert future_coverage(on, test)[0] >= future_coverage(off, test)[0] - 0.01
    assert future_cost(on, test) <= future_cost(off, test) + 0.5


def test_the_chosen_fit_stays_where_it_is_ahead(tmp_path):
    path = tmp_path / "messy.jsonl"
    write_jsonl(generate("messy", 64, seed=0), path)
    con = connect(None)
    ingest.ingest(con, [path])
    model = fitting.fit_idle_gap(con, fitting.FitOptions())
    fwd = model.workflow_types_["messy_app"]["forward"]
    assert fwd["served"] == "chosen"
    assert fwd["scores"]["chosen"]["coverage"] > fwd["scores"]["pooled"]["coverage"]


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


def test_keep_alive_vs_flags_a_baseline_ahead_at_no_more_cost():
    rng = np.random.default_rng(0)
    gap = rng.lognormal(1.0, 0.5, 400)
    groups = np.repeat(np.arange(80), 5)
    short, right = np.full(400, np.quantile(gap, 0.6)), np.full(400, np.quantile(gap, 0.95))
    # ours too short: the baseline covers far more; per covered gap it holds about as much
    v = keep_alive_vs(gap, short, right, groups)
    assert v["coverage_diff"] < -3 * v["coverage_diff_se"]
    assert v["dominated"] == (v["kv_s_diff"] >= -v["kv_s_diff_se"])
    # the other way round: ours covers more, never dominated by the shorter TTL
    w = keep_alive_vs(gap, right, short, groups)
    assert w["coverage_diff"] > 0 and not w["dominated"]
    # the same coverage at a higher cost: a TTL far past every gap holds nothing more per gap
    # covered (a covered gap holds its own length), so equal TTLs are never dominated
    same = keep_alive_vs(gap, right, right.copy(), groups)
    assert same["coverage_diff"] == 0 and same["kv_s_diff"] == 0 and not same["dominated"]


def test_jackknife_matches_the_delete_one_workflow_definition():
    rng = np.random.default_rng(1)
    gap = rng.lognormal(1.0, 0.7, 120)
    groups = np.repeat(np.arange(30), 4)
    a, b = rng.uniform(1, 8, 120), rng.uniform(1, 8, 120)
    v = keep_alive_vs(gap, a, b, groups)
    theta = []
    for g in range(30):
        keep = groups != g
        theta.append(np.mean(gap[keep] <= np.clip(a[keep], 0.5, 120))
                     - np.mean(gap[keep] <= np.clip(b[keep], 0.5, 120)))
    theta = np.array(theta)
    assert math.isclose(v["coverage_diff_se"], math.sqrt(29 / 30 * np.sum((theta - theta.mean()) ** 2)), rel_tol=1e-9)
    assert keep_alive_dominated(-0.05, 0.01, 0.0, 0.1) and not keep_alive_dominated(-0.05, 0.1, 0.0, 0.1)
    assert keep_alive_dominated(0.01, 0.01, 1.0, 0.1) and not keep_alive_dominated(0.02, 0.01, 1.0, 0.1)
