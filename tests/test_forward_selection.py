"""The next-agent and remaining-calls choices checked on a time-ordered validation slice
(issue 37 b, c): the latest fifth of a type's training workflows by start time, trained on the
rest (``synth.sequence_select``, ``profiler fit``'s forward_validation key)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
from typer.testing import CliRunner

from profiler.cli import app
from store import ingest
from store.duckdb_store import connect
from synth.profile_section import _late_flag_sql, _split_late
from synth.sequence_select import (BASE_REMAINING, MIXTURES, REMAINING_MIN_N,
                                   REMAINING_ORDERS, REMAINING_POINTS, REMAINING_POSITIONS,
                                   _forward_next, _forward_remaining, select_models)
from synth.sequences import load_sequence_groups

from test_sequence_groups import task_paths, write_log


def test_without_a_slice_nothing_changes():
    paths = task_paths()
    counts = [4] * len(paths)
    plain = select_models(paths, counts, folds=3)
    assert "forward" not in plain["next"] and "forward" not in plain["remaining"]
    # a slice too small to say anything (fewer than FORWARD_MIN workflows) is not used
    tiny = select_models(paths, counts, folds=3, forward=[0] * 10 + [4] * 4 + [2])
    assert tiny == plain


def test_the_slice_picks_among_what_the_folds_cannot_tell_apart():
    """Rule of :func:`_forward_next` on made-up losses: candidates 0 (the CV choice) and 1 are
    level in the folds, 2 is far behind there; on the slice 1 is ahead of 0 beyond noise and 2
    further still. Served: 1 (2 only wins on the slice, where the folds say it is poor)."""
    grid = [("agent", 3, 1.0, 1.0), ("agent", 1, 1.0, 1.0), ("agent", 8, 1.0, 1.0)]
    rng = np.random.default_rng(0)
    n = 60
    cv_wf = np.column_stack([np.full(n, 1.0), np.full(n, 1.0), np.full(n, 3.0)])
    noise = rng.normal(0, 0.1, n)
    cv_wf += np.column_stack([noise, noise[::-1], noise])   # 0 and 1 level: same spread
    late = np.zeros(n, dtype=np.int64)
    late[:30] = 1
    f_wf = np.zeros((n, 3))
    f_wf[:30] = np.column_stack([np.full(30, 2.0), np.full(30, 1.0), np.full(30, 0.5)])
    f_wf[:30] += rng.normal(0, 0.1, (30, 3))
    events = 30 * 5.0
    loss = np.repeat(f_wf.sum(axis=0)[:, None], len(MIXTURES), axis=1)
    loss[1, 2] -= 1.0                                   # the slice likes candidate 1 mixed
    hits = np.zeros_like(loss)
    cv = {"context": "agent", "max_order": 3, "escape": 1.0, "min_context": 1.0,
          "mixture": 1.0, "validation_log_loss": 0.2}
    fwd = (loss, hits, f_wf, events, events)
    out = _forward_next(cv, fwd, late, grid, cv_wf, np.ones(n), None, True)
    assert out["forward"]["served"] == "forward" and out["forward"]["candidates"] == 2
    assert (out["max_order"], out["mixture"]) == (1, MIXTURES[2])
    assert out["cv_validation_log_loss"] == 0.2
    # the slice level between 0 and 1: the CV choice stays
    f_wf[:30, 0] = f_wf[:30, 1] + rng.normal(0, 0.1, 30)
    loss[0] = loss[1] + 0.01
    kept = _forward_next(cv, (loss, hits, f_wf, events, events), late, grid, cv_wf,
                         np.ones(n), None, True)
    assert kept["forward"]["served"] == "cv" and kept["max_order"] == 3


def test_a_context_that_holds_forward_stays():
    """Random paths per task, four trials each, tasks run one after another: the folds pick a
    long context; the slice (the last fifth of the tasks) is checked and reported."""
    paths = task_paths(25)
    counts = [4] * len(paths)
    late = [0] * 20 + [4] * 5
    res = select_models(paths, counts, folds=3, forward=late)
    assert res["next"]["forward"]["workflows"] == 20
    assert res["remaining"]["forward"]["workflows"] == 20
    assert "forward" not in select_models(paths, counts, folds=3, forward=[0] * 24 + [4])["next"]


def _cands() -> list[tuple]:
    return [(o, p, m, pt) for o in REMAINING_ORDERS for p in REMAINING_POSITIONS
            for m in REMAINING_MIN_N for pt in REMAINING_POINTS]


def test_remaining_choice_gives_way_to_a_last_k_median_that_wins_forward():
    cands = _cands()
    col = {c: i for i, c in enumerate(cands)}
    rng = np.random.default_rng(0)
    errors = np.full((40, len(cands)), 10.0) + rng.normal(0, 0.5, (40, len(cands)))
    cv_key = (3, "bucket", 1, "mean")
    errors[:, col[cv_key]] += 4.0                       # the CV choice is worse forward
    errors[:, col[(2, "none", 3, "p50")]] -= 3.0        # a median over the last 2 agents wins
    errors[:, col[(8, "none", 1, "p50")]] -= 3.02       # as does a longer one, not beyond noise
    cv = {"order": 3, "position": "bucket", "min_n": 1, "point": "mean", "validation_mae": 1.0}
    out = _forward_remaining(cv, cands, errors, np.ones(40), calls=400.0)
    assert out["forward"]["served"] == "forward"
    assert (out["order"], out["position"], out["point"]) == (2, "none", "p50")
    assert out["cv_choice"]["order"] == 3
    assert out["forward"]["mae"]["served"] < out["forward"]["mae"]["position_median"]
    # the same slice with the CV choice ahead: it stays
    errors[:, col[cv_key]] -= 8.0
    kept = _forward_remaining(cv, cands, errors, np.ones(40), calls=400.0)
    assert kept["forward"]["served"] == "cv" and kept["order"] == 3
    # the position median itself wins forward: served
    errors[:, col[BASE_REMAINING]] -= 20.0
    base = _forward_remaining(cv, cands, errors, np.ones(40), calls=400.0)
    assert (base["order"], base["point"]) == (0, "p50")


def test_the_store_marks_the_latest_fifth_by_start_time(tmp_path: Path):
    log = tmp_path / "trials.jsonl"
    write_log(log, task_paths(10, 4), trials=1)          # 10 workflows, one after another
    con = connect(None)
    ingest.ingest(con, [log])
    seqs, counts, mixed = load_sequence_groups(con, _late_flag_sql(con))["app"]
    groups, late, slices = _split_late(mixed, grouped=False)
    assert groups is None and sum(late) == 2 == sum(counts) - 8
    # five start-time slices of two workflows each, the last one the late fifth
    assert sum((Counter(m) for m in slices), Counter()) == {b: 2 for b in range(5)}
    assert all(m.get(4, 0) == k for m, k in zip(slices, late))
    # the two late ones are the last two tasks started
    paths = task_paths(10, 4)
    late_of = {s.calls: k for s, k in zip(seqs, late)}
    want = {p: sum(1 for q in paths[8:] if q == p) for p in paths}
    assert late_of == want


def test_fit_is_deterministic_and_can_be_switched_off(tmp_path: Path):
    log = tmp_path / "trials.jsonl"
    write_log(log, task_paths(25), trials=4)             # 100 workflows: a slice of 20
    runner = CliRunner()
    sections = []
    for name, env in (("a", {}), ("b", {}), ("off", {"PROFILER_FIT_FORWARD_VALIDATION": "false"})):
        out = tmp_path / name
        res = runner.invoke(app, ["fit", str(log), "--out", str(out), "-q"], env=env)
        assert res.exit_code == 0, res.output
        profile = json.loads(next(out.rglob("profile.json")).read_text())
        sections.append(profile["workflows"]["app"])
    assert json.dumps(sections[0], sort_keys=True) == json.dumps(sections[1], sort_keys=True)
    assert sections[0]["sequence_model"]["selection"]["forward"]["workflows"] == 20
    assert "forward" in sections[0]["remaining_model"]["selection"]
    off = sections[2]["sequence_model"]["selection"]
    assert "forward" not in off and "forward" not in sections[2]["remaining_model"]["selection"]
    # the served next-agent candidate: chosen on rolling origins, ours without start times
    assert sections[0]["sequence_model"]["served"]["test_workflows"] == 60
    assert sections[2]["sequence_model"]["served"] == {"candidate": "ours", "reason": "no start times"}
