"""bench/bench_real.py runs end to end on the small real copies and the messy workload."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_real_json_on_small_copies():
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_real.py"), "--data", str(REPO / "datasets" / "real"),
         "--sets", "agentless,messy", "--messy-seeds", "0,1", "--messy-workflows", "40", "--json"],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["command"].startswith("python ") and "--sets agentless,messy" in out["command"]
    assert set(out["sets"]) == {"agentless", "messy ×2 seeds"}
    agentless = out["sets"]["agentless"]
    assert agentless["source"].endswith("datasets/real/agentless_pr28.jsonl")
    rows = {(r["metric"], r["method"]): r for r in agentless["table"]}
    assert 0 < rows[("output-length coverage", "ours")]["value"] <= 1
    assert rows[("output-length mean width", "global")]["value"] > 0
    messy = out["sets"]["messy ×2 seeds"]
    assert len(messy["result"]["folds"]) == 2  # one result per seed, aggregated
    assert messy["result"]["summary"]["output_len.coverage"]["folds"] == 2


def test_bayes_bound_of_a_generated_workload(tmp_path):
    """deep-research: decomposer → 2–5 researchers → summarizer, 1–3 times, then the writer.
    The oracle's expected top-1 is the mean of max P(next | history) per scored call: 0.80."""
    import importlib.util

    from store.workloads import generate, write_jsonl
    spec = importlib.util.spec_from_file_location("bench_real", REPO / "bench" / "bench_real.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    path = tmp_path / "dr.jsonl"
    write_jsonl(generate("deep-research", 60, seed=3), path)
    b = bench.bayes_top1("deep-research", path, n_sim=20_000)
    assert 0.79 < b["bayes_top1_expected"] < 0.82
    assert 0.7 < b["bayes_top1_heldout"] < 0.9


def test_time_split_reports_the_online_band_as_the_served_one(tmp_path):
    """`--time`: the time split is also replayed online, and the band table puts the static
    (fitted) figures beside the online-calibrated ones, which it names as served."""
    import importlib.util

    from rich.console import Console
    spec = importlib.util.spec_from_file_location("bench_real", REPO / "bench" / "bench_real.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.split_fit_eval([REPO / "datasets" / "real" / "agentless_pr28.jsonl"], tmp_path, "time")
    band = result["online_band"]
    assert band["served"] == "online" and band["nominal"] == 0.99
    assert set(band["by_type"]) == {"agentless_localize", "agentless_repair"}
    for figures in (band["online"], band["static"], *(t["online"] for t in band["by_type"].values())):
        assert 0 < figures["coverage"] <= 1 and figures["mean_width"] > 0
    ka = band["keep_alive"]           # and the keep-alive TTL, static vs online, on the same replay
    assert ka["nominal"] == 0.95 and ka["gaps"] == sum(t["gaps"] for t in ka["by_type"].values()) > 0
    for figures in (ka["online"], ka["static"]):
        assert 0 < figures["coverage"] <= 1 and figures["kv_s_per_covered_gap"] > 0
    console = Console(record=True, width=400)
    console.print(bench.online_band_table({"agentless": {"result": result}}))
    text = console.export_text()
    assert "online coverage (served)" in text and "agentless_repair" in text
    assert "keep-alive" in text and f"{ka['online']['coverage']:.3f}" in text
    # the global band beside the served one, the difference ± its jackknife error, the arm served
    vs = band["online_vs_global"]
    assert vs["coverage_diff"] == pytest.approx(band["online"]["coverage"] - band["global"]["coverage"])
    assert vs["coverage_diff_se"] is not None and vs["coverage_diff_se"] >= 0
    assert "global arm served (switches)" in text and f"{band['global']['coverage']:.3f}" in text
    # the random split is replayed online too: its keep-alive headline scores the TTL served
    hashed = bench.split_fit_eval([REPO / "datasets" / "real" / "agentless_pr28.jsonl"], tmp_path / "hash", "hash")
    assert hashed["online_band"]["keep_alive"]["vs_baselines"] and bench.keep_alive_served(hashed)
    rows = {(f, b) for f, b, *_ in bench.headline_rows(hashed, served=False)}
    assert ("keep-alive (coverage; KV-s per covered gap), served", "idle_gap_p95") in rows


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_real", REPO / "bench" / "bench_real.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_headline_rows_pool_seeds_and_flag_a_baseline_ahead():
    bench = _bench_module()

    def part(top1_diff, se, ka_cov):
        return {"calls": 100,
                "next_agent": {"vs_baselines": {"markov1": {"top1_diff": top1_diff, "top1_diff_se": se, "top1_n": 50,
                                                            "log_loss_diff": -0.1, "log_loss_diff_se": 0.01,
                                                            "log_loss_n": 50}}},
                "remaining_calls": {"vs_baselines": {"position_median": {"mae_diff": 0.5, "mae_diff_se": 0.1,
                                                                         "mae_n": 80}}},
                "keep_alive": {"gaps": 40, "vs_baselines": {"idle_gap_p95": {
                    "coverage_diff": ka_cov, "coverage_diff_se": 0.01, "kv_s_diff": 0.0, "kv_s_diff_se": 0.1}}}}
    result = {"folds": [part(-0.04, 0.01, -0.02), part(-0.02, 0.01, -0.04)]}
    rows = {(f, b): (cell, dom) for f, b, cell, dom in bench.headline_rows(result, served=False)}
    cell, dom = rows[("next agent top-1", "markov1")]
    assert cell == f"-0.030 ± {(0.01 ** 2 * 2) ** 0.5 / 2:.3f}" and dom          # pooled: mean, √Σ(w·se)²/Σw
    assert not rows[("next agent log-loss", "markov1")][1]                    # ours lower loss: ahead
    assert rows[("remaining calls MAE", "position_median")][1]                # ours 0.5 calls worse, se 0.1
    assert rows[("keep-alive (coverage; KV-s per covered gap)", "idle_gap_p95")][1]


def test_on_the_time_split_the_c_index_headline_is_the_served_order():
    """The Predictor serves the remaining-tokens order chosen online (on by default): the time
    split's headline scores that replayed order, not the fit's static one."""
    bench = _bench_module()

    def part(static, online, calls):
        return {"calls": calls,
                "remaining_work": {"baselines": {"position_median": {"c_index_diff": static, "c_index_diff_se": 0.01}}},
                "online_band": {"remaining_tokens": {"calls": calls, "online_vs_baselines": {
                    "position_median": {"c_index_diff": online, "c_index_diff_se": 0.01}}}}}
    result = {"folds": [part(-0.06, -0.01, 100), part(-0.06, 0.02, 300)]}
    static = {(f, b): (cell, dom) for f, b, cell, dom in bench.headline_rows(result, served=False)}
    served = {(f, b): (cell, dom) for f, b, cell, dom in bench.headline_rows(result, served=True)}
    assert static[("remaining tokens C-index", "position_median")][1]                    # the fit's: behind
    cell, dom = served[("remaining tokens C-index, served", "position_median")]
    assert cell.startswith("+0.013 ±") and not dom                 # weighted by calls: (−1 + 6) / 400


def test_the_keep_alive_headline_scores_the_served_ttl_where_the_online_replay_exists():
    """Eval scores what serving serves: with the online replay in every part (a split, each messy
    seed) the keep-alive headline is the served TTL's, even on the random split (``served=False``
    for the other figures); a result without it (``--cv``) keeps the fitted TTL's."""
    bench = _bench_module()

    def ka(cov):
        return {"gaps": 100, "vs_baselines": {"idle_gap_p95": {
            "coverage_diff": cov, "coverage_diff_se": 0.005, "kv_s_diff": 0.01, "kv_s_diff_se": 0.004}}}
    fitted_only = {"folds": [{"keep_alive": ka(0.004)}, {"keep_alive": ka(0.004)}]}
    both = {"folds": [{"keep_alive": ka(0.004), "online_band": {"keep_alive": ka(-0.02)}} for _ in range(2)]}
    assert not bench.keep_alive_served(fitted_only) and bench.keep_alive_served(both)
    rows = {b: (f, cell, dom) for f, b, cell, dom in bench.headline_rows(both, served=False)}
    figure, cell, dom = rows["idle_gap_p95"]
    assert figure.endswith(", served") and cell.startswith("-0.020") and dom          # the served TTL: behind
    figure, cell, dom = {b: (f, c, d) for f, b, c, d in bench.headline_rows(fitted_only, served=False)}["idle_gap_p95"]
    assert not figure.endswith(", served") and cell.startswith("+0.004") and not dom
    # a part without the replay: the whole set falls back to the fitted TTL (never a mix)
    mixed = {"folds": [both["folds"][0], fitted_only["folds"][0]]}
    assert not bench.keep_alive_served(mixed)
