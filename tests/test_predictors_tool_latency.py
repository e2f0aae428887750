"""Tool-latency lognormals: MLE, KS flag, empirical fallback, TTL, lookup fallback."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from predictors.tool_latency import ToolLatencyModel
from policies import lognormal_quantile


def frame(wt, tool, x):
    return pd.DataFrame({"workflow_type_id": wt, "tool_name": tool, "latency_s": x})


def test_mle_recovers_parameters_and_ttl_is_p95():
    rng = np.random.default_rng(0)
    x = np.exp(rng.normal(np.log(0.18), 1.2, 5000))
    m = ToolLatencyModel().fit(frame("app", "run_code", x))
    e = m.lookup("app", "run_code")
    assert e["mu"] == pytest.approx(np.log(0.18), abs=0.05)
    assert e["sigma"] == pytest.approx(1.2, abs=0.05)
    assert not e["poor_fit"] and e["ks"] < 0.03
    assert e["ttl_s"] == pytest.approx(lognormal_quantile(e["mu"], e["sigma"], 0.95))
    assert e["emp_p95_s"] == pytest.approx(e["p95_s"], rel=0.1)


def test_bimodal_latency_is_flagged_and_served_empirically():
    rng = np.random.default_rng(1)
    x = np.concatenate([rng.normal(0.1, 0.005, 500), rng.normal(5.0, 0.1, 500)])
    e = ToolLatencyModel().fit(frame("app", "cache_or_net", x)).lookup("app", "cache_or_net")
    assert e["poor_fit"] and e["source"] == "empirical"
    assert e["p95_s"] == pytest.approx(np.quantile(x, 0.95))


def test_ttl_is_capped_and_unknown_workflow_type_falls_back_to_pooled_tool():
    rng = np.random.default_rng(2)
    x = np.exp(rng.normal(np.log(100.0), 0.3, 200))
    m = ToolLatencyModel(max_ttl_s=30).fit(pd.concat([frame("a", "slow", x), frame("a", "rare", [1.0, 2.0])]))
    assert m.lookup("a", "slow")["ttl_s"] == 30
    assert m.lookup("b", "slow") is m.global_tools_["slow"]
    assert m.lookup("a", "rare") is None  # fewer than min_samples
    assert ToolLatencyModel.from_dict(m.to_dict()).lookup("a", "slow") == m.lookup("a", "slow")
