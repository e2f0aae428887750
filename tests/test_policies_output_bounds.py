"""One-sided output-length bounds U(α) (what the capacity policy splits its risk budget with)."""
from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from predictors.output_length import (
    UPPER_ALPHAS,
    OutputLengthIntervals,
    band_upper_bound,
    upper_prediction_bound,
)
from predictors.contract import Annotation
from policies.capacity import bound_at


def test_upper_bound_is_the_conformal_rank_then_the_ceiling():
    y = np.arange(1, 1000)          # 999 values
    # rank ceil(1000 * 0.99) = 990 exists: the 990th smallest value
    assert upper_prediction_bound(y, 0.01) == 990
    # rank ceil(1000 * 0.9995) = 1000 > 999: nothing certifies it, so the ceiling 2 · 999
    assert upper_prediction_bound(y, 0.0005) == 1998
    assert upper_prediction_bound(y, 0.0005, ceiling=1200) == 1200


def _calls(values, agent="coder", wt="app"):
    return pd.DataFrame([{"workflow_type_id": wt, "workflow_id": f"w{i}", "agent_id": agent,
                          "output_tokens": int(v), "input_tokens": 1000, "prev_agent_output_tokens": None,
                          "agent_call_index": 0} for i, v in enumerate(values)])


def test_below_certified_alpha_the_bound_is_the_ceiling():
    # 99 lengths 1..99: certified_alpha = 1/100; U(0.01) = y_(99) = 99, below it 2 · 99
    est = OutputLengthIntervals(conditional=False).fit(_calls(range(1, 100)))
    band = est.agents_["app"]["coder"]
    assert band["certified_alpha"] == pytest.approx(0.01) and band["ceiling"] == 198
    assert est.upper_bound("app", "coder", 0.01) == 99
    assert est.upper_bound("app", "coder", 0.05) == 95     # rank ceil(100 · 0.95) = 95
    for alpha in (0.005, 0.001, 1e-6):
        assert est.upper_bound("app", "coder", alpha) == 198
    assert max(u for _, u in est.upper_bounds("app", "coder")) == 198
    # the capacity policy reads the same table: past its end, the ceiling
    assert bound_at(est.upper_bounds("app", "coder"), 1e-9) == 198


def test_user_cap_is_the_ceiling_of_bands_and_bounds():
    rng = np.random.default_rng(3)
    y = rng.lognormal(5.0, 1.2, 300).astype(int) + 1
    est = OutputLengthIntervals(conditional=False, max_output_tokens=int(y.max()) + 10).fit(_calls(y))
    band = est.agents_["app"]["coder"]
    assert band["ceiling"] == int(y.max()) + 10
    assert est.upper_bound("app", "coder", 1e-5) == int(y.max()) + 10
    for entry in (band, est.global_, est.workflow_types_["app"]):
        assert entry["hi"] <= entry["ceiling"]


def test_no_extrapolation_past_twice_the_largest_length():
    # the case: a lognormal table gave 88k–130k at α = 0.001 for a 5.8k maximum
    rng = np.random.default_rng(4)
    y = np.minimum(rng.lognormal(6.0, 1.0, 400).astype(int), 5800)
    est = OutputLengthIntervals(conditional=False).fit(_calls(y))
    assert est.upper_bound("app", "coder", 0.001) <= 2 * 5800


@pytest.mark.parametrize("values", [[3, 40, 2000], [7], [7, 9], [5] * 40, [0] * 30,
                                    [3, 10**15, 10**17, 12], [0, 0, 1]])
def test_degenerate_inputs_never_crash_a_fit(values):
    df = pd.concat([_calls(values, "odd"), _calls(np.arange(50, 250), "main")])
    est = OutputLengthIntervals().fit(df)
    band = est.agents_["app"]["odd"]
    assert 0 <= band["lo"] <= band["hi"] <= band["ceiling"]
    for alpha in UPPER_ALPHAS:
        assert est.upper_bound("app", "odd", alpha) <= band["ceiling"]
    if len(values) < 3:
        assert band["method"] == "parent" and "too few" in band["fallback_reason"]
    json.dumps(est.to_dict())  # the profile stays serializable


def test_all_in_one_workflow_falls_back_and_says_why():
    df = _calls(np.arange(50, 250), "main")
    one = _calls([10, 20, 30, 40]).assign(workflow_id="w0", agent_id="loop")
    est = OutputLengthIntervals().fit(pd.concat([df, one]))
    assert "one workflow" in est.agents_["app"]["loop"]["fallback_reason"]


def test_old_profile_entries_still_serve_bounds():
    # an entry from before certified_alpha/ceiling: the table, then the lognormal tail
    old = {"coverage": 0.99, "params": {"coverage": 0.99, "min_calls": 50, "conditional": True,
                                        "cond_min_cv": 0.3, "cond_min_calls": 400,
                                        "cond_max_samples": 3000, "random_state": 0},
           "global": {"lo": 1, "hi": 900, "n": 500, "level": "global"},
           "workflow_types": {"app": {"lo": 1, "hi": 900, "n": 500}},
           "agents": {"app": {"coder": {"lo": 5, "hi": 800, "n": 500, "level": "agent", "conditional": None,
                                        "upper": {"0.01": 700, "0.001": 790}, "log_mu": 5.0, "log_sigma": 1.0}}}}
    est = OutputLengthIntervals.from_dict(old)
    assert est.upper_bound("app", "coder", 0.01) == 700
    assert est.upper_bound("app", "coder", 1e-4) >= 790
    assert est.predict_band("app", "new_agent")[:2] == (1, 900)  # type had ≥ min_calls calls


def test_bimodal_agent_tracking_its_call_index_gets_a_conditional_band():
    rng = np.random.default_rng(1)
    rows = []
    for w in range(20):            # 80 calls: even calls ~4 tokens, odd ones 200–1,500 by index
        prev = None
        for i in range(4):
            y = int(rng.integers(2, 7)) if i % 2 == 0 else int(200 + 1300 * (i / 3) * rng.uniform(0.8, 1.0))
            rows.append({"workflow_type_id": "app", "workflow_id": f"w{w}", "agent_id": "bi",
                         "output_tokens": y, "input_tokens": 100, "prev_agent_output_tokens": prev,
                         "agent_call_index": i})
            prev = y
    df = pd.concat([pd.DataFrame(rows), _calls(rng.lognormal(6, 0.5, 60).astype(int), "other")])
    est = OutputLengthIntervals().fit(df)
    band = est.agents_["app"]["bi"]
    top = max(r["output_tokens"] for r in rows)
    assert band["hi"] <= 2 * top          # not 24× its maximum
    assert band["selection"]["chosen"] == "conditional"
    lo, hi, level = est.predict_band("app", "bi", {"prev_agent_output_tokens": 1400, "input_tokens": 100,
                                                   "agent_call_index": 2})
    assert level == "conditional" and hi < 50   # a short call after a long one


def test_fitted_bands_carry_a_table_that_covers_new_lengths():
    rng = np.random.default_rng(0)
    rows = [{"workflow_type_id": "app", "workflow_id": f"w{i}", "agent_id": "coder",
             "output_tokens": int(v), "input_tokens": 1000, "prev_agent_output_tokens": None,
             "agent_call_index": 0} for i, v in enumerate(rng.lognormal(6.0, 0.5, 3000))]
    est = OutputLengthIntervals(conditional=False).fit(pd.DataFrame(rows))
    band = est.agents_["app"]["coder"]
    assert band["log_mu"] == pytest.approx(6.0, abs=0.05) and band["log_sigma"] == pytest.approx(0.5, abs=0.03)
    table = est.upper_bounds("app", "coder")
    assert [a for a, _ in table] == sorted(UPPER_ALPHAS, reverse=True)
    values = [u for _, u in table]
    assert values == sorted(values)                       # smaller risk, larger bound
    new = rng.lognormal(6.0, 0.5, 200_000)
    for alpha in (0.05, 0.01, 0.001):
        # conformal coverage given one fit is Beta-distributed around 1 - α (sd ≈ √(α/n))
        miss = float(np.mean(new > est.upper_bound("app", "coder", alpha)))
        assert miss <= alpha + 3 * math.sqrt(alpha * (1 - alpha) / 3000), (alpha, miss)
    # between tabulated risks the bound of the next smaller tabulated risk is used
    assert est.upper_bound("app", "coder", 0.03) == dict(table)[0.02]
    again = OutputLengthIntervals.from_dict(est.to_dict())
    assert again.upper_bound("app", "coder", 0.001) == est.upper_bound("app", "coder", 0.001)


def test_profiles_without_the_table_fall_back_to_mean_and_cv():
    band = {"lo": 10, "hi": 500, "n": 400, "mean": 200.0, "cv": 0.5}
    s2 = math.log1p(0.25)
    by_hand = math.exp(math.log(200.0) - s2 / 2 + stats.t.isf(0.001, 399) * math.sqrt(s2) * math.sqrt(1 + 1 / 400))
    assert band_upper_bound(band, 0.001) == math.ceil(by_hand)
    assert band_upper_bound({"lo": 1, "hi": 77, "n": 3}, 0.01) == 77
    with pytest.raises(ValueError):
        band_upper_bound(band, 0.0)


def test_annotation_reads_the_table_from_sys_annotations():
    ann = {"known": True, "output_len_upper": [[0.01, 200], [0.1, 100], ["x", 3], [2.0, 9]],
           "output_len_mean": 80.5, "session_age_s": 12.0, "p_end": 0.25}
    got = Annotation.from_dict(ann, {"workflow_id": "w"})
    assert got.output_len_upper == ((0.1, 100), (0.01, 200)) and got.workflow_id == "w"
    assert got.output_len_mean == 80.5 and got.session_age_s == 12.0 and got.p_end == 0.25
