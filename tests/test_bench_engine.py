"""``bench/bench_engine.py`` without an engine: the interval math, the condition presets and their
workloads, the queue-depth and counter parsing of SGLang logs, and the JSON shape of a condition.
(The real-server path is exercised by tests/sglang/test_real_server.py and by running the bench.)"""
from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from scipy import stats

from bench import bench_engine as be
from bench.engine_conditions import (CONDITIONS, OPEN_PLATFORM_RATE_CPU, condition_settings, prepare_workload,
                                     scale_records, seed_slice)
from bench.engine_report import (engine_counters, fidelity, queue_samples, queue_summary, ratio_pairs, ratios,
                                 t_interval)



@pytest.fixture(autouse=True)
def _router_installed(monkeypatch):
    """These tests parse flags and build workloads; none starts the router. Without the optional
    ``sglang-router`` wheel (the README's venv) the bench refuses a 'router' set-up at parse time,
    which is right for a run and beside the point here."""
    monkeypatch.setattr(be, "router_available", lambda: True)


# lines as SGLang 0.5.23 writes them (scheduler_components/metrics_reporter.py), two replicas' worth
PREFILL = ("[2026-11-26 13:30:01] Prefill batch, #new-seq: 1, #new-token: {n}, #cached-token: 0, token usage: 0.41, "
           "#running-req: {r}, #queue-req: {q}, #pending-token: 0, ")
DECODE = ("[2026-11-26 13:30:02] Decode batch, #running-req: {r}, #token: 812, token usage: 0.41, cpu graph: False, "
          "gen throughput (token/s): 310.22, #queue-req: {q}")


def test_t_interval_is_the_student_t_interval_over_seeds() -> None:
    x = [0.8, 0.9, 1.1, 1.0, 0.7]
    got = t_interval(x)
    half = stats.t.ppf(0.975, 4) * np.std(x, ddof=1) / math.sqrt(5)
    assert got["mean"] == pytest.approx(0.9)
    assert (got["lo"], got["hi"]) == (pytest.approx(0.9 - half), pytest.approx(0.9 + half))
    assert got["hi"] - got["lo"] == pytest.approx(2 * 2.776445 * 0.158114 / math.sqrt(5), rel=1e-5)
    wider = t_interval(x, level=0.99)
    assert wider["lo"] < got["lo"] and wider["hi"] > got["hi"]
    assert t_interval([1.2])["lo"] is None and t_interval([1.2])["mean"] == 1.2
    same = t_interval([1.0, 1.0, 1.0])
    assert same["lo"] == same["hi"] == 1.0
    assert t_interval([])["n"] == 0
    with pytest.raises(ValueError, match="level"):
        t_interval(x, level=95)


def test_ratios_per_seed_with_intervals_against_both_baselines() -> None:
    per_seed = {s: {"round-robin": {"jct_avg_s": 10.0, "jct_p95_s": 20.0},
                    "router": {"jct_avg_s": 8.0 + s, "jct_p95_s": 16.0},
                    "hints": {"jct_avg_s": 8.0, "jct_p95_s": 12.0 + s}} for s in range(3)}
    names = ["round-robin", "router", "hints"]
    assert ratio_pairs(names) == [("router", "round-robin"), ("hints", "round-robin"), ("hints", "router")]
    r = ratios(per_seed, names)
    assert set(r) == {"router/round-robin", "hints/round-robin", "hints/router"}
    h = r["hints/router"]
    assert h["avg"] == [pytest.approx(1.0), pytest.approx(8 / 9), pytest.approx(0.8)]
    assert h["mean_avg"] == pytest.approx(np.mean([1.0, 8 / 9, 0.8]))
    assert h["ci_avg"][0] < h["mean_avg"] < h["ci_avg"][1]
    assert r["hints/round-robin"]["ci_avg"] == [pytest.approx(0.8), pytest.approx(0.8)]   # no spread
    assert r["hints/round-robin"]["p95"] == [pytest.approx(0.6), pytest.approx(0.65), pytest.approx(0.7)]
    assert ratio_pairs(["hints", "no-priority"]) == [("hints", "no-priority")]   # no baseline: the first arm over the rest
    assert ratio_pairs(["hints"]) == []


def test_condition_presets_change_one_thing_and_the_command_line_wins() -> None:
    d = be.DEFAULTS["cpu"]
    assert set(CONDITIONS) == {"default", "many-in-flight", "tight-pool", "recorded-gaps", "multi-agent",
                               "agent-platform", "contention", "kv-pressure", "platform-contention", "open-contention",
                               "open-platform-contention"}
    unset = {k: None for k in d}
    base = condition_settings("default", unset, d)
    assert base == d
    for name, changed in (("many-in-flight", {"concurrency": 3 * d["concurrency"]}),
                          ("tight-pool", {"pool_tokens": int(0.6 * d["pool_tokens"])}),
                          ("recorded-gaps", {"time_scale": 1.0}), ("multi-agent", {}), ("agent-platform", {})):
        got = condition_settings(name, unset, d)
        assert {k: v for k, v in got.items() if v != base[k]} == changed, name
    assert condition_settings("tight-pool", {**unset, "pool_tokens": 900}, d)["pool_tokens"] == 900
    gpu = condition_settings("many-in-flight", unset, be.DEFAULTS["gpu"])
    assert gpu["concurrency"] == 3 * be.DEFAULTS["gpu"]["concurrency"]
    with pytest.raises(ValueError, match="unknown condition 'nope'"):
        condition_settings("nope", unset, d)


def test_command_line_conditions_and_arms() -> None:
    args = be.parse_args(["--condition", "multi-agent", "tight-pool", "--seeds", "0", "1", "--ablation",
                          "--setups", "round-robin", "hints"])
    assert args.setups == ["round-robin", "hints"]
    assert be.condition_args(args, "multi-agent").setups == [
        "round-robin", "hints", "routing-only", "no-priority", "no-retention", "no-prefetch", "no-host-tier",
        "no-routing"]
    tight = be.condition_args(args, "tight-pool")
    assert (tight.condition, tight.pool_tokens, tight.max_running) == ("tight-pool", 1200, 8)
    assert be.condition_args(args, "multi-agent").pool_tokens == 2000
    assert args.pool_tokens is None                        # the parsed args stay unfilled
    with pytest.raises(SystemExit):
        be.parse_args(["--condition", "nope"])
    with pytest.raises(SystemExit):
        be.parse_args(["--seeds", "1", "1"])
    # every arm has a replica pair and the ablation pairs differ from hints in exactly one mechanism
    assert all(be.SETUPS[n][0] in be.PAIRS for n in be.SETUPS)
    hints = set(be.PAIRS["hints"][0])
    assert "--enable-priority-scheduling" not in be.PAIRS["no-priority"][0]
    assert "workflow-retention" not in be.PAIRS["no-retention"][0] and "--enable-hierarchical-cache" in be.PAIRS["no-retention"][0]
    assert set(be.PAIRS["no-prefetch"][0]) == hints and be.PAIRS["no-prefetch"][2] == {"AWP_PREFETCH": "0"}
    assert set(be.PAIRS["no-host-tier"][0]) == hints - set(be.HICACHE_FLAGS)     # HiCache off, nothing to stage
    assert be.SETUPS["no-routing"] == ("hints", "gateway-hints-rr")      # hints with round-robin routing


def test_contention_conditions_one_replica_their_own_arms_and_a_deep_queue() -> None:
    """contention / kv-pressure run ONE replica per arm, platform-contention two; each has its own
    arms; in flight is a multiple of the cluster's running slots unless --concurrency is given; the
    ablation adds each mechanism off, the routing arms only where there is more than one replica."""
    a = be.condition_args(be.parse_args(["--condition", "contention"]), "contention")
    assert (a.replicas, a.setups) == (1, ["round-robin", "hints"])
    assert a.concurrency >= 3 * a.max_running * a.replicas and a.workflows > a.concurrency
    assert (a.max_running, a.concurrency, a.workflows) == (3, 12, 18)       # CPU: picked with --estimate
    k = be.condition_args(be.parse_args(["--condition", "kv-pressure"]), "kv-pressure")
    assert (k.replicas, k.setups, k.coding_token_scale) == (1, ["hints", "no-retention"], 4.0)
    assert k.pool_tokens == 2 * be.DEFAULTS["cpu"]["pool_tokens"]
    pc = be.condition_args(be.parse_args(["--condition", "platform-contention"]), "platform-contention")
    assert (pc.replicas, pc.setups) == (2, ["router", "hints"])
    assert pc.concurrency >= 3 * pc.max_running * 2
    assert be.condition_args(be.parse_args(["--concurrency", "5"]), "contention").concurrency == 5
    abl = be.condition_args(be.parse_args(["--ablation"]), "contention").setups
    assert abl == ["round-robin", "hints", "no-priority", "no-retention", "no-prefetch", "no-host-tier"]   # 1 replica: no routing
    abl2 = be.condition_args(be.parse_args(["--ablation"]), "platform-contention").setups
    assert {"routing-only", "no-routing", "no-priority", "no-retention", "no-prefetch"} <= set(abl2)
    assert be.ratio_pairs(k.setups) == [("hints", "no-retention")]     # no baseline arm: hints over the other


def test_only_the_measured_pairs_are_up_and_the_calibration_pair_stops_first() -> None:
    rr, hints = be.SETUPS["round-robin"][0], be.SETUPS["hints"][0]
    # contention: the plain pair is an arm's, so it calibrates there; both pairs up, runs A B | B A
    assert be.pair_schedule(["round-robin", "hints"], [0, 1], True, False) == [
        ([rr, hints], [(0, "round-robin"), (0, "hints"), (1, "hints"), (1, "round-robin")])]
    # kv-pressure: no arm on plain replicas -> they start alone for the calibration, then stop
    steps = be.pair_schedule(["hints", "no-retention"], [0], True, False)
    assert steps[0] == (["plain"], []) and steps[1][0] == ["hints", "no-retention"]
    assert be.pair_schedule(["hints", "no-retention"], [0], False, False)[0][0] == ["hints", "no-retention"]
    # GPU: one pair at a time, each with its own runs
    gpu = be.pair_schedule(["router", "hints"], [0, 1], True, True)
    assert gpu == [(["plain"], [(0, "router"), (1, "router")]), (["hints"], [(0, "hints"), (1, "hints")])]


def test_coding_prompts_scale_only_the_coding_sessions_prompts() -> None:
    from bench.engine_conditions import coding_prompts

    recs = [{"workflow_id": "swe-agent:1", "input_tokens": 100, "output_tokens": 10},
            {"workflow_id": "group-chat:2", "input_tokens": 100, "output_tokens": 10}]
    out = coding_prompts(recs, 4.0)
    assert [(r["input_tokens"], r["output_tokens"]) for r in out] == [(400, 10), (100, 10)]
    assert coding_prompts(recs, 1.0) is recs and recs[0]["input_tokens"] == 100


def test_arms_interleave_a_b_b_a_per_seed() -> None:
    assert be.run_order([0, 1, 2, 3], ["rr", "hints"]) == [
        (0, "rr"), (0, "hints"), (1, "hints"), (1, "rr"), (2, "rr"), (2, "hints"), (3, "hints"), (3, "rr")]
    order = be.run_order(list(range(10)), ["a", "b"])
    firsts = Counter(order[2 * i][1] for i in range(10))
    assert firsts == {"a": 5, "b": 5}                      # each arm first in half the seeds


def test_scale_records_caps_and_counts() -> None:
    recs = [{"input_tokens": 1000, "output_tokens": 10}, {"input_tokens": 40000, "output_tokens": 9000}]
    out, capped = scale_records(recs, 0.05, max_input=1000, max_output=500)
    assert [(r["input_tokens"], r["output_tokens"]) for r in out] == [(50, 1), (1000, 450)]
    assert capped == 1 and recs[1]["input_tokens"] == 40000          # copies


def test_seed_slices_are_disjoint_until_they_wrap() -> None:
    ids = [f"w{i}" for i in range(20)]
    sets = [seed_slice(ids, s, 6) for s in range(3)]
    assert all(len(x) == 6 for x in sets) and len(set().union(*sets)) == 18
    assert seed_slice(ids, 4, 6)[:2] == seed_slice(ids, 0, 6)[4:]     # 24..29 wraps to 4..9
    with pytest.raises(ValueError, match="--workflows"):
        seed_slice(ids, 0, 0)


@pytest.mark.slow
def test_multi_agent_and_agent_platform_workloads() -> None:
    args = be.condition_args(be.parse_args(["--seeds", "0", "1", "--workflows", "3"]), "multi-agent")
    wl = prepare_workload("multi-agent", [0, 1], args)
    assert wl.shared_train()
    wfs = {s: {r["workflow_id"] for r in recs} for s, recs in wl.replay.items()}
    assert len(wfs[0]) == len(wfs[1]) == 3 and not wfs[0] & wfs[1]
    train_ids = {r["workflow_id"] for r in wl.train[0]}
    assert not train_ids & (wfs[0] | wfs[1])                       # the profile never saw a replayed workflow
    assert {r["workflow_type_id"] for r in wl.train[0]} == {"magentic_one", "captain_agent"}
    for recs in (*wl.replay.values(), wl.train[0]):
        assert max(r["input_tokens"] for r in recs) <= args.pool_tokens // 2
        assert max(r["output_tokens"] for r in recs) <= args.pool_tokens // 4
    # the train side is on the replay's clock: Who&When calls are 1 s apart, so 0.02 s after it
    by_wf: dict[str, list[float]] = {}
    for r in wl.train[0]:
        by_wf.setdefault(r["workflow_id"], []).append(float(r["t_arrival"]))
    steps = [b - a for t in by_wf.values() for a, b in zip(sorted(t), sorted(t)[1:])]
    assert np.median(steps) == pytest.approx(args.time_scale)

    args = be.condition_args(be.parse_args(["--seeds", "0", "1", "--workflows", "6"]), "agent-platform")
    wl = prepare_workload("agent-platform", [0, 1], args)
    assert not wl.shared_train()                                   # the mix is split per seed
    for s, recs in wl.replay.items():
        apps = Counter(r["workflow_id"].split(":", 1)[0] for r in {r["workflow_id"]: r for r in recs}.values())
        assert set(apps) == {"swe-agent", "mini-swe-agent", "coding-assistant", "agentless", "group-chat",
                             "deep-research"}, s


def _rows(names: list[str], seeds: list[int]) -> dict:
    log = "\n".join([PREFILL.format(n=300, r=2, q=3), DECODE.format(r=4, q=1), PREFILL.format(n=50, r=5, q=0)])
    q, run = queue_samples(log)
    return {n: {s: {"jct_avg_s": 10.0 - (n == "hints") - 0.1 * s, "jct_p95_s": 20.0, "errors": 0,
                    "cached_fraction": 0.5, "calls": 40,
                    "annotate_outcomes": {"annotated": 39, "over_budget": 1} if n != "router" else {},
                    "queue_depth": queue_summary(q, run), "queue_samples": (q, run)} for s in seeds} for n in names}


def test_queue_depth_and_plugin_counters_from_sglang_logs() -> None:
    log = "\n".join([PREFILL.format(n=300, r=2, q=3), "some other line #queue-req: 99",
                     DECODE.format(r=4, q=1), PREFILL.format(n=50, r=5, q=0)])
    q, running = queue_samples(log)
    assert (q, running) == ([3, 1, 0], [2, 4, 5])
    s = queue_summary(q, running)
    assert (s["samples"], s["mean"], s["median"], s["max"], s["running_max"]) == (3, pytest.approx(4 / 3), 1.0, 3, 5)
    assert queue_summary([], [])["mean"] is None
    plugin_log = ("agent-workflow plugin on: 6 hooks (pid 1)\n"
                  "agent-workflow plugin counters: prefetch_planned=2 priority_set=5\n"
                  "KV cache pool is full. Retract requests. #retracted_reqs: 2\n"
                  "agent-workflow plugin counters: prefetch_planned=7 prefetch_staged=3 priority_set=9\n")
    c = engine_counters(plugin_log)
    assert c == {"plugin": "on", "plugin_counters": {"prefetch_planned": 7, "prefetch_staged": 3, "priority_set": 9},
                 "sglang_retracted_reqs": 2}
    assert engine_counters("agent-workflow plugin off: ...")["plugin_counters"] == {}


def test_condition_json_shape() -> None:
    names, seeds = ["round-robin", "router", "routing-only", "hints"], [0, 1, 2]
    args = be.condition_args(be.parse_args(["--seeds", "0", "1", "2", "--setups", *names]), "multi-agent")
    on = {"plugin": "on", "plugin_counters": {"prefetch_planned": 4, "requeued_preempted": 1}, "sglang_retracted_reqs": 0}
    off = {"plugin": "off", "plugin_counters": {}, "sglang_retracted_reqs": 3}
    out = be.build_output(args, names, _rows(names, seeds), {"plain": [off, off], "hints": [on, on]})
    json.dumps(out)                                                   # JSON-ready
    for n in names:
        arm = out["arms"][n]
        assert {"plugin_counters", "annotate_outcomes", "errors", "cached_fraction", "queue_depth"} <= set(arm), n
        assert arm["queue_depth"]["samples"] == 9 and arm["queue_depth"]["max"] == 3
    assert out["arms"]["hints"]["plugin_counters"] == {"prefetch_planned": 8, "requeued_preempted": 2}
    assert out["arms"]["hints"]["plugin"] == "on/on"
    assert out["arms"]["router"]["plugin"] == "off/off" and out["arms"]["router"]["plugin_counters"] == {}
    assert out["arms"]["hints"]["annotate_outcomes"] == {"annotated": 117, "over_budget": 3}
    assert out["arms"]["hints"]["annotated_share"] == pytest.approx(39 / 40)
    assert out["arms"]["router"]["annotate_outcomes"] == {} and out["arms"]["router"]["annotated_share"] is None
    assert set(out["seeds"][0]) == set(names) and "queue_samples" not in out["seeds"][0]["hints"]
    r = out["ratios"]["hints/router"]
    assert r["n"] == 3 and r["mean_avg"] == pytest.approx(np.mean([9 / 10, 8.9 / 9.9, 8.8 / 9.8]))
    assert r["ci_avg"][0] < r["mean_avg"] < r["ci_avg"][1]
    assert out["settings"]["condition"] == "multi-agent"


def test_fidelity_judges_each_ratio_within_0_05_and_each_arm_within_15_percent() -> None:
    measured = {"hints/router": {"mean_avg": 0.9, "ci_avg": [0.8, 1.0]}, "hints/round-robin": {"mean_avg": 0.8}}
    simulated = {"hints/router": {"mean_avg": 0.96}, "hints/round-robin": {"mean_avg": 0.84}}
    f = fidelity(measured, simulated, {"hints": 10.0, "router": 11.0}, {"hints": 8.4, "router": 10.0})
    r = f["ratios"]
    assert r["hints/router"]["abs_error"] == pytest.approx(0.06) and not r["hints/router"]["pass"]
    assert r["hints/router"]["measured_ci"] == [0.8, 1.0]
    assert r["hints/round-robin"]["abs_error"] == pytest.approx(0.04) and r["hints/round-robin"]["pass"]
    assert f["arms"]["hints"]["rel_error"] == pytest.approx(-0.16) and not f["arms"]["hints"]["pass"]
    assert f["arms"]["router"]["pass"] and f["pass"] is False
    assert f["thresholds"] == {"ratio_abs": 0.05, "arm_rel": 0.15}
    ok = fidelity({"a/b": {"mean_avg": 0.9}}, {"a/b": {"mean_avg": 0.88}}, {"a": 5.0}, {"a": 5.5})
    assert ok["pass"] is True
    assert fidelity(measured, {})["pass"] is None
    refused = fidelity({"a/b": {"mean_avg": None, "refused": "no ratio: the queue was empty"}},
                       {"a/b": {"mean_avg": 0.8}}, {"a": 5.0}, {"a": 5.1})
    assert refused["ratios"]["a/b"]["pass"] is None and "queue" in refused["ratios"]["a/b"]["why"]
    assert refused["pass"] is None                      # an arm passing does not make up for an unjudged ratio


def test_a_seed_whose_queue_stayed_empty_is_withheld_and_an_all_empty_ratio_refused() -> None:
    def run(jct: float, share: float | None) -> dict:
        return {"jct_avg_s": jct, "jct_p95_s": 2 * jct, "queue_depth": {"nonempty_share": share}}

    per_seed = {0: {"round-robin": run(10, 0.9), "hints": run(8, 0.7)},
                1: {"round-robin": run(10, 0.2), "hints": run(9, 0.9)},      # baseline queue empty 80 %
                2: {"round-robin": run(10, 0.6), "hints": run(7, None)}}     # no samples: not judged
    r = ratios(per_seed, ["round-robin", "hints"], min_queue_share=0.5)["hints/round-robin"]
    assert r["avg"] == [0.8, 0.7] and r["n"] == 2 and r["refused"] is None
    assert r["withheld"] == [{"seed": 1, "reason": "queue empty in 80% of batch samples"}]
    empty = {s: {"round-robin": run(10, 0.1), "hints": run(8, 0.9)} for s in range(3)}
    e = ratios(empty, ["round-robin", "hints"], min_queue_share=0.5)["hints/round-robin"]
    assert e["mean_avg"] is None and "queue was empty most of the time" in e["refused"]
    assert ratios(empty, ["round-robin", "hints"])["hints/round-robin"]["n"] == 3     # no threshold: all kept
    assert queue_summary([0, 0, 2, 3], [1, 1, 1, 1])["nonempty_share"] == 0.5


@pytest.mark.slow
def test_every_arm_has_a_simulated_policy(tmp_path) -> None:
    """The simulator replays one seed under every arm's policy (the new ablations included), on the
    bench's own scaled records and a profile fitted on other workflows."""
    from bench.engine_sim import SIM_POLICIES, cluster, scaled_records, simulate_setups
    from fitting import profile_fit as fitting
    from store.workloads import generate, write_jsonl
    from simulator.calibration import StepTimeModel

    assert set(SIM_POLICIES) == set(be.SETUPS)
    from bench.engine_sim import HICACHE_ARMS
    assert HICACHE_ARMS == {n for n, (pair, _) in be.SETUPS.items()
                            if "--enable-hierarchical-cache" in be.PAIRS[pair][0]}   # the sim's host tier = the engine's
    args = be.condition_args(be.parse_args(["--seeds", "0", "--workflows", "3", "--ablation"]), "default")
    train, _ = scale_records(list(generate("coding_assistant", 12, seed=1000)), args.token_scale, 1000, 500)
    write_jsonl(train, tmp_path / "train" / "t.jsonl")
    fitting.fit_profile([tmp_path / "train"], tmp_path / "profile", options=fitting.FitOptions(min_calls=5))
    recs, _ = scale_records(list(generate("coding_assistant", 3, seed=0)), args.token_scale, 1000, 500)
    step = StepTimeModel(t0=0.003, a=1e-4, a_ctx=0.0, c=1e-7, prefill_t0=0.02)
    limits = {"kv_capacity_tokens": 1200, "chunked_prefill_size": 4096, "max_running_requests": 8}
    out = simulate_setups(scaled_records(recs, 1.0, args.time_scale), tmp_path / "profile", cluster(limits, step),
                          4, args.setups, preemption_threshold=500)
    assert set(out) == set(args.setups)
    assert {out[n]["policy"] for n in out} == {SIM_POLICIES[n] for n in args.setups}
    assert all(out[n]["jct_avg_s"] > 0 and out[n]["makespan_s"] >= out[n]["jct_avg_s"] for n in out)
    assert set(ratios({0: out}, args.setups)) == {f"{t}/{b}" for t, b in ratio_pairs(args.setups)}
    # a calibration may fit all prefill cost on the context (a = 0, as a CPU smoke run did): the
    # hints arm's prefetch into its host tier still simulates
    flat = StepTimeModel(t0=0.0014, a=0.0, a_ctx=1.5e-5, c=1.2e-6, prefill_t0=0.039)
    assert simulate_setups(scaled_records(recs, 1.0, args.time_scale), tmp_path / "profile",
                           cluster(limits, flat), 4, ["hints"])["hints"]["jct_avg_s"] > 0


def test_open_contention_releases_workflows_at_the_replays_poisson_times(tmp_path) -> None:
    """open-contention is contention with the workflows arriving open loop (``--rate``): the
    replay's own seeded arrival times, which the simulator replays too (no closed population)."""
    from bench.engine_sim import cluster, scaled_records, simulate_setups
    from fitting import profile_fit as fitting
    from serving_hooks.replay import arrival_offsets
    from simulator.calibration import StepTimeModel
    from store.workloads import generate, write_jsonl

    o = be.condition_args(be.parse_args(["--condition", "open-contention"]), "open-contention")
    assert (o.replicas, o.setups, o.rate) == (1, ["round-robin", "hints"], 2.6)
    assert be.condition_args(be.parse_args(["--condition", "open-contention", "--rate", "0.5"]),
                             "open-contention").rate == 0.5
    assert be.condition_args(be.parse_args(["--condition", "contention"]), "contention").rate is None
    p = be.condition_args(be.parse_args(["--condition", "open-platform-contention"]), "open-platform-contention")
    closed = be.condition_args(be.parse_args(["--condition", "platform-contention"]), "platform-contention")
    assert (p.replicas, p.setups, p.rate, p.max_running) == (2, ["router", "hints"], OPEN_PLATFORM_RATE_CPU,
                                                              closed.max_running)
    assert closed.rate is None
    train, _ = scale_records(list(generate("coding_assistant", 12, seed=1000)), 0.05, 1000, 500)
    write_jsonl(train, tmp_path / "train" / "t.jsonl")
    fitting.fit_profile([tmp_path / "train"], tmp_path / "profile", options=fitting.FitOptions(min_calls=5))
    recs, _ = scale_records(list(generate("coding_assistant", 6, seed=0)), 0.05, 1000, 500)
    step = StepTimeModel(t0=0.003, a=1e-4, a_ctx=0.0, c=1e-7, prefill_t0=0.02)
    limits = {"kv_capacity_tokens": 1200, "chunked_prefill_size": 4096, "max_running_requests": 8}
    closed = simulate_setups(scaled_records(recs, 1.0, 0.02), tmp_path / "profile", cluster(limits, step, 1),
                             2, ["round-robin"])
    slow = simulate_setups(scaled_records(recs, 1.0, 0.02), tmp_path / "profile", cluster(limits, step, 1),
                           2, ["round-robin"], rate=0.01, seed=3)
    # at 0.01 workflows/s the last one arrives long after the others: the makespan spans the arrivals
    assert slow["round-robin"]["makespan_s"] >= arrival_offsets(6, 0.01, 1.0, 3)[-1]
    assert slow["round-robin"]["makespan_s"] > 10 * closed["round-robin"]["makespan_s"]
    # arriving apart, nobody queues: no workflow takes longer than in the closed population of 2
    assert slow["round-robin"]["jct_avg_s"] <= closed["round-robin"]["jct_avg_s"]


def test_out_keeps_every_runs_call_records_beside_the_json(tmp_path) -> None:
    args = be.parse_args(["--condition", "contention", "--out", str(tmp_path / "m.json")])
    assert be.calls_dir(args) == tmp_path / "m-calls"


def test_warm_up_replays_the_calibration_workflows_to_every_replica_before_any_run(upstream, tmp_path) -> None:
    """``--warm-up N`` (default 2): each replica gets N calibration workflows straight from the
    replay, then its cache is flushed, so no arm's first run pays a fresh replica's first requests."""
    from types import SimpleNamespace

    from serving_hooks.replay_plan import load_plan
    from store.workloads import write_jsonl

    args = be.condition_args(be.parse_args(["--condition", "contention"]), "contention")
    assert args.warm_up == be.WARM_UP_WORKFLOWS == 2
    assert be.parse_args(["--warm-up", "0"]).warm_up == 0
    recs = be.calibration_workload(args, args.warm_up)
    assert len({r["workflow_id"] for r in recs}) == 2
    write_jsonl(recs, tmp_path / "warm" / "warm.jsonl")
    plan, _ = load_plan([tmp_path / "warm"])
    before = len(upstream.received)
    replicas = [SimpleNamespace(url=upstream.url), SimpleNamespace(url=upstream.url)]
    assert be.warm_up(replicas, plan, args) > 0
    calls = [r for r in upstream.received[before:] if r.body is not None]     # not the /v1/models probes
    assert len(calls) == 2 * len(recs)
    # the warm-up is in the wall-time estimate: every replica of every pair replays it
    est = lambda n: be.estimate_condition(be.condition_args(be.parse_args(  # noqa: E731
        ["--condition", "contention", "--seeds", "0", "--warm-up", str(n)]), "contention"))
    assert est(2)["calibration_s"] > est(0)["calibration_s"]


@pytest.mark.parametrize("choice", ["new-tokens", "sglang"])
def test_the_cpu_extend_attention_choice_reaches_every_replica(monkeypatch, tmp_path, choice) -> None:
    """``--cpu-extend-attention`` is the CPU stand-ins' switch in each replica's environment (the
    default: a cached prefix saves attention work, as on GPU), recorded in the JSON's settings."""
    started = []

    def start(self, timeout_s=None):
        self.startup_s = 0.0
        started.append(self)

    monkeypatch.setattr(be.BenchServer, "start", start)
    argv = ["--condition", "platform-contention"] + ([] if choice == "new-tokens" else ["--cpu-extend-attention", choice])
    args = be.condition_args(be.parse_args(argv), "platform-contention")
    servers = be.start_pair(tmp_path / "model", tmp_path, "hints", args)
    assert len(servers) == len(started) == args.replicas == 2
    assert {s.environment()[be.EXTEND_ATTENTION_ENV] for s in servers} == {choice}
    assert vars(args)["cpu_extend_attention"] == choice


def test_a_seed_whose_gateway_failed_to_annotate_is_withheld_whatever_the_queue() -> None:
    """Session 11's aborted run: the gateway imported a half-changed tree, every annotation failed
    open and the hints arm ran without hints; such a seed is no evidence about the hints."""
    def run(jct: float, outcomes: dict | None) -> dict:
        return {"jct_avg_s": jct, "jct_p95_s": 2 * jct, "queue_depth": {"nonempty_share": 0.9},
                "annotate_outcomes": outcomes or {}}

    per_seed = {0: {"router": run(10, None), "hints": run(8, {"annotated": 99, "over_budget": 1})},
                1: {"router": run(10, None), "hints": run(11, {"annotated": 40, "error": 646})}}
    for threshold in (None, 0.5):
        r = ratios(per_seed, ["router", "hints"], min_queue_share=threshold)["hints/router"]
        assert r["avg"] == [0.8] and [w["seed"] for w in r["withheld"]] == [1]
        assert r["withheld"][0]["reason"].startswith("gateway annotated 6% of calls")
    broken = {0: per_seed[1]}
    e = ratios(broken, ["router", "hints"])["hints/router"]
    assert e["mean_avg"] is None and "gateway annotated" in e["refused"]


def test_the_calls_each_replica_admitted_are_counted_from_its_prefill_lines() -> None:
    """How the front split a run's calls between the replicas (the simulated router's split is
    judged against it): the ``#new-seq`` of each replica's ``Prefill batch`` lines."""
    from bench.engine_report import prefill_sequences
    log = "\n".join([PREFILL.format(n=25, r=0, q=0), DECODE.format(r=1, q=0),
                     PREFILL.format(n=40, r=1, q=2).replace("#new-seq: 1", "#new-seq: 3")])
    assert prefill_sequences(log) == 4
    assert prefill_sequences(DECODE.format(r=1, q=0)) == 0


def test_a_gpu_host_without_sgl_kernel_gets_torch_paths_only_when_it_says_so(monkeypatch) -> None:
    """``AWP_GPU_STANDINS=1`` (bench/gpu_device_run.sh) on ``--gpu``: torch sampling, no CUDA
    graphs, fused ops forced onto torch, HiCache's torch-copied IO; without it a GPU replica keeps
    SGLang's defaults, and a CPU replica's flags do not depend on it."""
    gpu = be.parse_args(["--gpu", "--estimate"])
    monkeypatch.delenv(be.GPU_STANDINS_ENV, raising=False)
    plain_gpu, hints_gpu = be.pair_settings("plain", gpu), be.pair_settings("hints", gpu)
    assert plain_gpu == ([], False, {}) and "--hicache-io-backend" not in hints_gpu[0]
    cpu_before = be.pair_settings("hints", be.parse_args([]))
    monkeypatch.setenv(be.GPU_STANDINS_ENV, "1")
    flags, plugin, env = be.pair_settings("hints", gpu)
    assert plugin and env == be.GPU_STANDIN_ENV == {"SGLANG_FORCE_FUSED_OP_BACKEND": "torch"}
    assert flags[:len(hints_gpu[0])] == hints_gpu[0]
    assert flags[len(hints_gpu[0]):] == be.HICACHE_CPU_FLAGS + be.GPU_STANDIN_FLAGS
    assert be.pair_settings("plain", gpu) == (be.GPU_STANDIN_FLAGS, False, be.GPU_STANDIN_ENV)
    assert be.pair_settings("hints", be.parse_args([])) == cpu_before
