"""Step-time model of one replica, calibrated from measured request timings.

A continuous-batching engine runs *iterations*. One iteration processes a chunk of prefill tokens
(new prompt tokens of admitted requests) and one decode token for every request already decoding.
Its duration is modelled as linear in the work it does::

    dt = t0 + a·P + a_ctx·X + c·K      (+ e·B + a_attn·Σ P·ctx for the roofline model)

``P``     prefill tokens computed in the iteration (cache hits are not computed);
``X``     attention context of those prefill tokens (per request: prefix length × chunk share);
``K``     KV tokens read by the decoding requests (sum of their contexts);
``t0``    fixed cost of a decode iteration (weights read once per step: memory-bound decode).

How it is fitted (:func:`fit_step_time`), on flat records with ``t_first_token`` and token counts:

* **prefill** ``a``, ``a_ctx``: time to first token of calls served alone (``num_workers == 1``
  when the log says so, else all calls) regressed on the *uncached* prompt tokens (the prompt minus
  the engine's reported ``cached_tokens``; without them, minus the previous call's prompt and
  output, which a prefix cache holds) and on the whole prompt
  length, non-negative least squares (``TTFT ≈ a·new + a_ctx·input``);
* **decode** ``t0``, ``c``: time per output token ``(t_last − t_first)/(out − 1)`` of calls with at
  least 16 output tokens, regressed by **median** (L1) regression on the KV tokens being read in
  the same interval (the call's own context plus the time-weighted contexts of every other call
  decoding at the same time), which is robust to the stalls other calls' prefills cause.

:data:`SWE_AGENT_GLM45` holds the fit on the bundled SWE-agent traces (GLM-4.5-FP8 on vLLM), the
step model of ``--step-model glm45-fit``; ``profiler simulate --calibrate LOGS`` refits on other
logs. The default step model is the hardware roofline of :mod:`simulator.hardware`.

**From a replay** (``profiler replay --out calls.jsonl`` or ``serving_hooks.replay_report.call_records``,
sent to *one* replica): the records carry the send time as ``t_arrival``, the first streamed
token and the last chunk, but no ``num_workers``. :func:`mark_concurrency` derives it — calls in
flight on the replica while the call waited for its first token — so that the prefill fit uses
the calls served alone; ``fit_step_time(..., prefill_intercept=True)`` adds a constant to the
prefill regression (``TTFT ≈ p0 + a·new + a_ctx·input``, stored as ``prefill_t0``): on a small
engine the fixed cost of a call (HTTP, tokenizer, scheduler round trip, one forward pass) is a
large share of its TTFT, and a fit through the origin would fold it into ``a``.
``bench/bench_engine.py`` calibrates the simulator to real SGLang replicas this way.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable

import numpy as np


@dataclass(frozen=True)
class StepTimeModel:
    """``dt = t0 + a·P + a_ctx·X + c·K`` (seconds; see the module docstring)."""

    t0: float
    a: float
    a_ctx: float
    c: float
    #: Seconds per decoding sequence per iteration (its token's GEMMs; 0 in the fitted model).
    e: float = 0.0
    #: Seconds per (computed prompt token × context token): causal attention (0 when fitted).
    a_attn: float = 0.0
    #: Fixed cost of an iteration that prefills (weights read once; 0 when fitted: in ``a``).
    prefill_t0: float = 0.0
    #: ``a_ctx`` was fitted on calls whose cache hits the engine reported (``new`` = prompt minus
    #: cached): the context term is paid by hits too (attention over the cached context, the
    #: prompt's tokenization), so the simulator charges it on every call, not only on misses.
    ctx_on_hits: bool = False
    source: str = ""
    n_prefill: int = 0
    n_decode: int = 0
    prefill_mdape: float = float("nan")
    decode_mdape: float = float("nan")

    def prefill_cost(self, new_tokens: float, context_tokens: float) -> float:
        """Seconds of prefill work for ``new_tokens`` with ``context_tokens`` of attention."""
        return self.a * new_tokens + self.a_ctx * context_tokens

    def decode_step(self, kv_tokens: float, sequences: int = 1) -> float:
        """Duration of a pure-decode iteration of ``sequences`` reading ``kv_tokens`` of KV."""
        return self.t0 + self.e * sequences + self.c * kv_tokens

    def to_dict(self) -> dict:
        return asdict(self)


#: Fit of :func:`fit_step_time` on ``datasets/swe_agent/swe_agent_glm45_bs4.jsonl`` (3,037 calls of
#: SWE-agent on GLM-4.5-FP8 served by vLLM; 205 isolated calls for prefill, 3,027 for decode).
#: Re-derive with ``profiler simulate --calibrate datasets/swe_agent`` (the test
#: ``tests/test_simulator_calibration.py`` checks that the bundled fit matches this constant).
SWE_AGENT_GLM45 = StepTimeModel(
    t0=0.029471, a=1.29083e-04, a_ctx=5.57815e-06, c=1.0927e-07,
    source="SWE-agent/GLM-4.5-FP8 on vLLM (datasets/swe_agent)",
    n_prefill=205, n_decode=3027, prefill_mdape=0.161, decode_mdape=0.259,
)


def _records_frame(records: Iterable[dict]):
    import pandas as pd

    rows = [
        {
            "wf": r["workflow_id"], "t_arrival": float(r["t_arrival"]),
            "t_first": r.get("t_first_token"), "t_last": r.get("t_last_chunk", r["t_finish"]),
            "input": int(r["input_tokens"]), "output": int(r["output_tokens"]),
            "workers": r.get("num_workers"), "cached": r.get("cached_tokens"),
        }
        for r in records
    ]
    df = pd.DataFrame(rows)
    if df.empty or df["t_first"].isna().all():
        raise ValueError("calibration needs records with t_first_token (time of the first token)")
    df = df.dropna(subset=["t_first"]).sort_values(["wf", "t_arrival"]).reset_index(drop=True)
    prev_ctx = (df.groupby("wf")["input"].shift(1) + df.groupby("wf")["output"].shift(1)).fillna(0)
    df["new"] = (df["input"] - prev_ctx).clip(lower=0)
    df.loc[df["new"] <= 0, "new"] = df["input"]
    # the engine's own count of prompt tokens served from its cache, when it reported one
    known = df["cached"].notna()
    df.loc[known, "new"] = (df.loc[known, "input"] - df.loc[known, "cached"].astype(float)).clip(lower=1)
    return df


def mark_concurrency(records: Iterable[dict]) -> list[dict]:
    """Copies of ``records`` (calls sent to one replica) with ``num_workers`` = 1 + the number of
    other calls in flight at some point between the call's send (``t_arrival``) and its first
    token (``t_first_token``; its finish when absent). ``num_workers == 1``: served alone."""
    recs = [dict(r) for r in records]
    if not recs:
        return recs
    send = np.array([float(r["t_arrival"]) for r in recs])
    fin = np.array([float(r["t_finish"]) for r in recs])
    first = np.array([float(r.get("t_first_token") or r["t_finish"]) for r in recs])
    # j overlaps i's wait [send_i, first_i] iff send_j < first_i and fin_j > send_i
    overlap = (send[None, :] < first[:, None]) & (fin[None, :] > send[:, None])
    for r, n in zip(recs, overlap.sum(axis=1)):
        r["num_workers"] = int(n)            # the diagonal counts the call itself
    return recs


def fit_step_time(records: Iterable[dict], source: str = "", prefill_intercept: bool = False) -> StepTimeModel:
    """Fit :class:`StepTimeModel` from flat log records (see the module docstring for the method).

    ``prefill_intercept``: fit ``TTFT ≈ p0 + a·new + a_ctx·input`` and keep ``p0`` as
    ``prefill_t0`` (the fixed cost of a prefilling iteration and of the call around it)."""
    from scipy.optimize import nnls
    from sklearn.linear_model import QuantileRegressor

    df = _records_frame(records)
    first = df["t_first"].to_numpy(float)
    last = np.maximum(df["t_last"].to_numpy(float), first)
    ttft = first - df["t_arrival"].to_numpy(float)
    inp = df["input"].to_numpy(float)
    out = df["output"].to_numpy(float)
    new = df["new"].to_numpy(float)

    alone = (df["workers"] == 1).to_numpy() if df["workers"].notna().any() else np.ones(len(df), bool)
    if alone.sum() < 10:
        alone = np.ones(len(df), bool)
    a_mat = np.c_[new[alone], inp[alone]]
    if prefill_intercept:
        a_mat = np.c_[a_mat, np.ones(int(alone.sum()))]
    coef, _ = nnls(a_mat, ttft[alone])
    a, a_ctx = coef[0], coef[1]
    p0 = float(coef[2]) if prefill_intercept else 0.0
    pre_err = np.median(np.abs(a_mat @ coef - ttft[alone]) / ttft[alone])

    # KV tokens read while each call decodes: its own context plus the time-weighted contexts of
    # every call decoding at the same time (a sweep over sorted intervals would be O(n log n);
    # the traces are small enough for the O(n²) vectorized form).
    ctx = inp + out / 2
    order = np.argsort(first)
    s, e, cx = first[order], last[order], ctx[order]
    kv = np.empty(len(s))
    for i in range(len(s)):
        span = max(e[i] - s[i], 1e-9)
        lo, hi = np.searchsorted(s, s[i] - 3600), np.searchsorted(s, e[i])
        ov = np.clip(np.minimum(e[lo:hi], e[i]) - np.maximum(s[lo:hi], s[i]), 0, None)
        kv[i] = (ov * cx[lo:hi]).sum() / span
    kv_read = np.empty_like(kv)
    kv_read[order] = kv
    tpot = (last - first) / np.maximum(out - 1, 1)
    keep = out >= 16
    if keep.sum() < 2:
        raise ValueError(f"the decode fit needs calls with at least 16 output tokens: {int(keep.sum())} of "
                         f"{len(out)} records have them (replay with larger outputs, e.g. --token-scale 1)")
    qr = QuantileRegressor(quantile=0.5, alpha=0.0, solver="highs").fit(kv_read[keep, None], tpot[keep])
    t0, c = float(qr.intercept_), float(max(qr.coef_[0], 0.0))
    dec_err = np.median(np.abs(t0 + c * kv_read[keep] - tpot[keep]) / tpot[keep])
    return StepTimeModel(
        t0=round(t0, 6), a=float(f"{a:.6g}"), a_ctx=float(f"{a_ctx:.6g}"), c=float(f"{c:.5g}"),
        prefill_t0=round(p0, 6), ctx_on_hits=bool(df.loc[alone, "cached"].notna().any()),
        source=source, n_prefill=int(alone.sum()), n_decode=int(keep.sum()),
        prefill_mdape=round(float(pre_err), 3), decode_mdape=round(float(dec_err), 3),
    )
