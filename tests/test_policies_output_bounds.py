"""One-sided output-length bounds U(α) (what the capacity policy splits its risk budget with)."""
from __future__ import annotations

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
from serving_hooks.policies import CallView


def test_upper_bound_is_the_conformal_rank_then_the_lognormal_tail():
    y = np.arange(1, 1000)          # 999 values
    # rank ceil(1000 * 0.99) = 990 exists: the 990th smallest value
    assert upper_prediction_bound(y, 0.01) == 990
    # rank ceil(1000 * 0.9995) = 1000 > 999: the lognormal one-sided bound
    z = np.log(y)
    mu, sd = z.mean(), z.std(ddof=1)
    by_hand = math.exp(mu + stats.t.isf(0.0005, 998) * sd * math.sqrt(1 + 1 / 999))
    assert upper_prediction_bound(y, 0.0005) == math.ceil(by_hand)


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


def test_call_view_reads_the_table_from_the_annotation():
    ann = {"known": True, "output_len_upper": [[0.01, 200], [0.1, 100], ["x", 3], [2.0, 9]],
           "output_len_mean": 80.5, "session_age_s": 12.0, "p_end": 0.25}
    view = CallView.from_sys_annotations(ann, {"workflow_id": "w"})
    assert view.upper_bounds == ((0.1, 100), (0.01, 200))
    assert view.pred_out_mean == 80.5 and view.session_age_s == 12.0 and view.p_end == 0.25
