"""Keep-alive TTL under recency weighting that cannot certify its quantile (issue 26 item 6).

A recency-weighted conformal quantile is finite only when the weights sum to q / (1 − q) (19 at
0.95). On a small team log (8 roles, one gap each per workflow, 45 workflows) a short half-life
leaves each role far less than that: the quantile was ``inf``, served as the cap, and that cap
"covered" the later slice the half-life is chosen on — so the shortest half-life won and TTLs
collapsed to the cap. Now such an entry takes its own gaps under a longer half-life (at last
unweighted), and half-life selection skips a half-life the type's weights cannot certify; the
eval reports the KV-seconds each TTL holds per covered gap beside the oracle's."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from predictors.idle_gap import IdleGapModel, certifies, select_half_life, weighted_conformal_quantile
from predictors.tool_latency import ToolLatencyModel
from scoring.baseline_table import baseline_rows
from scoring.evaluation import evaluate
from fitting import profile_fit as fitting
from store.workloads import generate, write_jsonl

ROLES = {"ceo": 0.8, "cpo": 1.0, "cto": 1.5, "programmer": 5.0, "reviewer": 2.0, "tester": 7.5,
         "designer": 1.2, "writer": 0.5}


def team(n_wf: int, seed: int, start: int = 0, total: int | None = None) -> pd.DataFrame:
    """Gap rows of a drifting 8-role team: each role once per workflow (END after the writer), the
    gap after a role ~ LN(ln(median · 3^(wf/total)), 0.8) — its tasks grow 3× over the log."""
    rng = np.random.default_rng(seed)
    total = total or n_wf
    rows = []
    for i in range(n_wf):
        wf = start + i
        drift = 3.0 ** (wf / max(total - 1, 1))
        for k, (agent, median) in enumerate(ROLES.items()):
            gap = float(rng.lognormal(math.log(median * drift), 0.8)) if k < len(ROLES) - 1 else np.nan
            rows.append({"workflow_type_id": "team", "workflow_id": f"t{wf:04d}", "agent_id": agent, "tool": "",
                         "call_index": k, "t_arrival": wf * 86400.0 + k * 60, "gap_after_s": gap})
    return pd.DataFrame(rows)


def test_certifies_is_the_finite_quantile_condition():
    for q in (0.9, 0.95, 0.99):
        need = q / (1 - q)
        for total in (0.5 * need, 0.999 * need, need, 1.5 * need):
            w = np.full(40, total / 40)
            finite = math.isfinite(weighted_conformal_quantile(np.arange(40.0), w, q))
            assert certifies(w, q) == finite, (q, total)
    assert certifies(np.ones(19), 0.95) and not certifies(np.ones(18), 0.95)


def test_half_life_selection_skips_a_candidate_its_rule_refuses():
    rows = pd.DataFrame({"rank": np.repeat(np.arange(40), 3), "x": np.arange(120.0)})
    seen = []

    def score(train, later):
        seen.append(train["weight"].sum())
        return 1.0, 1.0                               # every candidate would reach the quantile

    h, scores = select_half_life(rows, 40, (None, 0.5, 0.05), 20, 0.95, score,
                                 eligible=lambda t: certifies(t["weight"].to_numpy(), 0.95))
    assert math.isnan(scores[0.05][0]) and scores[0.5] == (1.0, 1.0) and h in (None, 0.5)
    assert len(seen) == 2                              # the refused one is not even scored


def test_a_small_drifting_team_is_never_served_the_cap():
    train = team(45, seed=0)
    model = IdleGapModel(max_ttl_s=120.0).fit(train)
    info = model.workflow_types_["team"]
    # no candidate scores by the cap any more: every later-slice mean TTL is a real quantile
    widths = [w for c, w, *_ in info["half_life_scores"].values() if not math.isnan(c)]
    assert widths and max(widths) < 60.0
    for (level, _), sc in zip(info["scores"].items(), info["scores"].values()):
        assert sc["mean_ttl_s"] < 60.0, level
    # every entry certified: its own, a longer half-life's or the type's
    for lv, rows in info["entries"].items():
        assert all(math.isfinite(r["ttl_z"]) for r in rows), lv
    test = team(20, seed=1, start=45, total=65)
    ttl = model.predict_sessions(test)
    has = test["gap_after_s"].notna().to_numpy()
    assert np.mean(ttl[has] >= 120.0) == 0.0
    assert np.mean(test["gap_after_s"].to_numpy()[has] <= ttl[has]) >= 0.85
    if info["half_life"] is not None and info["half_life"] * 45 * 7 / math.log(2) < 19:
        # a half-life this short cannot certify one role's quantile: the roles backed off
        assert sum(info["backed_off"]["agent"].values()) > 0


def test_an_uncertified_role_takes_its_own_gaps_under_a_longer_half_life():
    """Forced short half-life (one candidate besides none is not chosen by the slice: call the
    tables directly): each role's weight sums to < 19, the type's does not."""
    df = team(45, seed=2)
    model = IdleGapModel(max_ttl_s=120.0, prior_weights=(None,))
    from predictors.idle_gap import recency_weights, workflow_ranks
    df = df.sort_values(["workflow_type_id", "workflow_id", "call_index"]).reset_index(drop=True)
    df = df.astype({"workflow_type_id": "category", "agent_id": "category", "tool": "category"})
    rank = workflow_ranks(df).to_numpy()
    df = df.assign(rank=rank, weight=recency_weights(rank, 45, 0.05))
    gaps = df[df["gap_after_s"].notna()]
    assert not certifies(gaps.loc[gaps["agent_id"] == "tester", "weight"].to_numpy(), 0.95)
    tables = model._tables(gaps, None)
    agent = tables["agent"].set_index("agent_id")
    assert np.isfinite(agent["q_z"]).all()
    assert set(agent["backed_off"]) - {""} and (agent["backed_off"] != "").all()
    # the tester's TTL is its own (long) gaps' quantile, not the type's nor the cap
    tester = gaps[gaps["agent_id"] == "tester"]["gap_after_s"]
    assert agent.loc["tester", "q_z"] >= np.quantile(tester, 0.5)
    assert agent.loc["tester", "q_z"] != tables["workflow_type"]["q_z"].iloc[0]


def test_tool_latency_refuses_a_half_life_too_short_to_certify():
    rng = np.random.default_rng(5)
    rows = [{"workflow_type_id": "wt", "workflow_id": f"w{i:03d}", "tool_name": "bash", "t_start": i * 100.0,
             "latency_s": float(rng.lognormal(0.0, 0.3))} for i in range(40)]   # one execution per workflow
    model = ToolLatencyModel(half_lives=(None, 0.05)).fit(pd.DataFrame(rows))
    assert model.half_life_["wt"] is None


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    root = tmp_path_factory.mktemp("kacost")
    write_jsonl(generate("coding_assistant", 40, seed=3), root / "logs" / "ca.jsonl")
    write_jsonl(generate("coding_assistant", 15, seed=4), root / "test" / "ca.jsonl")
    profile, _ = fitting.fit_profile([root / "logs"], root / "profile", options=fitting.FitOptions(min_calls=20))
    return evaluate(profile, [root / "test"])[0]


def test_eval_reports_kv_seconds_per_covered_gap_beside_the_oracle(evaluated):
    ka = evaluated["keep_alive"]
    cost = ka["kv_s_per_covered_gap"]
    assert set(cost) == {"ours", "idle_gap_p95", "tool_p95", "nat_trie", "oracle"}
    assert all(v is None or v >= 0 for v in cost.values())
    # the oracle holds exactly the gaps under the cap: its coverage is their share, and a TTL that
    # covers every one of them can hold no less KV per gap covered than the oracle does
    assert 0.0 < ka["oracle_coverage"] <= 1.0
    assert ka["idle_gap_coverage"] <= ka["oracle_coverage"] + 1e-12
    assert cost["oracle"] > 0
    if ka["idle_gap_coverage"] == ka["oracle_coverage"]:
        assert cost["ours"] >= cost["oracle"] - 1e-9
    ends = ka["kv_s_per_covered_gap_with_ends"]
    assert ends["oracle"] == pytest.approx(cost["oracle"])            # the oracle keeps nothing at an end
    assert ka["end_share"] > 0 and ends["ours"] > cost["ours"]         # ours holds its TTL there
    assert set(ka["ttl_at_cap_share"]) == {"ours", "idle_gap_p95", "tool_p95", "nat_trie"}
    assert all(0.0 <= v <= 1.0 for v in ka["ttl_at_cap_share"].values() if v is not None)
    rows = {(r["metric"], r["method"]): r["value"] for r in baseline_rows(evaluated)}
    assert rows[("keep-alive KV-s per covered gap", "oracle")] == pytest.approx(cost["oracle"])
    assert rows[("keep-alive KV-s per covered gap", "ours")] == pytest.approx(cost["ours"])
    for wt in ka["by_workflow_type"].values():
        assert "kv_s_per_covered_gap" in wt and "ttl_at_cap_share" in wt
