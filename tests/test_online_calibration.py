"""Online calibration of the served output-length band (issue 26 item 5): adaptive conformal
inference per (workflow type, agent), fed by the outcomes serving observes, and the online eval."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from bench.bench_online_calibration import time_split
from predictors.online_calibration import OnlineCalibrator, table_upper
from predictors.predictor import Predictor
from predictors.served import UPPER_ALPHAS, Band
from store import ingest as ingest_mod
from profiler.cli import app
from fitting.profile_fit import fit_profile
from profiler.online_eval import event_order, online_scores
from store.duckdb_store import connect
from store.workloads import generate, write_jsonl
from tests.serving_helpers import fit_generated_profile

KEY = ("wt", "a")


def lognormal_table(mu: float, sigma: float) -> tuple:
    """The exact one-sided upper bounds of a lognormal at the tabulated risks."""
    from scipy import stats

    return tuple((a, int(math.ceil(math.exp(mu + sigma * stats.norm.isf(a))))) for a in UPPER_ALPHAS)


def test_table_upper_interpolates_in_log_log_and_extends_the_certified_tail():
    table = ((0.1, 100), (0.01, 1000))
    assert table_upper(table, 0.1) == 100 and table_upper(table, 0.01) == pytest.approx(1000)
    assert table_upper(table, math.sqrt(0.1 * 0.01)) == pytest.approx(math.sqrt(100 * 1000))
    assert table_upper(table, 0.5) == 100                          # flat above the largest risk
    assert table_upper(table, 0.001) == pytest.approx(10_000)      # the tail's slope below
    # a small agent's table: the ceiling (5000) below certified_alpha is not a quantile
    small = ((0.2, 100), (0.1, 200), (0.05, 400), (0.02, 5000), (0.01, 5000))
    assert table_upper(small, 0.05) == pytest.approx(400)
    assert table_upper(small, 0.025) == pytest.approx(800)
    assert table_upper((), 0.1) is None


def test_misses_widen_hits_narrow_and_the_level_stays_bounded():
    cal = OnlineCalibrator(nominal=0.99)
    table = lognormal_table(5.0, 0.8)
    band = Band(20, 900, "agent")
    assert cal.adjust(KEY, band, table) == band                     # nominal level: the fitted band
    cal.update(KEY, False)
    lo, hi, level = cal.adjust(KEY, band, table)
    assert lo < 20 and hi > 900 and level == "agent"                # a miss: wider on both ends
    for _ in range(2000):
        cal.update(KEY, False)
    a_min, a_max = cal.bounds()
    assert cal.level(KEY) == pytest.approx(a_min)
    assert cal.stretch(KEY, table) <= cal.max_stretch
    for _ in range(100_000):
        cal.update(KEY, True)
    assert cal.level(KEY) == pytest.approx(a_max)
    lo, hi, _ = cal.adjust(KEY, band, table)
    assert lo > 20 and hi < 900                                     # over-covering: narrower
    st = cal.status()["wt"]["a"]
    assert st["outcomes"] == 102_001 and st["level"] == pytest.approx(a_max)


def test_a_too_narrow_band_is_brought_to_nominal_coverage_on_a_stationary_stream():
    """The fitted band covers 0.95; online calibration serves 0.99 (misses ≤ αT + ln(α/α_min)/κ)."""
    rng = np.random.default_rng(0)
    mu, sigma = 5.0, 0.8
    table = lognormal_table(mu, sigma)
    from scipy import stats

    band = Band(int(math.exp(mu - sigma * stats.norm.isf(0.025))), int(math.exp(mu + sigma * stats.norm.isf(0.025))), "agent")
    cal = OnlineCalibrator(nominal=0.99)
    y = np.exp(rng.normal(mu, sigma, 20_000))
    misses, widths = 0, []
    for v in y:
        lo, hi, _ = cal.adjust(KEY, band, table)
        hit = lo <= v <= hi
        misses += not hit
        widths.append(hi - lo)
        cal.update(KEY, hit)
    a, (a_min, _) = cal.alpha, cal.bounds()
    assert misses <= a * len(y) + math.log(a / a_min) / cal.rate
    assert 0.988 <= 1 - misses / len(y) <= 0.993                    # not wider than it must be
    assert np.mean(widths) > band[1] - band[0]


def test_a_run_of_misses_escalates_the_step_but_a_lone_miss_steps_as_plain_aci():
    plain, esc = OnlineCalibrator(escalation_horizon=0), OnlineCalibrator()
    a = plain.alpha
    for cal in (plain, esc):
        for _ in range(2000):                                       # long past: hits only
            cal.update(KEY, True)
    lone = {id(c): c.level(KEY) for c in (plain, esc)}
    for cal in (plain, esc):
        cal.update(KEY, False)
    for cal in (plain, esc):                                        # one miss: the same step
        assert math.log(lone[id(cal)]) - math.log(cal.level(KEY)) == pytest.approx(cal.rate * (1 - a))
    for cal in (plain, esc):
        for _ in range(3):
            cal.update(KEY, False)
    drop_plain = math.log(lone[id(plain)]) - math.log(plain.level(KEY))
    drop_esc = math.log(lone[id(esc)]) - math.log(esc.level(KEY))
    assert drop_plain == pytest.approx(4 * plain.rate * (1 - a))
    assert drop_esc > 2 * drop_plain                                # four misses in a row: ≈ 1+2+3+4 steps
    with pytest.raises(ValueError, match="escalation_horizon"):
        OnlineCalibrator(escalation_horizon=-1)


def test_an_agent_without_outcomes_starts_from_its_types_pooled_level():
    cal = OnlineCalibrator()
    for _ in range(5):
        cal.update(("wt", "busy"), False)
    assert cal.level(("wt", "new")) < cal.alpha                     # the type missed: start wide
    assert cal.level(("wt", "new")) == pytest.approx(cal.level(("wt", "\x00pooled")))
    assert cal.level(("other", "new")) == cal.alpha                 # another type: nominal
    cal.update(("wt", "new"), True)
    assert cal.level(("wt", "new")) < cal.alpha                     # its own level, from the pooled one
    assert set(cal.status()["wt"]) == {"busy", "new"}               # the pooled key is not an agent


def test_escalation_holds_coverage_after_a_shift_that_plain_aci_recovers_slowly():
    """A stream whose outputs jump 2.5x after 300 calls (drift): the escalated step loses fewer
    calls to misses in the 300 calls after the jump, and settles no wider than 1.5x plain ACI."""
    rng = np.random.default_rng(1)
    mu, sigma = 5.0, 0.5
    table = lognormal_table(mu, sigma)
    from scipy import stats

    band = Band(int(math.exp(mu - sigma * stats.norm.isf(0.005))), int(math.exp(mu + sigma * stats.norm.isf(0.005))), "agent")
    y = np.exp(np.concatenate([rng.normal(mu, sigma, 300), rng.normal(mu + math.log(2.5), sigma, 3000)]))
    res = {}
    for h in (0.0, 50.0):
        cal = OnlineCalibrator(escalation_horizon=h)
        miss, widths = [], []
        for v in y:
            lo, hi, _ = cal.adjust(KEY, band, table)
            miss.append(not lo <= v <= hi)
            widths.append(hi - lo)
            cal.update(KEY, not miss[-1])
        res[h] = (sum(miss[300:600]), np.mean(widths[-1000:]))
    assert res[50.0][0] < res[0.0][0]
    assert res[50.0][1] <= 1.5 * res[0.0][1]


def test_bad_parameters_are_refused():
    with pytest.raises(ValueError, match="nominal"):
        OnlineCalibrator(nominal=1.5)
    with pytest.raises(ValueError, match="rate"):
        OnlineCalibrator(rate=0)


def test_the_predictor_serves_the_calibrated_band_and_the_alarm_judges_the_fitted_one(tmp_path):
    root = fit_generated_profile(tmp_path, 60, 0)
    on, off = Predictor(root), Predictor(root, online_calibration=False)
    meta = {"workflow_type_id": "coding_assistant", "workflow_id": "w1", "agent_id": "planner"}
    fitted = tuple(off.annotate(meta, request_id="r0")["predicted_output_len"])
    first = tuple(on.annotate(meta, request_id="r0")["predicted_output_len"])
    assert first == fitted                                        # no outcome yet: the fitted band
    for i in range(5):                                            # five calls far above the band
        rid = f"r{i}"
        on.annotate(meta, request_id=rid)
        assert on.observe({"app_metadata": meta, "request_id": rid, "output_tokens": 10 * fitted[1]}) is False
    again = on.annotate(meta, request_id="r-next")["predicted_output_len"]
    assert again[1] > fitted[1] and again[0] <= fitted[0]
    assert on.annotate(meta, request_id="r-next")["predicted_output_len"] == again   # a retry: same band
    assert on.calibrator.level(("coding_assistant", "planner")) < on.calibrator.alpha
    # the same outcome inside the calibrated band but outside the fitted one: served hit, alarm miss
    out = (fitted[1] + again[1]) // 2
    assert on.observe({"app_metadata": meta, "request_id": "r-next", "output_tokens": out}) is True
    assert on.coverage_monitor.status()["coding_assistant"]["coverage"] == 0.0
    assert off.calibrator is None


def test_event_order_puts_finishes_first_and_never_before_their_own_arrival():
    ta = np.array([0.0, 1.0, 2.0])
    tf = np.array([1.0, 1.0, 3.0])       # call 0 finishes as call 1 arrives; call 1 has zero duration
    assert event_order(ta, tf) == [(1, 0), (0, 0), (1, 1), (0, 1), (1, 2), (0, 2)]


def _split_scores(workload: str, tmp: Path, n: int = 400) -> dict:
    train, test = time_split(list(generate(workload, n, seed=0)), 0.7)
    write_jsonl(iter(train), tmp / "train.jsonl")
    write_jsonl(iter(test), tmp / "test.jsonl")
    profile, _ = fit_profile([tmp / "train.jsonl"], tmp / "p")
    con = connect(None)
    try:
        ingest_mod.ingest(con, [tmp / "test.jsonl"])
        return online_scores(profile, con)
    finally:
        con.close()


@pytest.mark.slow
def test_on_a_drifting_log_coverage_holds_and_the_alarm_fires_but_not_on_a_stationary_one(tmp_path):
    """Issue 26's target on the messy workload (a release at the midpoint), time-ordered split:
    online coverage ≥ 0.97 at nominal 0.99 with width ≤ 1.15 × the per-agent empirical band."""
    (tmp_path / "messy").mkdir()
    drift = _split_scores("messy", tmp_path / "messy")
    assert drift["online"]["coverage"] >= 0.97 > drift["static"]["coverage"] - 0.01
    assert drift["online"]["coverage"] > drift["static"]["coverage"]
    assert drift["width_vs_per_agent_empirical"] <= 1.15
    assert drift["drift_alarm"]["messy_app"]["fired"] is True
    (tmp_path / "steady").mkdir()
    steady = _split_scores("coding-assistant", tmp_path / "steady")
    assert not any(a["fired"] for a in steady["drift_alarm"].values())
    assert abs(steady["online"]["coverage"] - steady["static"]["coverage"]) <= 0.002


@pytest.mark.slow
def test_cli_eval_online_json_keys(tmp_path):
    train, test = time_split(list(generate("coding-assistant", 40, seed=1)), 0.7)
    write_jsonl(iter(train), tmp_path / "train" / "logs.jsonl")
    write_jsonl(iter(test), tmp_path / "test" / "logs.jsonl")
    runner = CliRunner()
    assert runner.invoke(app, ["fit", str(tmp_path / "train"), "--out", str(tmp_path / "p"), "-q"]).exit_code == 0
    r = runner.invoke(app, ["eval", "--online", "--profile", str(tmp_path / "p"), str(tmp_path / "test"), "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout[r.stdout.index("{"):])
    assert {"nominal", "calls", "scored", "online", "static", "baselines", "width_vs_per_agent_empirical",
            "by_type", "drift_alarm", "window", "online_vs_global", "band_arms"} <= set(out)
    assert set(out["online"]) == {"coverage", "mean_width", "worst_window_coverage"}
    assert out["scored"] == out["calls"] > 0
    assert set(out["by_type"]["coding_assistant"]) == {"calls", "online", "static", "global", "online_vs_global"}
    assert {"coverage_diff", "coverage_diff_se", "width_diff", "width_diff_se", "dominated"} == set(
        out["online_vs_global"])
    assert 0 < out["band_arms"]["coding_assistant"]["served"] <= out["scored"]
    text = runner.invoke(app, ["eval", "--online", "--profile", str(tmp_path / "p"), str(tmp_path / "test")])
    assert text.exit_code == 0 and "online (served, calibrated): coverage" in text.output
