"""Score the served output-length bands as serving sees them: online (``profiler eval --online``).

``profiler eval`` scores each held-out call against the band the profile fitted. A server does
more: it observes every finished call (the gateway and sidecar call
:meth:`predictors.Predictor.observe`), and with online calibration
(:mod:`predictors.online_calibration`) the band it serves next moves with those outcomes. This
replay does the same. The held-out calls of every workflow are merged into one stream in arrival
order; at each call's arrival the :class:`~predictors.Predictor` annotates it (the served band is
recorded), at its finish the outcome is fed back (``observe``), so each prediction is made before
its call with only the outcomes of calls finished earlier (a finish and an arrival at the same
instant: the finish first; a call never finishes before it arrives).

Two predictors replay the same stream: ``online`` (the serving default, calibration on) and
``static`` (calibration off: the fitted bands). Beside them, the naive bands a user would compute
(:func:`scoring.evaluation.output_length_baselines`, fit on the training calls, stored in the
profile) on the same calls; ``drift_alarm`` reports, per workflow type, whether the coverage
monitor (:mod:`predictors.coverage_monitor`) fired. The same two replays score the keep-alive TTL
each call's annotation serves on the idle gap after it (bounded as ``KeepDropPolicy.ttl_s``
serves it, with ``profiler eval``'s cost), and each call's ``expected_remaining_output_tokens``
(online: with the remaining-work selection of :mod:`predictors.online_selection`) with
``profiler eval``'s concurrent-session C-index and jackknife (:mod:`scoring.remaining_eval`).

``online_vs_global`` (:func:`vs_global`): the served minus the global band, ± jackknife errors;
``band_arms`` (:func:`band_arms`): per type, how many bands the global arm served, and switches.
``keep_alive.vs_baselines``: the served TTL minus each keep-alive baseline of ``profiler eval``
(:func:`scoring.evaluation.keep_alive_baseline_ttls`) on the same gaps, coverage and KV-seconds
per covered gap ± jackknife errors, ``dominated`` (:func:`keep_alive_vs`).

``worst_window_coverage``: the lowest coverage over consecutive runs of ``WINDOW`` scored calls
(in arrival order): what a drifting stretch of the log costs, which the mean hides. Every key of
the result (``profiler eval --online --json``): docs/evaluation.md, "profiler eval --online".
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import duckdb
import numpy as np
import pandas as pd

from fitting.profile_fit import idle_gap_calls
from predictors.output_length import OutputLengthIntervals
from predictors.predictor import Predictor
from store import ingest as ingest_mod
from scoring.evaluation import (KEEP_DROP, keep_alive_baseline_ttls, keep_alive_cost, keep_alive_vs,
                                 output_length_baselines)
from scoring.remaining_eval import BASELINES as RW_BASELINES, baseline_predictions, c_index_diff, session_c_index
from predictors.remaining_tokens import session_frame
from store.profile_artifact import Profile
from store.duckdb_store import connect

#: Scored calls per window of ``worst_window_coverage``.
WINDOW = 200


def stream_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every ok held-out call with what the replay needs, in arrival order."""
    return con.execute(
        "SELECT workflow_type_id, workflow_id, agent_id, request_id, call_index, input_tokens, "
        "output_tokens, t_arrival, t_finish FROM calls WHERE status = 'ok' "
        "ORDER BY t_arrival, workflow_type_id, workflow_id, call_index").df()


def event_order(t_arrival: np.ndarray, t_finish: np.ndarray) -> list[tuple[int, int]]:
    """``(kind, row)`` events in time order: kind 1 an arrival, kind 0 a finish; a finish sorts
    before an arrival at the same instant, and never before its own call's arrival."""
    n = len(t_arrival)
    fin = np.maximum(t_finish, t_arrival)
    own = fin <= t_arrival                          # finishes at its own arrival: right after it
    times = np.concatenate([t_arrival, fin])
    rank = np.concatenate([np.ones(n), np.where(own, 2, 0)])
    seq = np.concatenate([np.arange(n), np.arange(n)])
    order = np.lexsort((seq, rank, times))
    kinds = np.concatenate([np.ones(n, dtype=int), np.zeros(n, dtype=int)])
    return [(int(kinds[i]), int(seq[i])) for i in order]


def replay_served(profile: Profile, calls: pd.DataFrame, *, online: Any,
                  remaining_selection: Any = None, keep_alive_selection: Any = False) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, dict]:
    """Served bands ``(lo, hi)`` and keep-alive TTLs per call (NaN: none served) replaying
    ``calls`` through one :class:`~predictors.Predictor`, the drift alarm's record per workflow
    type, and ``{"served": remaining work per call (expected_remaining_output_tokens, NaN: none),
    "selection": the remaining-work selector's status per type ({} when off), "band_arms": which
    arm served the band per type (:func:`band_arms`; {} without calibration), "keep_alive_selection":
    the keep-alive candidate served per type and its switches ({} when off)}``.
    ``online`` switches both calibrations (the Predictor's one switch), ``remaining_selection``
    the remaining-work selection (None: as ``online``), ``keep_alive_selection`` the online choice
    among keep-alive candidates (the Predictor's, off by default). A workflow's session is ended
    (:meth:`~predictors.Predictor.end_session`) when its last call finishes: the end signal a
    client sends (a server without one learns it at the session's idle expiry, later)."""
    if remaining_selection is None:
        remaining_selection = online
    pred = Predictor(profile, max_sessions=1_000_000, online_calibration=online,
                     remaining_selection=remaining_selection, keep_alive_selection=keep_alive_selection)
    lo, hi = np.full(len(calls), np.nan), np.full(len(calls), np.nan)
    ttl, rem = np.full(len(calls), np.nan), np.full(len(calls), np.nan)
    wf_code = calls.groupby(["workflow_type_id", "workflow_id"], sort=False).ngroup().to_numpy()
    left = np.bincount(wf_code)                     # calls of each workflow not finished yet
    wt_, wf_, ag_ = (calls[c].astype(str).to_numpy() for c in ("workflow_type_id", "workflow_id", "agent_id"))
    rid_ = calls["request_id"].astype(str).to_numpy()
    inp_ = calls["input_tokens"].to_numpy()
    out_ = calls["output_tokens"].to_numpy()
    ta, tf = calls["t_arrival"].to_numpy(dtype=float), calls["t_finish"].to_numpy(dtype=float)
    alarm: dict[str, dict[str, Any]] = {}
    seen: dict[str, int] = {}
    for kind, k in event_order(ta, tf):
        meta = {"workflow_type_id": wt_[k], "workflow_id": wf_[k], "agent_id": ag_[k]}
        if kind == 1:
            pred.clock = lambda t=ta[k]: t
            inp = None if pd.isna(inp_[k]) else int(inp_[k])
            ann = pred.annotate_call(meta, request_id=rid_[k], input_tokens=inp)
            if ann.predicted_output_len is not None:
                lo[k], hi[k] = ann.predicted_output_len
            if ann.keep_alive_ttl_s is not None:
                ttl[k] = ann.keep_alive_ttl_s
            if ann.expected_remaining_output_tokens is not None:
                rem[k] = ann.expected_remaining_output_tokens
            continue
        pred.clock = lambda t=max(tf[k], ta[k]): t
        hit = pred.observe({"app_metadata": meta, "request_id": rid_[k], "output_tokens": int(out_[k]),
                            "input_tokens": None if pd.isna(inp_[k]) else int(inp_[k]), "t_finish": tf[k]})
        left[wf_code[k]] -= 1
        if left[wf_code[k]] == 0:                   # the workflow's last call finished: it ended
            pred.end_session(meta)
        if hit is None:
            continue
        wt = wt_[k]
        seen[wt] = seen.get(wt, 0) + 1
        st = pred.coverage_monitor.status().get(wt) or {}
        rec = alarm.setdefault(wt, {"fired": False, "first_after": None})
        if st.get("alarm") and not rec["fired"]:
            rec.update(fired=True, first_after=seen[wt])
    for wt, st in pred.coverage_monitor.status().items():
        rec = alarm.setdefault(wt, {"fired": False, "first_after": None})
        rec.update(alarm_at_end=bool(st["alarm"]), coverage_at_end=st["coverage"])
    selection = pred.remaining_selector.status() if pred.remaining_selector is not None else {}
    arms = band_arms(pred.calibrator.status()) if pred.calibrator is not None else {}
    ka_sel = pred.keep_alive_selector.status() if pred.keep_alive_selector is not None else {}
    return lo, hi, ttl, alarm, {"served": rem, "selection": selection, "band_arms": arms,
                                "keep_alive_selection": ka_sel}


def band_arms(status: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per workflow type, which arm served the output band (:mod:`predictors.online_calibration`:
    each agent's own band or the global one): ``served``, ``served_global`` (bands served, and of
    them from the global arm), ``switches``, ``global_at_end`` (agents on the global arm at the
    end) and per agent its ``arm`` at the end, ``switches`` and ``served_global``."""
    out = {}
    for wt, agents in sorted(status.items()):
        out[wt] = {"served": sum(a["served"] for a in agents.values()),
                   "served_global": sum(a["served_global"] for a in agents.values()),
                   "switches": sum(a["switches"] for a in agents.values()),
                   "global_at_end": sorted(n for n, a in agents.items() if a["arm"] == "global"),
                   "agents": {n: {k: a[k] for k in ("arm", "switches", "served_global")}
                              for n, a in sorted(agents.items()) if a["served"]}}
    return out


def paired_diff_se(a: np.ndarray, b: np.ndarray, groups: np.ndarray) -> tuple[float, float | None]:
    """``(mean(a − b), its standard error)`` over paired per-call values, the error by the
    delete-one-workflow jackknife (calls of one workflow are not independent): with ``θ₋g`` the
    mean difference without workflow g, ``se² = (G − 1)/G · Σ_g (θ₋g − θ̄)²``. None for fewer
    than two workflows."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    codes, g = np.unique(groups, return_inverse=True)
    total, n = float(d.sum()), len(d)
    if len(codes) < 2 or n == 0:
        return (float(d.mean()) if n else float("nan")), None
    s_g = np.bincount(g, weights=d, minlength=len(codes))
    n_g = np.bincount(g, minlength=len(codes)).astype(float)
    theta = (total - s_g) / (n - n_g)
    k = len(codes)
    return total / n, float(np.sqrt((k - 1) / k * np.sum((theta - theta.mean()) ** 2)))


def vs_global(y: np.ndarray, lo: np.ndarray, hi: np.ndarray, band: Sequence[float] | None,
              groups: np.ndarray) -> dict[str, Any] | None:
    """The served band minus the global band (the training calls' empirical one, as
    :func:`scoring.evaluation.output_length_baselines` scores it) on the same calls: the
    coverage and mean-width differences, each with its delete-one-workflow jackknife standard
    error (:func:`paired_diff_se`), and ``dominated``: the global band covers more by over one
    standard error at no more width (or covers as much at a width smaller by over one)."""
    if band is None or not len(y):
        return None
    g_lo, g_hi = float(band[0]), float(band[1])
    ours_in = ((y >= lo) & (y <= hi)).astype(float)
    glob_in = ((y >= g_lo) & (y <= g_hi)).astype(float)
    dc, dc_se = paired_diff_se(ours_in, glob_in, groups)
    dw, dw_se = paired_diff_se(hi - lo, np.full(len(y), g_hi - g_lo), groups)
    se_c, se_w = dc_se or 0.0, dw_se or 0.0
    dominated = bool((dc < -se_c and dw >= 0) or (dc <= 0 and dw > se_w))
    return {"coverage_diff": dc, "coverage_diff_se": dc_se, "width_diff": dw, "width_diff_se": dw_se,
            "dominated": dominated}


def _scores(y: np.ndarray, lo: np.ndarray, hi: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """Coverage, mean width and worst-window coverage over the rows of ``mask``."""
    if not mask.any():
        return {"coverage": None, "mean_width": None, "worst_window_coverage": None}
    inside = ((y >= lo) & (y <= hi))[mask].astype(float)
    windows = (np.convolve(inside, np.ones(WINDOW), "valid") / WINDOW) if len(inside) >= WINDOW else inside[:0]
    return {"coverage": float(inside.mean()), "mean_width": float((hi - lo)[mask].mean()),
            "worst_window_coverage": float(windows.min()) if len(windows) else None}


def stream_gaps(con: duckdb.DuckDBPyConnection, calls: pd.DataFrame) -> np.ndarray:
    """The idle gap after each row of ``calls`` (``profiler eval``'s: NaN at a session's end, after
    a person's turn, and where the log's times are not real)."""
    keys = ["workflow_type_id", "workflow_id", "call_index"]
    gaps = idle_gap_calls(con)[[*keys, "gap_after_s"]]
    merged = calls[keys].astype({"workflow_type_id": str, "workflow_id": str}).merge(
        gaps.astype({"workflow_type_id": str, "workflow_id": str}), how="left", on=keys, validate="many_to_one")
    return merged["gap_after_s"].to_numpy(dtype=float)


def _keep_alive_scores(gap: np.ndarray, ttl: np.ndarray, mask: np.ndarray) -> dict[str, Any]:
    """Coverage, mean TTL, KV-seconds per covered gap and worst-window coverage of the served
    TTLs ``ttl`` on the idle gaps of ``mask`` (TTLs bounded as the keep/drop policy serves them)."""
    if not mask.any():
        return {"coverage": None, "mean_ttl_s": None, "kv_s_per_covered_gap": None,
                "worst_window_coverage": None}
    cost = keep_alive_cost(gap[mask], ttl[mask])
    inside = cost.covered.astype(float)
    windows = (np.convolve(inside, np.ones(WINDOW), "valid") / WINDOW) if len(inside) >= WINDOW else inside[:0]
    return {"coverage": float(inside.mean()), "mean_ttl_s": float(cost.held.mean()),
            "kv_s_per_covered_gap": cost.kv_s_per_covered_gap,
            "worst_window_coverage": float(windows.min()) if len(windows) else None}


def keep_alive_online(profile: Profile, con: duckdb.DuckDBPyConnection, calls: pd.DataFrame,
                      on_ttl: np.ndarray, st_ttl: np.ndarray,
                      selection: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The ``keep_alive`` part of the result (module doc); None without an idle-gap section.
    ``selection``: the keep-alive selector's status after the replay (which candidate served per
    type, how often it switched), reported as is."""
    section = profile.data.get("idle_gap")
    if not section:
        return None
    gap = stream_gaps(con, calls)
    scored = ~np.isnan(gap) & ~np.isnan(on_ttl) & ~np.isnan(st_ttl)
    cap = KEEP_DROP.max_ttl_s
    oracle = np.where(gap <= cap, gap, 0.0)   # hindsight: hold exactly the gap, or nothing (as eval)
    wts = calls["workflow_type_id"].astype(str).to_numpy()
    groups = np.char.add(np.char.add(wts, "\x1f"), calls["workflow_id"].astype(str).to_numpy())
    base_ttls = keep_alive_baseline_ttls(profile, con, calls)
    by_type = {}
    for wt in sorted(set(wts[scored])):
        mask = scored & (wts == wt)
        by_type[wt] = {"gaps": int(mask.sum()), "online": _keep_alive_scores(gap, on_ttl, mask),
                       "static": _keep_alive_scores(gap, st_ttl, mask)}
    return {
        "nominal": float((section.get("params") or {}).get("quantile", 0.95)),
        "gaps": int(scored.sum()),
        "online": _keep_alive_scores(gap, on_ttl, scored),
        "static": _keep_alive_scores(gap, st_ttl, scored),
        "oracle_kv_s_per_covered_gap": keep_alive_cost(gap[scored], oracle[scored],
                                                       bounded=False).kv_s_per_covered_gap,
        # the baselines on the same gaps, and the served (online) TTL minus each ± jackknife se
        "baselines": {name: _keep_alive_scores(gap, ttl, scored) for name, ttl in base_ttls.items()},
        "vs_baselines": {name: keep_alive_vs(gap[scored], on_ttl[scored], ttl[scored], groups[scored])
                         for name, ttl in base_ttls.items()},
        "by_type": by_type,
        "selection": selection or {},
    }


def remaining_online(profile: Profile, calls: pd.DataFrame, online_rem: np.ndarray, static_rem: np.ndarray,
                     selection: dict[str, Any]) -> dict[str, Any] | None:
    """The ``remaining_tokens`` part of the result (module doc): the remaining work served by
    the two replays and the baselines of ``profiler eval``'s ``remaining_work``
    (:mod:`scoring.remaining_eval`), scored on exactly the calls both replays served a figure,
    with the same concurrent-session C-index; None without a ``remaining_tokens`` section."""
    section = profile.data.get("remaining_tokens")
    if not section or calls.empty:
        return None
    order = np.lexsort((calls["call_index"].to_numpy(), calls["workflow_id"].astype(str).to_numpy(),
                        calls["workflow_type_id"].astype(str).to_numpy()))
    c = calls.iloc[order].reset_index(drop=True)       # workflow by workflow in call order
    frame = session_frame(c)
    truth = frame["R"].to_numpy()
    on, st = online_rem[order], static_rem[order]
    scored = ~np.isnan(on) & ~np.isnan(st)
    preds = {"online": on, "static": st, **baseline_predictions(section, frame, profile.data.get("nat_trie"))}
    preds = {k: np.where(scored, v, np.nan) for k, v in preds.items()}   # exactly the same calls
    cidx, pairing, n = session_c_index(c, truth, preds, "online", scored)

    def figure(name: str) -> dict[str, Any]:
        p = preds.get(name)
        ok = ~np.isnan(p) if p is not None else None
        return {"c_index": cidx[name][0],
                "log1p_mae": (float(np.mean(np.abs(np.log1p(np.maximum(p[ok], 0.0)) - np.log1p(truth[ok]))))
                              if ok is not None and ok.any() else None)}
    return {"calls": int(scored.sum()), "pairs": cidx["online"][1], "pairing": pairing,
            "online": figure("online"), "static": figure("static"),
            "baselines": {name: figure(name) for name in (*RW_BASELINES, "age")},
            "online_minus_static": c_index_diff(cidx, "online", "static", n),
            "vs_position_median": {"online": c_index_diff(cidx, "online", "position_median", n),
                                   "static": c_index_diff(cidx, "static", "position_median", n)},
            "vs_mrl": {"online": c_index_diff(cidx, "online", "mrl", n),
                       "static": c_index_diff(cidx, "static", "mrl", n)},
            "online_vs_baselines": {name: c_index_diff(cidx, "online", name, n) for name in (*RW_BASELINES, "age")},
            "selection": selection}


def online_scores(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The ``profiler eval --online`` result of ``profile`` on the calls in ``con`` (module doc)."""
    calls = stream_calls(con)
    y = calls["output_tokens"].to_numpy(dtype=float)
    on_lo, on_hi, on_ttl, alarm, on_rw = replay_served(profile, calls, online=True)
    st_lo, st_hi, st_ttl, _, st_rw = replay_served(profile, calls, online=False)
    scored = ~np.isnan(on_lo) & ~np.isnan(st_lo)     # calls both served a band
    est = OutputLengthIntervals.from_dict(profile.data["output_length"])
    baselines = output_length_baselines(est, calls[scored].reset_index(drop=True))
    online = _scores(y, on_lo, on_hi, scored)
    emp = (baselines.get("per_agent_empirical") or {}).get("mean_width")
    wts = calls["workflow_type_id"].astype(str).to_numpy()
    wfs = (calls["workflow_type_id"].astype(str) + "\x1f" + calls["workflow_id"].astype(str)).to_numpy()
    g_band = est.global_.get("empirical_band")
    by_type = {}
    for wt in sorted(set(wts[scored])):
        mask = scored & (wts == wt)
        by_type[wt] = {"calls": int(mask.sum()), "online": _scores(y, on_lo, on_hi, mask),
                       "static": _scores(y, st_lo, st_hi, mask),
                       "global": _scores(y, np.full(len(y), g_band[0]), np.full(len(y), g_band[1]), mask)
                       if g_band is not None else None,
                       "online_vs_global": vs_global(y[mask], on_lo[mask], on_hi[mask], g_band, wfs[mask])}
    return {
        "nominal": float(est.coverage),
        "calls": int(len(calls)),
        "scored": int(scored.sum()),
        "online": online,
        "static": _scores(y, st_lo, st_hi, scored),
        "baselines": baselines,
        "online_vs_global": vs_global(y[scored], on_lo[scored], on_hi[scored], g_band, wfs[scored]),
        "width_vs_per_agent_empirical": (online["mean_width"] / emp
                                         if emp and online["mean_width"] is not None and emp == emp else None),
        "by_type": by_type,
        "drift_alarm": alarm,
        "band_arms": on_rw["band_arms"],
        "keep_alive": keep_alive_online(profile, con, calls, on_ttl, st_ttl, on_rw["keep_alive_selection"]),
        "remaining_tokens": remaining_online(profile, calls, on_rw["served"], st_rw["served"],
                                             on_rw["selection"]),
        "window": WINDOW,
    }


def evaluate_online(profile: Profile, paths: Sequence[str | Path], *, strict: bool = False,
                    progress: bool = False) -> tuple[dict[str, Any], ingest_mod.IngestReport]:
    """Ingest ``paths`` into a temporary store and score ``profile`` online on them."""
    con = connect(None)
    try:
        report = ingest_mod.ingest(con, paths, strict=strict, progress=progress)
        if con.execute("SELECT count(*) FROM calls WHERE status = 'ok'").fetchone()[0] == 0:
            raise ValueError("no valid calls in the evaluation logs")
        return online_scores(profile, con), report
    finally:
        con.close()
