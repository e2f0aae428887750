"""Fit from token counts and order alone: no time model is fit on stand-in times, and the fit
says which predictions it cannot make (profile ``limitations``, `fit` and `show` output)."""
from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from profiler.cli import app
from fitting.profile_fit import FitOptions, fit_profile
from store.profile_artifact import load_profile

REAL = Path(__file__).parents[1] / "datasets" / "real"
FIX = Path(__file__).parent / "fixtures" / "importers"
runner = CliRunner()


@pytest.mark.slow
def test_order_only_logs_are_detected_and_time_models_left_empty(tmp_path):
    # Who&When: real agent order and token estimates, times are call positions (synthetic_order)
    out = runner.invoke(app, ["fit", str(REAL / "seq_whowhen_magentic_captain.jsonl"), "--out", str(tmp_path / "p")])
    assert out.exit_code == 0, out.output
    assert "order-only fit" in out.output and "cannot predict tool latency" in out.output
    prof = load_profile(tmp_path / "p")
    lim = prof.data["limitations"]
    assert lim["timing"] == "order_only" and set(lim["unavailable"]) == {"tool_latency", "idle_gap", "call_latency"}
    assert prof.data["tool_latency"]["global"] == {} and prof.data["idle_gap"]["workflow_types"] == {}
    agent = next(iter(next(iter(prof.data["agents"].values())).values()))
    assert agent["mean_latency_s"] is None and agent["mean_gap_after_s"] is None and agent["calls"] > 0
    # what order and tokens can teach is still fit
    assert prof.data["output_length"]["agents"] and prof.data["workflows"]
    shown = runner.invoke(app, ["show", "--profile", str(tmp_path / "p")])
    assert "cannot predict idle gap" in shown.output


@pytest.mark.slow
def test_order_only_flag_on_timed_logs(tmp_path):
    logs = REAL / "agentless_pr28.jsonl"
    timed, _ = fit_profile([logs], tmp_path / "a")
    forced, _ = fit_profile([logs], tmp_path / "b", options=FitOptions(order_only=True))
    assert timed.data["limitations"]["timing"] == "timed"
    assert "idle_gap" not in timed.data["limitations"]["unavailable"]
    assert timed.data["idle_gap"]["workflow_types"]  # real gaps give keep-alive TTLs
    assert forced.data["limitations"]["timing"] == "order_only" and forced.data["idle_gap"]["workflow_types"] == {}
    # the bands do not depend on times
    assert forced.data["output_length"] == timed.data["output_length"]


def test_one_timestamp_per_call_says_latency_is_unknown(tmp_path):
    out = runner.invoke(app, ["fit", "--format", "mini-swe-agent", str(FIX / "mini_swe_agent"), "--out", str(tmp_path / "p")])
    assert out.exit_code == 0, out.output
    lim = load_profile(tmp_path / "p").data["limitations"]
    assert lim["timing"] == "one_stamp" and "call_latency" in lim["unavailable"]
    assert "idle_gap" not in lim["unavailable"]  # gaps between created stamps are real


@pytest.mark.slow
def test_real_times_are_judged_per_workflow_type(tmp_path):
    """Issue 26 (e): a mixed log (Agentless, timed, + Who&When, order-only): the order-only types
    get no idle-gap TTL and no tool latency, and eval counts none of their position gaps."""
    from scoring.evaluation import evaluate
    logs = [REAL / "agentless_pr28.jsonl", REAL / "seq_whowhen_magentic_captain.jsonl"]
    prof, _ = fit_profile(logs, tmp_path / "p")
    lim = prof.data["limitations"]
    assert lim["timing"] == "mixed"
    assert lim["order_only_types"] == ["captain_agent", "magentic_one"]
    types = set(prof.data["idle_gap"]["workflow_types"])
    assert types and not types & {"captain_agent", "magentic_one"}
    result, _ = evaluate(prof, logs)
    ka = result["keep_alive"]
    assert set(ka["by_workflow_type"]) == types, ka["by_workflow_type"]
    assert ka["scored_share"] == 1.0
