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


def test_a_fit_on_reported_cache_hits_charges_the_context_term_on_hits_too():
    """The bundled traces report no cached tokens: their context term stays a miss's cost. A fit
    on an engine that reports its hits (``cached_tokens``, SGLang's --enable-cache-report) saw hits
    pay ``a_ctx · input`` (TTFT ≈ p0 + a·new + a_ctx·input), so the simulator charges it on hits."""
    records = [json.loads(line) for line in DATA.open()]
    assert fit_step_time(records).ctx_on_hits is False
    hit = [{**r, "cached_tokens": r["input_tokens"] // 2} for r in records]
    assert fit_step_time(hit).ctx_on_hits is True

    from dataclasses import replace

    from simulator.baselines import BASELINES
    from simulator.config import ClusterConfig
    from simulator.engine import Simulator
    from simulator.workload import workload_from_records
    from tests.simulator_helpers import rec

    # A then its continuation: the second call's path is a hit; ctx_on_hits makes it pay a_ctx·ctx
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 1000, 10), rec("A", 2, 2.0, 3.0, 1100, 10)])
    step = replace(SWE_AGENT_GLM45, a_ctx=1e-4)

    def second_ttft(model) -> float:
        res = Simulator(wl, BASELINES["sglang-default"](), ClusterConfig(replicas=1, host_ratio=0.0, step=model),
                        [0.0]).run()
        second = max(res.requests, key=lambda r: r.t_issue)
        assert second.gpu_hit > 0
        return second.t_first - second.t_issue

    assert second_ttft(replace(step, ctx_on_hits=True)) > second_ttft(step) + 0.09   # ≈ 1e-4 × 1,100 tokens
