"""Matplotlib figures of the report, each returned as a self-contained SVG data URI.

Every figure becomes ``<img src="data:image/svg+xml;base64,...">``: an SVG document of its own,
so the ids matplotlib generates inside one figure can never clash with another's, and nothing
is fetched from anywhere.
"""
from __future__ import annotations

import base64
import io
import math
from typing import Any, Callable

import numpy as np

from profiler.report.data import CDF_LEVELS, Histogram

BAND_COLOR, DATA_COLOR, FIT_COLOR, BAD_COLOR = "#38a169", "#4a5568", "#d53f8c", "#e53e3e"


def _pyplot():
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RuntimeError("the HTML report draws its charts with matplotlib: "
                           "pip install 'agent-workflow-profiler[report]'") from exc
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "figure.dpi": 100, "svg.hashsalt": "profiler-report"})
    return plt


def to_data_uri(fig: Any) -> str:
    """Render and close ``fig``; its SVG as a base64 data URI."""
    plt = _pyplot()
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def output_length_histogram(h: Histogram, band: dict[str, Any] | None) -> str:
    """Histogram of one agent's output lengths with its predicted band shaded."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.4))
    widths = np.diff(h.edges)
    ax.bar(h.edges[:-1], h.counts, width=widths, align="edge", color=DATA_COLOR, alpha=0.75,
           edgecolor="white", linewidth=0.3, label=f"{h.n:,} calls")
    if h.edges[-1] / max(h.edges[0], 1.0) > 20:
        ax.set_xscale("symlog", linthresh=1.0)
    if band is not None:
        lo, hi = band["lo"], band["hi"]
        ax.axvspan(lo, hi, color=BAND_COLOR, alpha=0.18, lw=0)
        ax.axvline(lo, color=BAND_COLOR, lw=1.2)
        ax.axvline(hi, color=BAND_COLOR, lw=1.2)
        level = "conditional, marginal shown" if band.get("conditional") else band.get("level", "")
        label = f"band [{lo:,}, {hi:,}] ({level})"
        if h.inside is not None and h.n:
            label += f"\n{h.inside / h.n:.1%} of stored calls inside"
        ax.plot([], [], color=BAND_COLOR, lw=6, alpha=0.4, label=label)
    ax.set_xlabel("output tokens")
    ax.set_ylabel("calls")
    ax.set_title(h.agent, fontsize=10, loc="left")
    ax.legend(fontsize=7, frameon=True, framealpha=0.85, edgecolor="none", loc="upper right")
    return to_data_uri(fig)


def tool_latency_cdf(tool: str, n: int, quantiles: np.ndarray, entry: dict[str, Any] | None,
                     cdf: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
    """Empirical latency CDF of one tool with the fitted lognormal CDF overlaid.

    ``cdf(t)`` is the fitted CDF (``ToolLatencyModel.cdf`` bound to the tool).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.4))
    x = np.maximum(quantiles, 1e-4)
    ax.step(x, CDF_LEVELS, where="post", color=DATA_COLOR, lw=1.6, label=f"observed ({n:,})")
    if entry is not None and cdf is not None:
        grid = np.geomspace(max(x.min(), 1e-4) / 1.5, x.max() * 1.5, 200)
        poor = entry.get("poor_fit")
        ax.plot(grid, cdf(grid), color=BAD_COLOR if poor else FIT_COLOR, lw=1.4, ls="--",
                label=f"lognormal μ={entry['mu']:.2f} σ={entry['sigma']:.2f}, KS={entry['ks']:.3f}"
                      + (" (poor fit)" if poor else ""))
        ax.axvline(entry["p95_s"], color=FIT_COLOR, lw=0.8, ls=":")
        ax.text(entry["p95_s"], 0.04, f" p95 {entry['p95_s']:.3g}s ({entry.get('source', '')})",
                fontsize=7, color=FIT_COLOR)
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("P(latency ≤ x)")
    ax.set_title(tool, fontsize=10, loc="left")
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return to_data_uri(fig)


def coverage_bars(title: str, labels: list[str], values: list[float], nominal: float,
                  annotations: list[str] | None = None) -> str:
    """Horizontal bars of coverage per item with the nominal level as a vertical line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 0.6 + 0.28 * max(len(labels), 1)))
    ypos = np.arange(len(labels))
    colors = [BAND_COLOR if v >= nominal - 0.02 else BAD_COLOR for v in values]
    ax.barh(ypos, values, color=colors, alpha=0.8)
    ax.axvline(nominal, color="#2d3748", lw=1, ls="--")
    ax.text(nominal, -0.9, f" nominal {nominal:g}", fontsize=7)
    ax.set_yticks(ypos, labels, fontsize=7)
    ax.invert_yaxis()
    left = min(0.5, math.floor(20 * (min(values, default=1.0) - 0.05)) / 20)
    ax.set_xlim(max(left, 0.0), 1.0)
    for y, v, note in zip(ypos, values, annotations or [""] * len(values)):
        ax.text(1.0, y, f" {v:.1%} {note}", va="center", ha="left", fontsize=7, color="#2d3748",
                clip_on=False)
    ax.set_title(title, fontsize=10, loc="left")
    return to_data_uri(fig)


def grouped_bars(title: str, labels: list[str], series: dict[str, list[float]], xlabel: str = "") -> str:
    """Horizontal grouped bars: one group per label, one bar per series (e.g. model vs baseline)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 0.7 + 0.32 * max(len(labels), 1) * max(len(series), 1)))
    k = max(len(series), 1)
    height = 0.8 / k
    ypos = np.arange(len(labels))
    palette = [FIT_COLOR, DATA_COLOR, BAND_COLOR, BAD_COLOR]
    for j, (name, values) in enumerate(series.items()):
        ys = ypos - 0.4 + height * (j + 0.5)
        ax.barh(ys, values, height=height * 0.92, color=palette[j % len(palette)], alpha=0.85, label=name)
        for y, v in zip(ys, values):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
    ax.set_yticks(ypos, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, frameon=False, loc="lower right")
    ax.set_title(title, fontsize=10, loc="left")
    return to_data_uri(fig)
