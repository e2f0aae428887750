"""The bundled step-time constant is what the calibration fits on the bundled traces."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.calibration import SWE_AGENT_GLM45, fit_step_time

DATA = Path(__file__).resolve().parents[1] / "datasets" / "swe_agent" / "swe_agent_glm45_bs4.jsonl"


def test_fit_on_bundled_swe_agent_traces_matches_the_default_model():
    records = [json.loads(line) for line in DATA.open()]
    fit = fit_step_time(records, source="test")
    for field in ("t0", "a", "a_ctx", "c"):
        assert getattr(fit, field) == pytest.approx(getattr(SWE_AGENT_GLM45, field), rel=0.02), field
    assert fit.n_prefill == 205                       # the calls served alone (num_workers == 1)
    assert fit.prefill_mdape < 0.25 and fit.decode_mdape < 0.35


def test_step_model_is_monotone_in_its_inputs():
    m = SWE_AGENT_GLM45
    assert m.decode_step(200_000) > m.decode_step(10_000) > 0
    assert m.prefill_cost(2000, 10_000) > m.prefill_cost(1000, 10_000) > 0


def test_calibration_needs_first_token_times():
    with pytest.raises(ValueError, match="t_first_token"):
        fit_step_time([{"workflow_id": "w", "t_arrival": 0.0, "t_finish": 1.0,
                        "input_tokens": 10, "output_tokens": 5}])


def test_calibration_without_decode_samples_says_what_it_needs():
    recs = [{"workflow_id": f"w{i}", "t_arrival": 0.0, "t_first_token": 0.1 + i / 100, "t_finish": 0.2 + i / 100,
             "input_tokens": 100 + i, "output_tokens": 4} for i in range(12)]
    with pytest.raises(ValueError, match="at least 16 output tokens: 0 of 12"):
        fit_step_time(recs)
