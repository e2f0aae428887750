"""``bench/engine_calls.py`` and the fidelity's same-seed ratio without an engine: the per-call
split of hand-made engine records and of a hand-checked simulator run, reading a run's records
from a folder or a .tar.gz, and a simulated ratio judged on the seeds the measurement kept."""
from __future__ import annotations

import json
import tarfile

import pytest

from bench.engine_calls import (first_token_groups, load_call_records, matched_calls, measured_split, run_records,
                                simulated_split)
from bench.engine_report import same_seed_ratios
from simulator.baselines import FCFS, LRU, RoundRobin
from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.policy import Policy
from simulator.workload import workload_from_records
from tests.simulator_helpers import STEP, rec


def call(wf: str, arrival: float, first: float, end: float, prompt: int, out: int, cached: int) -> dict:
    return {"request_id": f"{wf}#{arrival}-ro0", "workflow_id": wf, "t_arrival": arrival, "t_first_token": first,
            "t_finish": end, "input_tokens": prompt, "output_tokens": out, "cached_tokens": cached, "status": "ok"}


def test_measured_split_of_engine_records() -> None:
    # workflow a: two calls back to back with a 1 s tool gap; workflow b: one call beside them
    recs = [call("a", 0.0, 0.5, 1.5, 100, 11, 0), call("a", 2.5, 2.7, 3.7, 200, 11, 100),
            call("b", 1.0, 1.1, 2.1, 100, 6, 50)]
    m = measured_split(recs)
    assert m["calls"] == 3
    assert m["wait_prefill_s"] == pytest.approx((0.5 + 0.2 + 0.1) / 3)
    assert m["decode_ms_per_token"] == pytest.approx(1e3 * (1.0 / 10 + 1.0 / 10 + 1.0 / 5) / 3)
    assert m["latency_s"] == pytest.approx((1.5 + 1.2 + 1.1) / 3)
    assert m["in_flight"] == pytest.approx(3.8 / 3.7)               # Σ latency over the span 0 -> 3.7
    assert m["jct_avg_s"] == pytest.approx((3.7 + 1.1) / 2)
    assert m["outside_calls_share"] == pytest.approx(1 - (2.7 + 1.1) / 4.8)   # a's 1 s gap
    assert m["cached_share"] == pytest.approx(150 / 400) and m["prompt_tokens"] == 400
    with pytest.raises(ValueError, match="no successful call"):
        measured_split([{**recs[0], "status": "error"}])


def test_simulated_split_of_a_hand_checked_run() -> None:
    # the hand-checked case of tests/test_simulator_engine.py: A (100 in, 10 out) and B (50, 5) on
    # one replica at t=0: one 0.150 s prefill, B done at 0.190, A at 0.240
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 50, 5)])
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP, new_token_ratio=0.0)
    s = simulated_split(Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()), cfg, [0.0, 0.0]).run())
    assert s["wait_prefill_s"] == pytest.approx(0.150)
    assert s["decode_ms_per_token"] == pytest.approx(10.0)          # 10 ms per decode iteration
    assert s["jct_avg_s"] == pytest.approx((0.240 + 0.190) / 2)
    assert s["in_flight"] == pytest.approx((0.240 + 0.190) / 0.240)
    assert s["calls_per_replica"] == [2] and s["cached_share"] == 0.0 and s["outside_calls_share"] == pytest.approx(0)


def test_each_simulated_call_beside_the_engines_record_of_it() -> None:
    # the hand-checked run above (both admitted at 0, first tokens at 0.150 s); the engine's ids
    # carry the bench's arm-and-seed suffix, and it took 0.4 s to A's first token, 0.2 s to B's
    wl = workload_from_records([rec("A", 1, 0.0, 1.0, 100, 10), rec("B", 1, 0.0, 1.0, 50, 5)])
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=100_000, host_ratio=0.0, step=STEP, new_token_ratio=0.0)
    res = Simulator(wl, Policy("rr", RoundRobin(), FCFS(), LRU()), cfg, [0.0, 0.0]).run()
    engine = [{**call("A", 5.0, 5.4, 6.0, 100, 10, 0), "request_id": "A#1-hi3"},
              {**call("B", 5.0, 5.2, 6.0, 50, 5, 0), "request_id": "B#1-hi3"},
              {**call("C", 5.0, 5.2, 6.0, 50, 5, 0), "request_id": "C#1-hi3", "status": "error"}]
    pairs = sorted(matched_calls(engine, res), key=lambda c: c["new_tokens"])
    assert [c["new_tokens"] for c in pairs] == [50, 100]           # C failed on the engine: not matched
    assert [c["measured_s"] for c in pairs] == pytest.approx([0.2, 0.4])
    assert [c["simulated_s"] for c in pairs] == pytest.approx([0.150, 0.150])
    assert all(c["simulated_wait_s"] == 0.0 and c["host_hit"] == 0 for c in pairs)
    groups = first_token_groups(pairs)
    assert groups["no simulated wait"]["calls"] == 2 and "simulated wait" not in groups
    assert groups["no simulated wait"]["measured_mean_s"] == pytest.approx(0.3)
    assert groups["no simulated wait"]["measured_p10_s"] == pytest.approx(0.22)   # numpy's linear 10th percentile
    assert groups["new tokens < 100"]["calls"] == groups["new tokens 100-299"]["calls"] == 1
    assert "host-tier hit" not in groups


def test_call_records_from_a_folder_or_an_archive_and_the_runs_own_folder_first(tmp_path) -> None:
    for folder in ("platform-calls", "other-calls"):
        (tmp_path / "runs" / folder).mkdir(parents=True)
        rows = [call(folder, 0.0, 0.1, 0.2, 10, 2, 0)]
        (tmp_path / "runs" / folder / "pc-router-seed0.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    with tarfile.open(tmp_path / "calls.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "runs", arcname=".")
    for source in (tmp_path / "runs", tmp_path / "calls.tar.gz"):
        recs = load_call_records(source)
        assert run_records(recs, "/tmp/x/platform.json", "pc-router-seed0")[0]["workflow_id"] == "platform-calls"
        with pytest.raises(ValueError, match="several"):
            run_records(recs, None, "pc-router-seed0")
        with pytest.raises(ValueError, match="none"):
            run_records(recs, None, "pc-hints-seed0")
    (tmp_path / "runs" / "other-calls" / "pc-router-seed0.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="line 1"):
        load_call_records(tmp_path / "runs")


def test_the_simulated_ratio_is_judged_on_the_seeds_the_measurement_kept() -> None:
    per_seed = {s: {"router": {"jct_avg_s": 10.0, "jct_p95_s": 20.0},
                    "hints": {"jct_avg_s": v, "jct_p95_s": 20.0}} for s, v in ((0, 8.0), (1, 9.0), (2, 6.0))}
    measured = {"hints/router": {"mean_avg": 0.95, "withheld": [{"seed": 0, "reason": "queue empty"},
                                                                {"seed": "2", "reason": "queue empty"}]}}
    r = same_seed_ratios(per_seed, ["router", "hints"], measured)["hints/router"]
    assert r["mean_avg"] == pytest.approx(0.9) and r["n"] == 1 and r["withheld"] == ["0", "2"]
    assert same_seed_ratios(per_seed, ["router", "hints"], {})["hints/router"]["mean_avg"] == pytest.approx(23 / 30)


@pytest.mark.slow
def test_the_bench_models_template_is_what_a_stored_run_measures() -> None:
    """``--fit-template`` on a stored run's records finds the template the simulated replica
    uses (bench.engine_sim.CHATML), and it reproduces the engine's prompt counts to a few tokens
    per call where the recorded counts miss by ~8 %."""
    from pathlib import Path

    from bench.engine_calls import fit_template
    from bench.engine_sim import CHATML

    here = Path(__file__).resolve().parents[1] / "docs" / "measurements"
    cond = json.loads((here / "engine-platform-contention-s9-2026-11-29.json").read_text())["conditions"]
    # every seed of the run: seed 0 alone fits 7 tokens per message, the six seeds together 6 (as the s10 runs)
    tpl = fit_template(cond["platform-contention"], load_call_records(here / "engine-s9-2026-11-29-calls.tar.gz"))
    assert (tpl.msg_tokens, tpl.gen_tokens, tpl.reply_words) == (CHATML.msg_tokens, CHATML.gen_tokens,
                                                                 CHATML.reply_words)
    assert float(tpl.source.split("mean error ")[1].split()[0]) < 10
