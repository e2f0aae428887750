"""How well the served remaining work ranks sessions (``profiler eval`` → ``remaining_work``).

A scheduler that serves the session with the least work left first needs the *order* between
sessions that wait at the same time to be right, more than each number. So the main score is a
**concordance index** over pairs of sessions active at the same moment:

    C = P( R̂_A < R̂_B  |  R_A < R_B,  A and B both active at t )

(ties in R̂ count ½, ties in R are skipped), where at each held-out call arrival ``t`` the arriving
session is paired with up to ``PAIRS_PER_CALL`` other sessions active then (first call arrived,
last call not finished), each at its latest call; ``R`` is the output tokens a session still has
to generate from that call on (the call's own included), ``R̂`` the prediction served with that
call. ``C = 0.5`` is a random order, 1 the clairvoyant one. Logs whose sessions never overlap
(runs done one at a time: fewer than ``MIN_PAIRS`` such pairs) are paired as if every session had
started at the same moment (``pairing: "aligned_start"``, a burst; the ``age`` baseline then ties
every pair, C = 0.5: every session has the same age). ``mae_tokens`` is the mean
``|R̂ − R|`` over every held-out call.

**Ours is scored exactly as served**: every held-out workflow is replayed call by call through a
``predictors.Predictor`` on the profile (``annotate`` at arrival, ``observe`` at completion), and
``R̂`` is the annotation's ``expected_remaining_output_tokens``. The baselines, fit on the same
training workflows (``profile.json`` → ``remaining_tokens.baselines``): ``position_median``,
``mrl`` (calls done → mean residual life), ``nat_trie`` (NAT's prediction trie, the profile's
``nat_trie`` section, :mod:`predictors.nat_trie`: at the call's (type, agent, agent call index),
p50 output × (mean remaining calls + 1), the tokens its hints ``osl`` × ``total_requests`` imply
with the median in place of p90) and ``age`` (program FCFS: the earlier a session started, the
less work it is taken to have left; ranks only, no MAE).

Beside each baseline's C-index: ``c_index_diff`` (ours − it) and ``c_index_diff_se``, the
standard error of that paired difference by the delete-one-session jackknife
(:func:`jackknife_diff`): a difference within about two standard errors is noise.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import duckdb
import numpy as np
import pandas as pd

from predictors.contract import Annotation
from predictors.nat_trie import agent_call_index, lookup_frame, trie_from_section
from predictors.predictor import Predictor
from predictors.remaining_tokens import (MIN_PAIRS, PAIRS_PER_CALL, c_index_pairs, concordance_pairs,  # noqa: F401
                                         jackknife_diff, session_frame)
from predictors.served import BASELINE_KEYS, baseline_figures
from store.profile_artifact import Profile

BASELINES = ("position_median", "mrl", "nat_trie")


def held_out_calls(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every ok call with what the replay needs, workflow by workflow in call order."""
    return con.execute(
        "SELECT workflow_type_id, workflow_id, agent_id, request_id, input_tokens, output_tokens, "
        "t_arrival, t_finish FROM calls WHERE status = 'ok' "
        "ORDER BY workflow_type_id, workflow_id, call_index").df()


def served_annotations(profile: Profile | str, calls: pd.DataFrame) -> Iterator[Annotation]:
    """The annotation a ``Predictor`` on ``profile`` serves each of ``calls``
    (:func:`held_out_calls`), replayed as served: annotate at arrival, observe at completion."""
    pred = Predictor(profile, max_sessions=1_000_000)
    cols = zip(calls["workflow_type_id"], calls["workflow_id"], calls["agent_id"], calls["request_id"],
               calls["input_tokens"], calls["output_tokens"], calls["t_arrival"], calls["t_finish"])
    for wt, wf, agent, rid, inp, outp, ta, tf in cols:
        meta = {"workflow_type_id": wt, "workflow_id": wf, "agent_id": agent}
        pred.clock = lambda t=ta: t
        yield pred.annotate_call(meta, request_id=rid, input_tokens=int(inp))
        pred.clock = lambda t=tf: t
        pred.observe({"app_metadata": meta, "request_id": rid, "output_tokens": int(outp),
                      "input_tokens": int(inp), "t_finish": tf})


def served_remaining_tokens(profile: Profile, calls: pd.DataFrame) -> np.ndarray:
    """``expected_remaining_output_tokens`` the Predictor serves for every call (NaN: none)."""
    return np.array([np.nan if a.expected_remaining_output_tokens is None
                     else a.expected_remaining_output_tokens
                     for a in served_annotations(profile, calls)], dtype=float)


def baseline_predictions(section: dict[str, Any], calls: pd.DataFrame,
                         trie_section: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
    """The naive baselines of the profile's ``remaining_tokens`` section for every call of
    ``calls`` (a :func:`predictors.remaining_tokens.session_frame`: call index ``i``, ``bucket``),
    and ``nat_trie`` from the profile's ``nat_trie`` section (NaN without one)."""
    out = {name: np.full(len(calls), np.nan) for name in BASELINES}
    tables = section.get("baselines") or {}
    if trie_section:
        wt, agent = calls["workflow_type_id"].to_numpy(), calls["agent_id"].to_numpy()
        index = agent_call_index(wt, calls["workflow_id"].to_numpy(), agent)
        nat = lookup_frame(trie_from_section(trie_section), wt, agent, index)
        out["nat_trie"] = nat["output_p50"] * (nat["remaining_calls"] + 1.0)
    for name, key in BASELINE_KEYS.items():      # read as serving reads them
        for wt, rows in calls.groupby("workflow_type_id", sort=False).indices.items():
            table = (tables.get(wt) or {}).get(name)
            if table:
                out[name][rows] = baseline_figures(table, calls["bucket" if key == "bucket" else "i"].to_numpy()[rows])
    return out


def concordance(preds: dict[str, np.ndarray], truth: np.ndarray, wf_code: np.ndarray,
                t_arrival: np.ndarray, wf_end: np.ndarray, seed: int = 0) -> dict[str, tuple[float | None, int]]:
    """C-index of each prediction over pairs of sessions active at the same time (module doc);
    ``(C, pairs)`` per name."""
    return {name: (c, n) for name, (c, n, _) in
            concordance_pairs(preds, truth, wf_code, t_arrival, wf_end, seed).items()}


def session_c_index(calls: pd.DataFrame, truth: np.ndarray, preds: dict[str, np.ndarray], key: str,
                    scored: np.ndarray | None = None) -> tuple[dict[str, Any], str, int]:
    """Every prediction's C-index (:func:`concordance_pairs`) over pairs of sessions active at
    the same time, beside the ``age`` baseline (older session first; NaN outside ``scored``);
    when ``key``'s prediction has fewer than :data:`MIN_PAIRS` such pairs (sessions that never
    overlapped) over pairs as if every session had started together (``age`` then ties).
    ``(C-indices, "concurrent" | "aligned_start", sessions)``; ``calls`` workflow by workflow."""
    wf_code = calls.groupby(["workflow_type_id", "workflow_id"], sort=False).ngroup().to_numpy()
    t_arrival = calls["t_arrival"].to_numpy(dtype=float)
    wf_end = calls.groupby(wf_code)["t_finish"].max().to_numpy(dtype=float)
    wf_start = calls.groupby(wf_code)["t_arrival"].min().to_numpy(dtype=float)
    keep = np.ones(len(calls), dtype=bool) if scored is None else scored
    preds = {**preds, "age": np.where(keep, wf_start[wf_code], np.nan)}
    # aligned: every session has the same age
    cidx, pairing = c_index_pairs(preds, truth, wf_code, t_arrival, wf_end, wf_start, key,
                                  aligned={"age": np.where(keep, 0.0, np.nan)})
    return cidx, pairing, len(wf_start)


def c_index_diff(cidx: dict[str, Any], a: str, b: str, n_sessions: int) -> dict[str, float] | None:
    """``{"c_index_diff": C_a − C_b, "c_index_diff_se"}`` (:func:`jackknife_diff`); None without
    pairs."""
    jk = jackknife_diff(cidx[a][2], cidx[b][2], n_sessions)
    return None if jk is None else {"c_index_diff": jk[0], "c_index_diff_se": jk[1]}


def remaining_work_scores(profile: Profile, con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """``{"remaining_work": {c_index, mae_tokens, calls, pairs, coverage, baselines}}`` (module doc);
    ``{}`` for a profile without the ``remaining_tokens`` section."""
    section = profile.data.get("remaining_tokens")
    if not section:
        return {}
    calls = held_out_calls(con)
    if calls.empty:
        return {}
    frame = session_frame(calls)          # R (the truth), call index and bucket, as the fit has them
    truth = frame["R"].to_numpy()
    preds = {"ours": served_remaining_tokens(profile, calls),
             **baseline_predictions(section, frame, profile.data.get("nat_trie"))}
    cidx, pairing, n_sessions = session_c_index(calls, truth, preds, "ours")

    def versus(name: str) -> dict[str, float]:
        """``c_index_diff`` (ours − this baseline) and its jackknife ``c_index_diff_se``."""
        return c_index_diff(cidx, "ours", name, n_sessions) or {}

    def mae(p: np.ndarray) -> float | None:
        ok = ~np.isnan(p)
        return float(np.mean(np.abs(p[ok] - truth[ok]))) if ok.any() else None

    ours = preds["ours"]
    return {"remaining_work": {
        "c_index": cidx["ours"][0], "pairs": cidx["ours"][1], "pairing": pairing, "mae_tokens": mae(ours),
        "calls": int(len(calls)), "coverage": float(np.mean(~np.isnan(ours))),
        "baselines": {**{name: {"c_index": cidx[name][0], "mae_tokens": mae(preds[name]), **versus(name)}
                         for name in BASELINES},
                      "age": {"c_index": cidx["age"][0], **versus("age")}},
    }}
