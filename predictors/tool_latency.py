"""Tool-call latency distributions per (workflow type, tool).

SAGA models tool latency as lognormal: ln T ~ N(μ, σ²). The maximum-likelihood fit is
μ̂ = mean(ln tᵢ), σ̂ = std(ln tᵢ) (scipy ``lognorm.fit`` with the location fixed at 0). The
Kolmogorov–Smirnov distance D = sup_t |F̂ₙ(t) − F_LN(t; μ̂, σ̂)| says how well it fits; when D is
above ``ks_threshold`` the lognormal is flagged ``poor_fit`` and the served quantiles come from the
data instead. The keep-alive TTL a serving engine should hold a session's KV cache for during the
tool call is the served ``ttl_quantile`` (p95 by default, as in SAGA), capped at ``max_ttl_s``.

**Drift.** With ``half_lives`` of more than one candidate and rows that carry ``workflow_id`` and
``t_start``, executions are weighted ``wᵢ = 2^(−ageᵢ / h)`` (age in workflows of the type started
after this one's; see :mod:`predictors.idle_gap`): weighted MLE ``μ̂ = Σwᵢ ln tᵢ / Σwᵢ``,
``σ̂² = Σwᵢ (ln tᵢ − μ̂)² / Σwᵢ`` and weighted empirical quantiles. ``h`` is chosen per workflow
type on a later slice (fit on the oldest 70 % of workflows, score p95 coverage on the rest: the
narrowest reaching the quantile, else the best covered), so an older release does not dominate.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import BaseEstimator

from predictors.idle_gap import (certifies, recency_weights, select_half_life, weighted_conformal_quantile,
                                 workflow_ranks)
from predictors.served import ToolLatencyTable

#: Latencies are floored here before taking logs (a 0 s tool is a clock artifact).
MIN_LATENCY_S = 1e-4


def fit_lognormal(latencies: np.ndarray) -> dict[str, float]:
    """MLE (μ, σ) of a lognormal and the KS distance of the fit."""
    x = np.maximum(np.asarray(latencies, dtype=float), MIN_LATENCY_S)
    sigma, _, scale = stats.lognorm.fit(x, floc=0)
    sigma = max(float(sigma), 1e-6)
    ks = float(stats.kstest(x, "lognorm", args=(sigma, 0, scale)).statistic)
    return {"mu": float(np.log(scale)), "sigma": sigma, "ks": ks}


def ks_lognormal_sorted(xs: np.ndarray, mu: float, sigma: float) -> float:
    """Kolmogorov–Smirnov distance of the *sorted* sample ``xs`` to LN(μ, σ²): the statistic
    ``scipy.stats.kstest`` computes, without sorting again."""
    n = len(xs)
    cdf = stats.lognorm.cdf(xs, sigma, 0, np.exp(mu))
    i = np.arange(n, dtype=float)
    return float(max(np.max((i + 1) / n - cdf), np.max(cdf - i / n)))


def sorted_weighted_quantiles(xs: np.ndarray, ws: np.ndarray, qs: Sequence[float]) -> list[float]:
    """:func:`predictors.idle_gap.weighted_conformal_quantile` (``w_new = 0``) at several ``qs``
    of a sample already sorted by value (``ws`` in the same order): one cumulative sum."""
    cw = np.cumsum(ws)
    share = cw / cw[-1]
    out = []
    for q in qs:
        k = int(np.searchsorted(share, q - 1e-12))
        out.append(float(xs[k]) if k < len(xs) else math.inf)
    return out


class ToolLatencyModel(ToolLatencyTable, BaseEstimator):
    """Lognormal latency per (workflow type, tool), with empirical fallback and TTL.

    Parameters
    ----------
    min_samples : fewest timed executions for a (workflow type, tool) entry.
    ks_threshold : KS distance above which the lognormal is flagged as a poor fit.
    ttl_quantile : quantile used as the keep-alive TTL (SAGA: 0.95).
    max_ttl_s : upper bound on the TTL (None = no bound).

    Fitted attributes: ``tools_`` ({wt: {tool: entry}}), ``global_tools_`` ({tool: entry}, all
    workflow types pooled, the fallback for a tool unseen in a workflow type).
    """

    def __init__(self, min_samples: int = 5, ks_threshold: float = 0.1, ttl_quantile: float = 0.95,
                 max_ttl_s: float | None = 600.0, half_lives: tuple = (None,), min_workflows_drift: int = 20):
        self.min_samples = min_samples
        self.ks_threshold = ks_threshold
        self.ttl_quantile = ttl_quantile
        self.max_ttl_s = max_ttl_s
        self.half_lives = half_lives
        self.min_workflows_drift = min_workflows_drift

    def _entry(self, latencies: np.ndarray, weights: np.ndarray | None = None) -> dict[str, Any]:
        x = np.asarray(latencies, dtype=float)
        if weights is None or np.allclose(weights, weights[0]):
            fit = fit_lognormal(x)
            emp = np.quantile(x, [0.5, 0.95, 0.99, self.ttl_quantile])
        else:
            w = np.asarray(weights, dtype=float)
            lx = np.log(np.maximum(x, MIN_LATENCY_S))
            mu = float(np.average(lx, weights=w))
            sigma = max(float(np.sqrt(np.average((lx - mu) ** 2, weights=w))), 1e-6)
            order = np.argsort(x, kind="stable")  # one sort for the KS distance and 4 quantiles
            xs = x[order]
            ks = ks_lognormal_sorted(np.maximum(xs, MIN_LATENCY_S), mu, sigma)
            fit = {"mu": mu, "sigma": sigma, "ks": ks}
            emp = sorted_weighted_quantiles(xs, w[order], (0.5, 0.95, 0.99, self.ttl_quantile))
        poor = fit["ks"] > self.ks_threshold
        if poor:
            served = emp
        else:
            served = [float(np.exp(fit["mu"] + fit["sigma"] * stats.norm.ppf(q)))  # LN quantiles
                      for q in (0.5, 0.95, 0.99, self.ttl_quantile)]
        ttl = float(served[3]) if self.max_ttl_s is None else float(min(served[3], self.max_ttl_s))
        return {
            "n": int(len(x)), **fit, "poor_fit": bool(poor),
            "source": "empirical" if poor else "lognormal",
            "p50_s": float(served[0]), "p95_s": float(served[1]), "p99_s": float(served[2]),
            "emp_p50_s": float(emp[0]), "emp_p95_s": float(emp[1]), "emp_p99_s": float(emp[2]),
            "mean_s": float(x.mean()), "ttl_s": ttl,
        }

    def _fit_tools(self, df: pd.DataFrame, weighted: bool = True) -> dict[str, dict[str, Any]]:
        """{tool: entry} of one workflow type's rows (``weight`` column optional; ``weighted=False``
        ignores it). One grouping gives each tool's row positions, in frame order: its latencies
        and weights are read from the two columns, no per-tool frame is built."""
        latency = df["latency_s"].to_numpy()
        weight = df["weight"].to_numpy() if weighted and "weight" in df else None
        rows = df.groupby("tool_name", sort=True, observed=True).indices
        return {tool: self._entry(latency[idx], None if weight is None else weight[idx])
                for tool, idx in sorted(rows.items()) if len(idx) >= self.min_samples}

    def _choose_half_life(self, g: pd.DataFrame) -> float | None:
        """Half-life of one workflow type by a later slice (:func:`select_half_life`): p95
        coverage of the later workflows' tool calls (module doc)."""
        def score(train: pd.DataFrame, later: pd.DataFrame) -> tuple[float, float]:
            tools = self._fit_tools(train)
            p95 = later["tool_name"].astype(object).map({t: e["p95_s"] for t, e in tools.items()}).to_numpy(dtype=float)
            ok = ~np.isnan(p95)
            if not ok.any():
                return math.nan, math.nan
            x = later["latency_s"].to_numpy()[ok]
            return float(np.mean(x <= p95[ok])), float(np.mean(p95[ok]))
        # among equally covered half-lives the first listed is kept (as tool-latency profiles always
        # have: the idle-gap rule, the narrower, would change their versions)
        # a half-life that leaves the type's executions less weight than the quantile needs
        # (:func:`predictors.idle_gap.certifies`) is not a candidate
        return select_half_life(g, int(g["rank"].max()) + 1, self.half_lives, self.min_workflows_drift,
                                self.ttl_quantile, score, narrower_on_ties=False,
                                eligible=lambda t: certifies(t["weight"].to_numpy(), self.ttl_quantile))[0]

    def fit(self, tool_calls: pd.DataFrame) -> "ToolLatencyModel":
        """``tool_calls``: rows with workflow_type_id, tool_name, latency_s (NULLs ignored); with
        ``workflow_id`` and ``t_start`` too, recency weighting per workflow type (module doc)."""
        df = tool_calls.dropna(subset=["latency_s"])
        df = df[df["latency_s"] >= 0]
        # categorical keys: groupby and row selection take codes, not (Arrow) strings
        df = df.astype({c: "category" for c in ("workflow_type_id", "tool_name") if c in df.columns})
        self.tools_ = {}
        self.half_life_: dict[str, float | None] = {}
        drift = len(self.half_lives) > 1 and {"workflow_id", "t_start"} <= set(df.columns) and len(df)
        if drift:
            df = df.assign(rank=workflow_ranks(df.assign(t_arrival=df["t_start"])).to_numpy())
        for wt, g in df.groupby("workflow_type_id", sort=True, observed=True):
            if drift:
                h = self._choose_half_life(g)
                self.half_life_[wt] = h
                g = g.assign(weight=recency_weights(g["rank"].to_numpy(), int(g["rank"].max()) + 1, h))
            tools = self._fit_tools(g)
            if tools:
                self.tools_[wt] = tools
        self.global_tools_ = self._fit_tools(df, weighted=False)
        return self

    def cdf(self, workflow_type_id: str, tool: str, t: np.ndarray) -> np.ndarray:
        """The fitted lognormal CDF at ``t`` (for evaluation and plots)."""
        e = self.lookup(workflow_type_id, tool)
        if e is None:
            raise KeyError(f"no latency model for tool {tool!r} in {workflow_type_id!r}")
        return stats.lognorm.cdf(np.asarray(t, dtype=float), e["sigma"], 0, np.exp(e["mu"]))

    def to_dict(self) -> dict[str, Any]:
        return {"params": {**self.get_params(), "half_lives": list(self.half_lives)},
                "workflow_types": self.tools_, "global": self.global_tools_,
                "half_life": getattr(self, "half_life_", {})}
