"""Roofline step time from a named GPU and model, and the two engine fixes it came with."""
from __future__ import annotations

import pytest

from simulator.baselines import BASELINES
from simulator.calibration import StepTimeModel
from simulator.config import ClusterConfig, hardware_config
from simulator.engine import Simulator
from simulator.hardware import H100_SXM, LLAMA31_8B, kv_capacity_tokens, roofline_step
from simulator.workload import workload_from_records
from tests.simulator_helpers import rec


def test_roofline_constants_for_llama_8b_on_h100():
    st = roofline_step(H100_SXM, LLAMA31_8B)
    # weights: 16.06 GB at 0.8 × 3.35 TB/s = 6.0 ms, + 2 ms overhead
    assert st.t0 == pytest.approx(0.002 + 16.06e9 / (0.8 * 3.35e12), rel=1e-3)
    # KV read: 131,072 B per token at 2.68 TB/s ≈ 49 ns
    assert st.a_ctx == pytest.approx(131072 / 2.68e12, rel=1e-3)
    # prefill GEMMs: 2 × 8.03e9 FLOP per token at 0.55 × 989 TFLOP/s ≈ 29.5 µs (≈ 34k tok/s)
    assert st.a == pytest.approx(2 * 8.03e9 / (0.55 * 989e12), rel=1e-3)
    assert 390_000 < kv_capacity_tokens(H100_SXM, LLAMA31_8B) < 400_000
    # decode of 256 sequences reading a full KV pool: well under the fitted 54.6 ms of the issue
    assert st.decode_step(396_000, 256) < 0.040
    assert hardware_config("h200").step.t0 < st.t0       # more bandwidth, shorter iteration
    with pytest.raises(ValueError, match="--gpu"):
        hardware_config("a100")


def _mixed_run(step: StepTimeModel):
    # A decodes alone; B arrives while A decodes: their shared iteration is B's prefill + A's token
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 50), rec("B", 1, 0.0, 1.0, 200, 2)])
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=step,
                        new_token_ratio=0.0)
    return Simulator(wl, BASELINES["sglang-default"](), cfg, [0.0, 0.105]).run()


def test_mixed_iteration_does_not_count_the_decode_fixed_cost_twice():
    # fitted-style model: prefill 1 ms/token (weights inside `a`), decode 10 ms fixed
    step = StepTimeModel(t0=0.01, a=0.001, a_ctx=0.0, c=0.0)
    res = _mixed_run(step)
    a, b = res.requests
    # A: prefill 0.100, first token at 0.100; B issued at 0.105, during A's first decode step
    # (0.100–0.110). Next iteration 0.110: B's 200-token prefill + A's token = 0.200 (not 0.210)
    assert b.t_first == pytest.approx(0.310)


def test_full_path_hit_pays_no_fitted_context_charge():
    step = StepTimeModel(t0=0.01, a=0.001, a_ctx=0.001, c=0.0)
    wl = workload_from_records([rec("W", 1, 0.0, 0.5, 100, 10), rec("W", 2, 1.5, 2.0, 120, 5)])
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=step,
                        new_token_ratio=0.0)
    res = Simulator(wl, BASELINES["sglang-default"](), cfg, [0.0]).run()
    c1, c2 = res.requests
    # call 1 misses: 100 × (0.001 + 0.001) = 0.200; call 2's path (110 tokens) is all cached:
    # its 10 own tokens cost 0.010, with no 0.120 s context charge
    assert c1.t_first == pytest.approx(0.200)
    assert c2.t_first - c2.t_issue == pytest.approx(0.010)
