"""Output-length bands: coverage, fallback levels, the conditional (CQR) model."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from predictors.band_selection import candidate_bands
from predictors.output_length import OutputLengthIntervals, conformal_band
from predictors.predictor import Predictor


def frame(rng, agents, n_workflows=200, rho=0.0):
    """Calls of agents given as {name: (calls per workflow, mean, cv)}; AR(1) ρ within a workflow."""
    rows = []
    for w in range(n_workflows):
        for agent, (k, mean, cv) in agents.items():
            s2 = np.log1p(cv * cv)
            z = rng.standard_normal()
            prev = None
            for i in range(k):
                if i:
                    z = rho * z + np.sqrt(1 - rho * rho) * rng.standard_normal()
                y = int(np.exp(np.log(mean) - s2 / 2 + np.sqrt(s2) * z))
                rows.append({"workflow_type_id": "app", "workflow_id": f"w{w}", "agent_id": agent,
                             "output_tokens": y, "input_tokens": 1000 + 10 * i,
                             "prev_agent_output_tokens": prev, "agent_call_index": i})
                prev = y
    return pd.DataFrame(rows)


def test_conformal_band_ranks():
    y = np.arange(1, 1000)  # 999 values: ranks floor(1000*0.005)=5 and ceil(1000*0.995)=995
    assert conformal_band(y, 0.99) == (5, 995, True)
    assert conformal_band(np.arange(1, 51), 0.99)[2] is False  # too few for the guarantee


def test_coverage_holds_on_new_data():
    rng = np.random.default_rng(0)
    agents = {"planner": (1, 60, 0.15), "engineer": (4, 3152, 0.45)}
    est = OutputLengthIntervals(coverage=0.95, conditional=False).fit(frame(rng, agents, 400))
    test = frame(np.random.default_rng(1), agents, 400)
    bands = est.predict(test)
    inside = (test.output_tokens >= bands[:, 0]) & (test.output_tokens <= bands[:, 1])
    assert 0.93 <= inside.mean() <= 0.98
    assert est.agents_["app"]["planner"]["hi"] < 120  # a narrow band, not the global one
    assert est.global_["hi"] > 5000


def test_selection_picks_the_parent_when_the_agents_own_band_is_wider():
    rng = np.random.default_rng(2)
    # "common" dominates the type; "rare" (30 calls, heavy-tailed) has no narrower band of its own
    df = frame(rng, {"common": (2, 500, 0.3)}, 100)
    rare = frame(rng, {"rare": (1, 500, 0.3)}, 30)
    # the per-agent rule alone (the shared budget may then move bands: tested below)
    est = OutputLengthIntervals(conditional=False, shared_budget=False).fit(pd.concat([df, rare]))
    common, rare_e = est.agents_["app"]["common"], est.agents_["app"]["rare"]
    assert common["lo"] <= common["hi"]
    sel = rare_e["selection"]
    cands = sel["candidates"]
    # every figure is a held-out figure: 30 calls scored once each across the folds
    assert sel["n_val"] == 30 and set(cands) >= {"parent", "order_stat", "order_stat_ceiling", "lognormal"}
    # its own finite-sample band is [0, 2·max] or the lognormal tail: wider than the type's
    assert sel["chosen"] == "parent", cands
    assert cands["parent"]["mean_width"] < cands["order_stat_ceiling"]["mean_width"]
    assert rare_e["level"] in ("workflow_type", "global") and rare_e["hi"] <= est.workflow_types_["app"]["hi"]
    accepted = {k: v for k, v in cands.items() if v["accepted"]}
    assert sel["chosen"] in accepted
    assert cands[sel["chosen"]]["mean_width"] == min(v["mean_width"] for v in accepted.values())


def test_narrow_agent_gets_its_own_band_not_its_types():
    rng = np.random.default_rng(7)
    df = frame(rng, {"coder": (2, 3000, 0.5), "router": (1, 8, 0.1)}, 120)
    est = OutputLengthIntervals(conditional=False).fit(df)
    router = est.agents_["app"]["router"]
    assert router["hi"] < 20 <= 2 * max(df.output_tokens[df.agent_id == "router"]) + 2  # its ceiling
    assert est.workflow_types_["app"]["hi"] > 1000  # not the type's band


def test_chosen_band_covers_held_out_folds_at_nominal():
    # coverage 0.9 on 600 calls: the accepted candidate's held-out misses are within
    # α(N+1) + √(Nα(1−α)) = 60.1 + 7.3
    df = frame(np.random.default_rng(8), {"a": (3, 700, 0.6)}, 200)
    e = OutputLengthIntervals(coverage=0.9, conditional=False, shared_budget=False).fit(df).agents_["app"]["a"]
    v = e["selection"]["candidates"][e["selection"]["chosen"]]
    assert e["selection"]["n_val"] == 600
    assert round((1 - v["coverage"]) * 600) <= 67
    test = frame(np.random.default_rng(9), {"a": (3, 700, 0.6)}, 400)
    inside = ((test.output_tokens >= e["lo"]) & (test.output_tokens <= e["hi"])).mean()
    assert 0.87 <= inside <= 0.94


def test_single_workflow_type_and_unseen_agent_lookup():
    rng = np.random.default_rng(2)
    df = frame(rng, {"common": (2, 500, 0.3)}, 100)
    other = frame(rng, {"solo": (1, 80, 0.1)}, 5).assign(workflow_type_id="tiny")
    est = OutputLengthIntervals(conditional=False).fit(pd.concat([df, other]))
    assert est.predict_band("app", "never_seen")[2] == est.workflow_types_["app"]["level"]
    assert est.predict_band("unknown_type", "x")[2] == "global"


def test_conditional_model_used_only_when_it_is_narrower():
    agents = {"engineer": (6, 3000, 0.6)}
    correlated = frame(np.random.default_rng(3), agents, 400, rho=0.9)
    est = OutputLengthIntervals(coverage=0.9).fit(correlated)
    band = est.agents_["app"]["engineer"]
    assert band["conditional"] is not None, band["selection"]
    v = band["conditional"]["validation"]
    assert v["mean_width"] < v["marginal_width"] and band["selection"]["chosen"] == "conditional"
    lo1, hi1, lvl = est.predict_band("app", "engineer", {"prev_agent_output_tokens": 800,
                                                         "input_tokens": 1000, "agent_call_index": 2})
    lo2, hi2, _ = est.predict_band("app", "engineer", {"prev_agent_output_tokens": 9000,
                                                       "input_tokens": 1000, "agent_call_index": 2})
    assert lvl == "conditional" and hi2 > hi1  # a long previous answer predicts a long next one
    independent = frame(np.random.default_rng(4), agents, 400, rho=0.0)
    assert OutputLengthIntervals(coverage=0.9).fit(independent).agents_["app"]["engineer"]["conditional"] is None


def test_round_trip_through_dict():
    df = frame(np.random.default_rng(5), {"a": (3, 100, 0.5)}, 300, rho=0.9)
    est = OutputLengthIntervals(coverage=0.9).fit(df)
    again = OutputLengthIntervals.from_dict(est.to_dict())
    np.testing.assert_array_equal(est.predict(df), again.predict(df))
    assert again.coverage == 0.9


def test_fit_rejects_empty_and_bad_coverage():
    with pytest.raises(ValueError, match="no calls"):
        OutputLengthIntervals().fit(pd.DataFrame(columns=["workflow_type_id", "agent_id", "output_tokens"]))
    df = frame(np.random.default_rng(6), {"a": (1, 100, 0.2)}, 10)
    with pytest.raises(ValueError, match="coverage"):
        OutputLengthIntervals(coverage=1.5).fit(df)


def test_shared_budget_spends_miscoverage_on_the_heavy_tailed_agent():
    """A narrow agent and a heavy-tailed one in one type (Magentic-One's Orchestrator and
    WebSurfer): the type's budget, not each agent's 1 − α, is held to nominal, so the pooled
    band is narrower than per-agent bands at nominal, and still covers new data at nominal."""
    rng = np.random.default_rng(3)
    agents = {"orchestrator": (6, 300, 0.3), "websurfer": (1, 900, 1.6)}
    train, test = frame(rng, agents, 150), frame(np.random.default_rng(4), agents, 600)
    shared = OutputLengthIntervals(conditional=False).fit(train)
    alone = OutputLengthIntervals(conditional=False, shared_budget=False).fit(train)

    def scores(est):
        b = est.predict(test)
        y = test.output_tokens.to_numpy()
        return float(np.mean((y >= b[:, 0]) & (y <= b[:, 1]))), float(np.mean(b[:, 1] - b[:, 0]))

    (cov_s, w_s), (cov_a, w_a) = scores(shared), scores(alone)
    assert cov_s >= 0.98 and w_s < 0.75 * w_a, (cov_s, w_s, cov_a, w_a)
    budget = shared.agents_["app"]["websurfer"]["selection"]["budget"]
    assert budget["held_out_misses"] <= budget["budget_misses"]
    assert budget["held_out_mean_width"] <= budget["held_out_mean_width_at_nominal"]


def test_shared_budget_writes_the_bands_name_in_the_profile():
    """The allocation works on typed options (band_selection.BudgetOption); what reaches the
    profile is the band's name, a plain string: ``selection.budget.option`` is the name the
    agent is served (``selection.chosen``, e.g. ``order_stat@0.97``, for a moved band), and the
    fitted tables survive a JSON round trip unchanged."""
    rng = np.random.default_rng(3)
    agents = {"orchestrator": (6, 300, 0.3), "websurfer": (1, 900, 1.6)}
    est = OutputLengthIntervals(conditional=False).fit(frame(rng, agents, 150))
    moved = 0
    for e in est.agents_["app"].values():
        option = e["selection"]["budget"]["option"]
        assert type(option) is str, option
        if "group_misses" in e["selection"]["budget"]:      # the budget moved this agent's band
            moved += 1
            assert option == e["selection"]["chosen"] == e["method"]
    assert moved >= 1
    table = est.to_dict()
    assert json.loads(json.dumps(table)) == table


def test_band_warnings_name_wider_bands_and_the_shared_budget():
    from predictors.band_selection import band_warnings
    budget = {"held_out_mean_width": 900.0, "held_out_mean_width_at_nominal": 1500.0}
    section = {"global": {"lo": 0, "hi": 3000}, "workflow_types": {"app": {"lo": 0, "hi": 2000}},
               "agents": {"app": {"narrow": {"lo": 10, "hi": 500, "selection": {"budget": budget}},
                                  "tail": {"lo": 5, "hi": 4000, "selection": {"budget": budget}},
                                  "odd": {"lo": 0, "hi": 2500}}}}
    warn = band_warnings(section)
    assert ("app", "narrow") not in warn
    assert any("workflow type's band (3,995 > 2,000" in n for n in warn[("app", "tail")])
    assert any("global band" in n for n in warn[("app", "tail")])
    assert any("shared coverage budget" in n and "900 vs 1,500" in n for n in warn[("app", "tail")])
    assert not any("budget" in n for n in warn[("app", "odd")])


def test_every_workflow_type_keeps_its_own_coverage_budget():
    """Issue 26 (d): two applications in one log. A log-wide budget could spend the narrow
    type's share of misses on the heavy-tailed one; per type, each type's budget counts only its
    own calls and each type covers new data at nominal (within a point)."""
    heavy = {"orchestrator": (6, 300, 0.3), "websurfer": (1, 900, 1.6)}
    calm = {"planner": (2, 200, 0.2), "coder": (3, 500, 0.25)}

    def log(seed, n):
        a = frame(np.random.default_rng(seed), heavy, n).assign(workflow_type_id="heavy")
        b = frame(np.random.default_rng(seed + 100), calm, n).assign(workflow_type_id="calm")
        b["workflow_id"] = "c" + b["workflow_id"]
        return pd.concat([a, b], ignore_index=True)
    train, test = log(8, 150), log(9, 600)
    est = OutputLengthIntervals(conditional=False).fit(train)
    for wt in ("heavy", "calm"):
        n_type = int((train.workflow_type_id == wt).sum())
        for entry in est.agents_[wt].values():
            budget = entry["selection"]["budget"]
            assert budget["calls"] == n_type, budget   # this type's calls only
            assert budget["held_out_misses"] <= budget["budget_misses"]
        rows = test[test.workflow_type_id == wt]
        b = est.predict(rows)
        y = rows.output_tokens.to_numpy()
        assert np.mean((y >= b[:, 0]) & (y <= b[:, 1])) >= 0.98, wt


def test_one_sided_candidate_is_the_conformal_upper_bound_from_zero():
    y = np.arange(1, 1000)            # 999 values: the one-sided rank is ceil(1000 * 0.99) = 990
    assert candidate_bands(y, 0.99, 5000)["one_sided"] == (0.0, 990.0)
    assert candidate_bands(np.arange(1, 51), 0.99, 5000)["one_sided"] == (0.0, 5000.0)  # n too small: the ceiling


def test_right_skewed_lengths_with_empty_answers_get_the_one_sided_band():
    """A heavy right tail with a few 0-token outputs (an agent that sometimes answers nothing):
    validation picks [0, U(α)], narrower than any two-sided band, and an empty answer is inside
    (a two-sided band's lower end sits above the zeros: issue 26, Who&When's captain_agent)."""
    rng = np.random.default_rng(3)
    calls = frame(rng, {"expert": (5, 400, 1.5)}, n_workflows=300)
    calls.loc[rng.choice(len(calls), 6, replace=False), "output_tokens"] = 0   # 0.4 % empty answers
    est = OutputLengthIntervals(conditional=False, shared_budget=False).fit(calls)
    e = est.agents_["app"]["expert"]
    cands = e["selection"]["candidates"]
    assert e["method"] == "one_sided" and e["lo"] == 0
    assert cands["one_sided"]["accepted"]
    assert cands["one_sided"]["mean_width"] < min(cands[c]["mean_width"] for c in ("order_stat", "empirical"))
    lo, hi, _ = est.predict_band("app", "expert")
    assert lo <= 0 <= hi
    assert "one_sided" not in est.global_["selection"]["candidates"]   # not at the global node


def test_an_unseen_agent_is_served_the_one_sided_type_band_and_an_empty_answer_is_a_hit():
    """Served end to end: a newcomer agent of the type gets the type's one-sided band through the
    Predictor (online calibration on), so its 0-token answer is inside (issue 26: Who&When's
    Ticket_Pricing_Expert, never in training, answered 0 tokens against a lower end of 3)."""
    rng = np.random.default_rng(3)
    calls = frame(rng, {"expert": (5, 400, 1.5)}, n_workflows=300)
    calls.loc[rng.choice(len(calls), 6, replace=False), "output_tokens"] = 0
    est = OutputLengthIntervals(conditional=False).fit(calls)
    assert est.workflow_types_["app"]["method"] == "one_sided"
    pred = Predictor.from_dict({"output_length": json.loads(json.dumps(est.to_dict())),
                                "workflow_types": {"app": {"calls": len(calls)}}})
    meta = {"workflow_type_id": "app", "workflow_id": "w-new", "agent_id": "newcomer"}
    lo, hi = pred.annotate(meta, request_id="r0")["predicted_output_len"]
    assert lo == 0 < hi
    assert pred.observe({"app_metadata": meta, "request_id": "r0", "output_tokens": 0}) is True


def test_conditional_features_need_only_the_feature_columns():
    """The fit hands the conditional model an agent's rows of these columns alone: the feature
    matrix must be the one the whole calls frame gives."""
    from predictors import quantile_tree as qt
    from predictors.output_length import _FEATURE_COLUMNS
    calls = pd.DataFrame({"workflow_id": ["a", "b", "c"], "agent_id": ["x", "y", "x"],
                          "prev_agent_output_tokens": [None, 12.0, 30.0], "input_tokens": [100, 200, None],
                          "agent_call_index": [0, 1, 2], "output_tokens": [5, 6, 7]})
    assert np.array_equal(qt.features(calls[list(_FEATURE_COLUMNS)]), qt.features(calls))
