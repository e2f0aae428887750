"""``bench/engine_resimulate.py`` on a stored real-engine run, without an engine: at the run's
own settings the simulated replica sends the prompts the engine counted (the replay's sizing
with the engine's chat template, not the recorded token counts), open loop released at the
replay's Poisson times, and a what-if ``rate`` changes the arrivals and so the prediction (how
``open-contention``'s CPU rate was chosen, docs/sglang.md)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bench.engine_calls import load_call_records, run_records
from bench.engine_resimulate import rebuild, simulate_condition, simulated_runs, stored_template
from bench.engine_sim import CHATML, ChatTemplate, scaled_records

MEASUREMENTS = Path(__file__).resolve().parents[1] / "docs" / "measurements"
RUN = MEASUREMENTS / "engine-open-contention-s9-a-2026-11-29.json"


@pytest.mark.slow
def test_stored_run_replayed_with_the_engines_prompts_and_rate_what_if() -> None:
    cond = json.loads(RUN.read_text())["conditions"]["open-contention"]
    runs, names, seeds = simulated_runs(cond, seeds=[0])
    assert seeds == [0] and names == ["round-robin", "hints"]
    engine = run_records(load_call_records(MEASUREMENTS / "engine-s9-2026-11-29-calls.tar.gz"),
                         cond["settings"]["out"], "open-contention-hints-seed0")
    counted = sum(r["input_tokens"] for r in engine if r["status"] == "ok")
    st, _, _, _, wl = rebuild(cond, seeds=[0])
    recorded = sum(r["input_tokens"] for r in scaled_records(wl.replay[0], 1.0, st["time_scale"]))
    simulated = sum(q.input_tokens for q in runs[0]["hints"].requests)
    assert recorded < 0.95 * counted                      # the template's tokens: ~8 % more
    assert simulated == pytest.approx(counted, rel=0.02)  # the simulated replica counts them too
    sim, _, _ = simulate_condition(cond, seeds=[0])
    faster, _, _ = simulate_condition(cond, rate=2.6, seeds=[0])
    # more arrivals per second on the same replica: a longer queue, longer jobs in both arms
    for arm in names:
        assert faster[0][arm]["jct_avg_s"] > sim[0][arm]["jct_avg_s"] * 1.05


def test_a_stored_template_is_used_and_an_older_run_gets_the_bench_models() -> None:
    measured = {"msg_tokens": 7, "gen_tokens": 2, "reply_words": 0.75, "source": "calibration replay"}
    assert stored_template({"simulator": {"template": measured}}) == ChatTemplate(7, 2, 0.75, "calibration replay")
    assert stored_template({"simulator": {"step": {}}}) is CHATML
    # what bench_engine.py stores (dataclasses.asdict of the template it sized prompts with)
    assert stored_template({"simulator": {"template": dataclasses.asdict(CHATML)}}) == CHATML


def test_a_router_run_is_rebuilt_without_sglang_router_installed(monkeypatch) -> None:
    """Re-simulating a stored run starts no server, so it must not need sglang-router (the README's
    test block runs without the SGLang stack)."""
    from bench import bench_engine

    monkeypatch.setattr(bench_engine, "router_available", lambda: False)
    stored = RUN.parent / "engine-platform-contention-s10-2026-11-29.json"
    cond = json.loads(stored.read_text())["conditions"]["platform-contention"]
    st, names, seeds, _, _ = rebuild(cond, seeds=[0])
    assert (names, seeds, st["estimate"]) == (["router", "hints"], [0], False)


def test_plain_and_hicache_arms_share_the_cores_as_measured(monkeypatch) -> None:
    """Each arm's replicas slow each other by the share measured for their kind
    (``engine_sim.COMPUTE_SHARE``): a plain pair (router, round robin, routing-only) less than a
    HiCache pair (full sharing, until a calibration with both replicas busy measures it)."""
    from bench import engine_sim
    from simulator import engine as sim_engine

    seen: list[tuple[float, float]] = []
    real_init = sim_engine.Simulator.__init__

    def spy(self, wl, policy, config, *a, **k):
        seen.append((config.compute_share, config.host_ratio))
        real_init(self, wl, policy, config, *a, **k)

    monkeypatch.setattr(sim_engine.Simulator, "__init__", spy)
    monkeypatch.setattr(sim_engine.Simulator, "run", lambda self: None)
    cond = json.loads((RUN.parent / "engine-platform-contention-s10-2026-11-29.json").read_text())
    cond = cond["conditions"]["platform-contention"]
    cond["settings"]["setups"] = ["router", "routing-only", "hints", "no-retention"]
    simulated_runs(cond, seeds=[0])
    share = engine_sim.COMPUTE_SHARE
    assert share["plain"] < share["hicache"] <= 1.0
    # in the order of the set-ups: router, routing-only (plain SGLang), hints, no-retention
    assert seen == [(share["plain"], 0.0), (share["plain"], 0.0),
                    (share["hicache"], engine_sim.HICACHE_RATIO), (share["hicache"], engine_sim.HICACHE_RATIO)]
