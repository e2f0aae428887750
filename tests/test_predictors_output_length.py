"""Output-length bands: coverage, fallback levels, the conditional (CQR) model."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictors.output_length import OutputLengthIntervals, conformal_band


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


def test_sparse_agent_falls_back_to_workflow_type_then_global():
    rng = np.random.default_rng(2)
    df = frame(rng, {"common": (2, 500, 0.3)}, 100)
    rare = frame(rng, {"rare": (1, 50, 0.1)}, 10)
    other = frame(rng, {"solo": (1, 80, 0.1)}, 5).assign(workflow_type_id="tiny")
    est = OutputLengthIntervals(min_calls=50, conditional=False).fit(pd.concat([df, rare, other]))
    assert est.agents_["app"]["common"]["level"] == "agent"
    assert est.agents_["app"]["rare"]["level"] == "workflow_type"
    assert est.agents_["tiny"]["solo"]["level"] == "global"
    lo, hi, level = est.predict_band("app", "never_seen")
    assert level == "workflow_type"
    assert est.predict_band("unknown_type", "x")[2] == "global"


def test_conditional_model_used_only_when_it_is_narrower():
    agents = {"engineer": (6, 3000, 0.6)}
    correlated = frame(np.random.default_rng(3), agents, 400, rho=0.9)
    est = OutputLengthIntervals(coverage=0.9).fit(correlated)
    band = est.agents_["app"]["engineer"]
    assert band["conditional"] is not None, band
    v = band["conditional"]["validation"]
    assert v["mean_width"] < v["marginal_width"]
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
