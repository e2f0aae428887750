"""Idle-gap keep-alive TTL: conformal quantile, level choice, recency under a shape change,
per-session correction in the predictor, keep/drop and the SGLang flat form, profiler eval."""
from __future__ import annotations

import copy
import math

import duckdb
import numpy as np
import pandas as pd
import pytest

from predictors import Predictor
from predictors.idle_gap import (IdleGapModel, _workflow_ranks_by_join, grouped_weighted_quantile,
                                 weighted_conformal_quantile, workflow_ranks)
from predictors.tool_latency import ToolLatencyModel
from fitting import profile_fit as fitting
from scoring.evaluation import evaluate
from store.workloads import generate, write_jsonl
from serving_hooks.annotations import flatten_for_sglang
from predictors.contract import from_custom_params
from policies.keep_drop import KeepDropPolicy, RetentionRank

WT = "coding_assistant"


def test_conformal_quantile_is_the_finite_sample_order_statistic():
    x = np.arange(1.0, 20.0)                       # n = 19: ⌈0.95·20⌉ = 19 → the maximum
    assert weighted_conformal_quantile(x, np.ones(19), 0.95) == 19.0
    assert weighted_conformal_quantile(x[:10], np.ones(10), 0.95) == math.inf   # not certifiable
    x40 = np.arange(1.0, 41.0)                     # ⌈0.95·41⌉ = 39
    assert weighted_conformal_quantile(x40, np.ones(40), 0.95) == 39.0
    # weight on the newest points pulls the quantile to them
    w = np.r_[np.full(20, 1e-6), np.ones(20)]
    assert weighted_conformal_quantile(x40, w, 0.5) == 31.0   # ⌈0.5·21⌉ = 11th heavy point



@pytest.mark.parametrize("seed", range(4))
def test_grouped_quantile_with_a_shared_x_order_is_the_same_to_the_bit(seed):
    """The shared stable sort of x (then of the codes along it) orders rows as lexsort does:
    ties in x and in both keys, ±0.0 and NaN included, so every quantile is bit-identical and
    equals the per-group weighted_conformal_quantile."""
    rng = np.random.default_rng(seed)
    n, groups = 5000, 7
    x = np.round(rng.lognormal(size=n), 1)                 # many ties
    x[rng.choice(n, 50)] = 0.0
    x[rng.choice(n, 50)] = -0.0
    x[rng.choice(n, 5)] = np.nan
    codes = rng.integers(0, groups, n)
    w = rng.uniform(0.01, 1.0, n)
    order = np.argsort(x, kind="stable")
    for q, w_new, tol in ((0.95, 1.0, 1e-12), (0.5, 0.0, 0.0), (0.99, 1.0, 1e-12)):
        plain = grouped_weighted_quantile(codes, x, w, q, w_new, groups, tol)
        shared = grouped_weighted_quantile(codes, x, w, q, w_new, groups, tol, x_order=order)
        assert plain.tobytes() == shared.tobytes()
    finite = ~np.isnan(x)
    got = grouped_weighted_quantile(codes[finite], x[finite], w[finite], 0.95, 1.0, groups,
                                    x_order=np.argsort(x[finite], kind="stable"))
    for g in range(groups):
        at = finite & (codes == g)
        assert got[g] == weighted_conformal_quantile(x[at], w[at], 0.95)


@pytest.mark.parametrize("categorical", [False, True])
def test_workflow_ranks_by_group_number_equal_the_join(categorical):
    """Ranks read back by group number equal the ones a join on the keys gives: ties in the first
    arrival broken by workflow id, per workflow type, on a shuffled index; a missing key takes
    the join (which matches NaN to NaN)."""
    rng = np.random.default_rng(3)
    n = 3000
    df = pd.DataFrame({"workflow_type_id": rng.choice(["a", "b", "c"], n),
                       "workflow_id": rng.choice([f"w{i}" for i in range(300)], n),
                       "t_arrival": np.round(rng.uniform(0, 50, n), 0)}, index=rng.permutation(n) + 10)
    if categorical:
        df = df.astype({"workflow_type_id": "category"})
    got = workflow_ranks(df)
    pd.testing.assert_series_equal(got, _workflow_ranks_by_join(df))
    first = df.groupby(["workflow_type_id", "workflow_id"], observed=True)["t_arrival"].min()
    oldest = first.loc["a"].sort_values(kind="stable").index[0]  # ties: sorted by id already
    assert (got[(df["workflow_type_id"] == "a") & (df["workflow_id"] == oldest)] == 0).all()
    df.loc[df.index[:5], "workflow_id"] = None
    pd.testing.assert_series_equal(workflow_ranks(df), _workflow_ranks_by_join(df))

def _sessions(n_wf: int, scale_of, rng, calls: int = 12, t0: float = 0.0, start: int = 0) -> pd.DataFrame:
    """Sessions of one agent pair: gap ~ LN(ln scale, 0.4), last call has no gap (END)."""
    rows = []
    for i in range(n_wf):
        wf = start + i
        for k in range(calls):
            agent = "coder" if k % 2 else "planner"
            scale = scale_of(wf, agent)
            gap = float(rng.lognormal(math.log(scale), 0.4)) if k < calls - 1 else np.nan
            rows.append({"workflow_type_id": "wt", "workflow_id": f"w{wf:04d}", "agent_id": agent,
                         "tool": "bash" if agent == "coder" else "", "call_index": k,
                         "t_arrival": t0 + wf * 1000.0 + k, "gap_after_s": gap})
    return pd.DataFrame(rows)


def _coverage(model: IdleGapModel, test: pd.DataFrame) -> tuple[float, float]:
    ttl = model.predict_sessions(test)
    has = test["gap_after_s"].notna().to_numpy()
    gap = test["gap_after_s"].to_numpy()
    return float(np.mean(gap[has] <= ttl[has])), float(np.mean(ttl[has]))


def test_agent_level_is_chosen_when_agents_differ_and_coverage_holds():
    rng = np.random.default_rng(0)
    scale = lambda wf, agent: 10.0 if agent == "coder" else 0.5   # noqa: E731
    model = IdleGapModel(half_lives=(None,)).fit(_sessions(80, scale, rng))
    info = model.workflow_types_["wt"]
    assert info["level"] == "agent"
    assert info["end_share"] == pytest.approx(1 / 12)
    assert model.ttl("wt", "planner") < 2.0 < 10.0 < model.ttl("wt", "coder")
    cov, _ = _coverage(model, _sessions(200, scale, rng, start=1000))
    assert cov >= 0.92
    restored = IdleGapModel.from_dict(model.to_dict())
    assert restored.ttl("wt", "coder") == pytest.approx(model.ttl("wt", "coder"))


@pytest.mark.parametrize("old,new", [(10.0, 1.0), (1.0, 10.0)])
def test_recency_weighting_follows_a_shape_change_halfway(old, new):
    """Gaps 10× longer (or shorter) in the first half of the log: the later slice picks a finite
    half-life, and the TTL follows the new shape where the unweighted fit does not."""
    rng = np.random.default_rng(1)
    train = _sessions(120, lambda wf, a: old if wf < 60 else new, rng)
    test = _sessions(100, lambda wf, a: new, rng, start=500)
    drift = IdleGapModel(prior_weights=(None,)).fit(train)
    flat = IdleGapModel(prior_weights=(None,), half_lives=(None,)).fit(train)
    assert drift.workflow_types_["wt"]["half_life"] is not None
    cov_d, ttl_d = _coverage(drift, test)
    cov_f, ttl_f = _coverage(flat, test)
    assert cov_d >= 0.9
    if new < old:   # unweighted: far too long a TTL for the new shape
        assert ttl_d < 0.5 * ttl_f
    else:           # unweighted: the old short gaps drag the TTL down, below nominal
        assert cov_f < 0.93 and cov_d >= 0.95


def test_session_correction_lengthens_ttl_of_slow_sessions():
    """A session whose gaps run 10× the median gets a longer TTL (normalized conformal)."""
    rng = np.random.default_rng(2)
    slow = {f"w{i:04d}" for i in range(0, 80, 2)}
    df = _sessions(80, lambda wf, a: 10.0 if f"w{wf:04d}" in slow else 1.0, rng)
    model = IdleGapModel(half_lives=(None,)).fit(df)
    info = model.workflow_types_["wt"]
    assert info["prior_weight"] is not None     # validation keeps the correction
    ttl = model.predict_sessions(df)
    last = df["call_index"].to_numpy() == 10
    is_slow = df["workflow_id"].isin(slow).to_numpy()
    assert ttl[last & is_slow].mean() > 2 * ttl[last & ~is_slow].mean()
    test = _sessions(100, lambda wf, a: 10.0 if wf % 2 else 1.0, rng, start=500)
    plain = IdleGapModel(half_lives=(None,), prior_weights=(None,)).fit(df)
    (cov, width), (cov0, width0) = _coverage(model, test), _coverage(plain, test)
    assert cov >= 0.92 and cov0 >= 0.92
    assert width < 0.9 * width0                   # same coverage, shorter TTLs on average


def test_degenerate_inputs_fall_back():
    one = _sessions(1, lambda wf, a: 1.0, np.random.default_rng(3), calls=3)
    model = IdleGapModel().fit(one)
    assert model.workflow_types_["wt"]["level"] == "workflow_type"
    assert model.ttl("wt", "coder") is None           # 2 gaps: no entry, the tool TTL applies
    assert "fewer than 19 gaps" in model.workflow_types_["wt"]["reason"]
    lonely = one[one["call_index"] == 0].assign(gap_after_s=np.nan)
    assert IdleGapModel().fit(lonely).ttl("wt", "planner") is None


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    root = tmp_path_factory.mktemp("idle")
    write_jsonl(generate(WT, 60, seed=3), root / "logs" / "ca.jsonl")
    write_jsonl(generate(WT, 20, seed=4), root / "test" / "ca.jsonl")
    profile, _ = fitting.fit_profile([root / "logs"], root / "profile",
                                     options=fitting.FitOptions(min_calls=20))
    con = duckdb.connect(str(root / "profile" / "store.duckdb"), read_only=True)
    seq = con.execute("SELECT list(agent_id ORDER BY call_index) FROM calls GROUP BY workflow_id "
                      "ORDER BY workflow_id LIMIT 1").fetchone()[0]
    con.close()
    return profile, seq, root


def test_predictor_scales_the_ttl_by_the_sessions_own_gaps(fitted):
    profile, seq, _ = fitted
    data = copy.deepcopy(profile.data)
    data["idle_gap"]["workflow_types"][WT]["prior_weight"] = 4.0
    now = [0.0]
    # the session correction alone: the online keep-alive level (which the slow session's misses
    # would move for every session) is tested in tests/test_keep_alive_online.py
    p = Predictor.from_dict(data, clock=lambda: now[0], keep_alive_calibration=False)
    model = IdleGapModel.from_dict(data["idle_gap"])

    def run(wf: str, gap_factor: float) -> list[float]:
        ttls = []
        for i, agent in enumerate(seq[:6]):
            ann = p.annotate({"workflow_type_id": WT, "workflow_id": wf, "agent_id": agent},
                             request_id=f"{wf}-{i}")
            ttls.append(ann["keep_alive_ttl_s"])
            now[0] += 1.0                                        # the call runs 1 s
            p.observe({"app_metadata": {"workflow_type_id": WT, "workflow_id": wf, "agent_id": agent},
                       "request_id": f"{wf}-{i}", "output_tokens": 10})
            now[0] += gap_factor * model.median(WT, agent)        # idle until the next arrival
        return ttls

    slow, steady = run("slow", 5.0), run("steady", 1.0)
    assert slow[0] == steady[0] == pytest.approx(model.ttl(WT, seq[0]))   # nothing seen yet
    # after 5 gaps of 5× the median: factor exp(5 ln 5 / (5 + 4))
    assert slow[5] == pytest.approx(min(600.0, model.ttl(WT, seq[5]) * math.exp(5 * math.log(5) / 9)), rel=1e-6)
    assert steady[5] == pytest.approx(model.ttl(WT, seq[5]), rel=1e-6)


def test_keep_drop_and_flat_form_use_the_idle_gap_ttl(fitted):
    profile, seq, _ = fitted
    ann = Predictor(profile).annotate({"workflow_type_id": WT, "workflow_id": "x", "agent_id": seq[0]})
    assert ann["keep_alive_ttl_s"] > 0
    flat = flatten_for_sglang(ann)
    assert flat["keep_alive_ttl_s"] == ann["keep_alive_ttl_s"]
    view = from_custom_params({**flat, "known": True, "exp_remaining_calls": 5.0, "p_end": 0.0,
                                        "keep_alive_ttl_s": 7.5, "retain_s": 2.0, "tool_p95_s": 1.0})
    r = KeepDropPolicy(keep_idle=True).decide_annotation(view, now=100.0)
    assert r.rank == RetentionRank.KEEP and r.ttl_s == pytest.approx(7.5)
    old = from_custom_params({**flat, "known": True, "exp_remaining_calls": 5.0, "p_end": 0.0,
                                       "keep_alive_ttl_s": None, "retain_s": 2.0})
    assert KeepDropPolicy(keep_idle=True).decide_annotation(old, now=100.0).ttl_s == pytest.approx(2.0)


def test_eval_reports_keep_alive_beside_baselines(fitted):
    profile, _, root = fitted
    result, _ = evaluate(profile, [root / "test"])
    ka = result["keep_alive"]
    assert ka["nominal"] == 0.95
    assert set(ka["baselines"]) == {"idle_gap_p95", "tool_p95", "nat_trie"}
    assert 0.0 <= ka["baselines"]["nat_trie"] <= 1.0 and ka["baseline_mean_ttl_s"]["nat_trie"] >= 0.0
    assert 0.0 <= ka["idle_gap_coverage"] <= 1.0 and ka["scored_share"] == 1.0
    assert ka["idle_gap_coverage"] >= 0.85


def test_tool_latency_recency_weighting_after_a_shape_change():
    """A tool 10× slower in the older half of the log: the weighted p95 follows the new shape."""
    rng = np.random.default_rng(5)
    rows = [{"workflow_type_id": "wt", "workflow_id": f"w{i:03d}", "tool_name": "bash", "t_start": i * 100.0 + k,
             "latency_s": float(rng.lognormal(math.log(10.0 if i < 60 else 1.0), 0.3))}
            for i in range(120) for k in range(5)]
    df = pd.DataFrame(rows)
    plain = ToolLatencyModel().fit(df).lookup("wt", "bash")
    weighted = ToolLatencyModel(half_lives=(None, 0.5, 0.2, 0.05))
    entry = weighted.fit(df).lookup("wt", "bash")
    assert weighted.half_life_["wt"] is not None
    assert entry["p95_s"] < 3.0 < 10.0 < plain["p95_s"]
    assert ToolLatencyModel.from_dict(weighted.to_dict()).half_life_ == weighted.half_life_


def test_session_factor_gives_way_where_the_plain_quantile_dominates_it():
    """The session factor chosen by mean TTL is replaced by the same level without it where that
    one covers more at no more KV-seconds per covered gap on the validation folds (issue 37: on
    mini-SWE-agent the factor saved mean TTL and lost coverage and KV-seconds); kept otherwise."""
    rng = np.random.default_rng(5)
    n_wf, per = 40, 10
    g = pd.DataFrame({"workflow_id": np.repeat([f"w{i:03d}" for i in range(n_wf)], per),
                      "gap_after_s": rng.uniform(0.5, 9.0, n_wf * per)})
    g.loc[g.index % per == per - 1, "gap_after_s"] = np.nan          # each session's END
    plain = np.full(len(g), 10.0)
    # the factor moves the TTL by session (5 s or 15 s, the same mean) on gaps it cannot predict
    factor = np.where(np.arange(len(g)) // per % 2 == 0, 5.0, 15.0)
    model = IdleGapModel()
    preds = {("agent", 16.0): factor, ("agent", None): plain}
    assert model._plain_unless_ahead(("agent", 16.0), preds, g) == ("agent", None)
    assert model._plain_unless_ahead(("agent", 16.0), {("agent", 16.0): plain, ("agent", None): plain},
                                      g) == ("agent", 16.0)         # level: the choice stands
    assert model._plain_unless_ahead(("agent", None), preds, g) == ("agent", None)
