"""Tool-call latency distributions per (workflow type, tool).

SAGA models tool latency as lognormal: ln T ~ N(μ, σ²). The maximum-likelihood fit is
μ̂ = mean(ln tᵢ), σ̂ = std(ln tᵢ) (scipy ``lognorm.fit`` with the location fixed at 0). The
Kolmogorov–Smirnov distance D = sup_t |F̂ₙ(t) − F_LN(t; μ̂, σ̂)| says how well it fits; when D is
above ``ks_threshold`` the lognormal is flagged ``poor_fit`` and the served quantiles come from the
data instead. The keep-alive TTL a serving engine should hold a session's KV cache for during the
tool call is the served ``ttl_quantile`` (p95 by default, as in SAGA), capped at ``max_ttl_s``.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pandas as pd
from scipy import stats
from sklearn.base import BaseEstimator

#: Latencies are floored here before taking logs (a 0 s tool is a clock artifact).
MIN_LATENCY_S = 1e-4


def fit_lognormal(latencies: np.ndarray) -> dict[str, float]:
    """MLE (μ, σ) of a lognormal and the KS distance of the fit."""
    x = np.maximum(np.asarray(latencies, dtype=float), MIN_LATENCY_S)
    sigma, _, scale = stats.lognorm.fit(x, floc=0)
    sigma = max(float(sigma), 1e-6)
    ks = float(stats.kstest(x, "lognorm", args=(sigma, 0, scale)).statistic)
    return {"mu": float(np.log(scale)), "sigma": sigma, "ks": ks}


def lognormal_quantile(mu: float, sigma: float, q: float) -> float:
    """Quantile of LN(μ, σ²): exp(μ + σ Φ⁻¹(q))."""
    return float(np.exp(mu + sigma * stats.norm.ppf(q)))


class ToolLatencyModel(BaseEstimator):
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
                 max_ttl_s: float | None = 600.0):
        self.min_samples = min_samples
        self.ks_threshold = ks_threshold
        self.ttl_quantile = ttl_quantile
        self.max_ttl_s = max_ttl_s

    def _entry(self, latencies: np.ndarray) -> dict[str, Any]:
        x = np.asarray(latencies, dtype=float)
        fit = fit_lognormal(x)
        emp = np.quantile(x, [0.5, 0.95, 0.99, self.ttl_quantile])
        poor = fit["ks"] > self.ks_threshold
        if poor:
            served = emp
        else:
            served = [lognormal_quantile(fit["mu"], fit["sigma"], q) for q in (0.5, 0.95, 0.99, self.ttl_quantile)]
        ttl = float(served[3]) if self.max_ttl_s is None else float(min(served[3], self.max_ttl_s))
        return {
            "n": int(len(x)), **fit, "poor_fit": bool(poor),
            "source": "empirical" if poor else "lognormal",
            "p50_s": float(served[0]), "p95_s": float(served[1]), "p99_s": float(served[2]),
            "emp_p50_s": float(emp[0]), "emp_p95_s": float(emp[1]), "emp_p99_s": float(emp[2]),
            "mean_s": float(x.mean()), "ttl_s": ttl,
        }

    def fit(self, tool_calls: pd.DataFrame) -> "ToolLatencyModel":
        """``tool_calls``: rows with workflow_type_id, tool_name, latency_s (NULLs ignored)."""
        df = tool_calls.dropna(subset=["latency_s"])
        df = df[df["latency_s"] >= 0]
        self.tools_ = {}
        for (wt, tool), g in df.groupby(["workflow_type_id", "tool_name"], sort=True):
            if len(g) >= self.min_samples:
                self.tools_.setdefault(wt, {})[tool] = self._entry(g["latency_s"].to_numpy())
        self.global_tools_ = {
            tool: self._entry(g["latency_s"].to_numpy())
            for tool, g in df.groupby("tool_name", sort=True) if len(g) >= self.min_samples
        }
        return self

    def lookup(self, workflow_type_id: str, tool: str) -> dict[str, Any] | None:
        """The entry for this tool in this workflow type, else the pooled one, else None."""
        entry = self.tools_.get(workflow_type_id, {}).get(tool)
        return entry if entry is not None else self.global_tools_.get(tool)

    def cdf(self, workflow_type_id: str, tool: str, t: np.ndarray) -> np.ndarray:
        """The fitted lognormal CDF at ``t`` (for evaluation and plots)."""
        e = self.lookup(workflow_type_id, tool)
        if e is None:
            raise KeyError(f"no latency model for tool {tool!r} in {workflow_type_id!r}")
        return stats.lognorm.cdf(np.asarray(t, dtype=float), e["sigma"], 0, np.exp(e["mu"]))

    def to_dict(self) -> dict[str, Any]:
        return {"params": self.get_params(), "workflow_types": self.tools_, "global": self.global_tools_}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ToolLatencyModel":
        est = cls(**d.get("params", {}))
        est.tools_ = d["workflow_types"]
        est.global_tools_ = d.get("global", {})
        return est
