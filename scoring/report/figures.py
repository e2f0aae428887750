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
from matplotlib.ticker import MaxNLocator

from scoring.report.data import CDF_LEVELS, Histogram
from scoring.report.layout import wrap_label

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
    """Histogram of one agent's output lengths with its predicted band shaded; the band and the
    share of stored calls inside it are written in the title, never over the bars."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.5))
    widths = np.diff(h.edges)
    ax.bar(h.edges[:-1], h.counts, width=widths, align="edge", color=DATA_COLOR, alpha=0.75,
           edgecolor="white", linewidth=0.3)
    if h.edges[-1] / max(h.edges[0], 1.0) > 20:
        ax.set_xscale("symlog", linthresh=1.0)
    sub = f"{h.n:,} calls"
    if band is not None:
        lo, hi = band["lo"], band["hi"]
        ax.axvspan(lo, hi, color=BAND_COLOR, alpha=0.18, lw=0)
        ax.axvline(lo, color=BAND_COLOR, lw=1.2)
        ax.axvline(hi, color=BAND_COLOR, lw=1.2)
        level = "conditional, marginal shown" if band.get("conditional") else band.get("level", "")
        sub += f" · band [{lo:,}, {hi:,}] ({level})"
        if h.inside is not None and h.n:
            sub += f"\n{h.inside / h.n:.1%} of stored calls inside"
    ax.set_xlabel("output tokens")
    ax.set_ylabel("calls")
    ax.set_title(h.agent, fontsize=10, loc="left", pad=27 if "\n" in sub else 16)
    ax.text(0, 1.035, sub, transform=ax.transAxes, fontsize=7, color="#2d3748", va="bottom")
    return to_data_uri(fig)


def _wrap(label: str, width: int = 26) -> str:
    return "\n".join(wrap_label(label, width))


def strip_plot(title: str, values: dict[str, list[float]], xlabel: str,
               bands: dict[str, tuple[float, float]] | None = None, band_label: str = "band",
               marks: dict[str, float] | None = None, mark_label: str = "", log: bool = True,
               flagged: set[str] | None = None) -> str:
    """One row per item, one dot per observation: for samples too small for a histogram or a
    CDF (every point is shown, nothing is binned or interpolated). ``bands`` draws each row's
    interval behind its dots, ``marks`` a tick per row (e.g. a fitted p95); ``flagged`` rows get
    a ⚠ (their band is wider than their parent's). Row labels are wrapped, never cut; the figure
    grows with the number of rows."""
    plt = _pyplot()
    names = list(values)
    labels = [_wrap(n) + (" ⚠" if flagged and n in flagged else "") for n in names]
    lines = [lab.count("\n") + 1 for lab in labels]
    heights = [0.16 + 0.13 * k for k in lines]
    ypos = np.cumsum([0.0, *heights[:-1]]) + np.array(heights) / 2
    fig, ax = plt.subplots(figsize=(6.4, 0.9 + sum(heights)))
    rng = np.random.default_rng(0)
    for y, name in zip(ypos, names):
        v = np.asarray(values[name], dtype=float)
        if bands and name in bands:
            lo, hi = bands[name]
            ax.plot([max(lo, 0.5) if log else lo, hi], [y, y], color=BAND_COLOR, lw=7, alpha=0.3,
                    solid_capstyle="butt")
        if marks and name in marks:
            ax.plot([marks[name]], [y], marker="|", ms=12, mew=2, color=FIT_COLOR)
        jitter = rng.uniform(-0.05, 0.05, len(v)) if len(v) > 1 else np.zeros(1)
        ax.plot(np.maximum(v, 0.5) if log else v, y + jitter, "o", ms=4, color=DATA_COLOR, alpha=0.8,
                markeredgecolor="white", markeredgewidth=0.4)
        ax.text(1.005, y, f" n={len(v)}", transform=ax.get_yaxis_transform(), va="center",
                fontsize=7, color="#4a5568")
    if log:
        ax.set_xscale("log")
    ax.set_yticks(ypos, labels, fontsize=7.5)
    ax.set_ylim(sum(heights), 0)
    ax.set_xlabel(xlabel)
    handles = [plt.Line2D([], [], ls="", marker="o", ms=4, color=DATA_COLOR, label="one observation")]
    if bands:
        handles.append(plt.Line2D([], [], color=BAND_COLOR, lw=7, alpha=0.3, label=band_label))
    if marks:
        handles.append(plt.Line2D([], [], ls="", marker="|", ms=10, mew=2, color=FIT_COLOR, label=mark_label))
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0),
              ncol=len(handles))
    ax.set_title(title, fontsize=10, loc="left", pad=18)
    ax.grid(axis="x", color="#edf2f7", lw=0.6)
    return to_data_uri(fig)


def tool_latency_cdf(tool: str, n: int, quantiles: np.ndarray, entry: dict[str, Any] | None,
                     cdf: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
    """Empirical latency CDF (a step function of the observed values) of one tool with the
    fitted lognormal CDF overlaid; the fit's numbers go in the legend below the axes.

    ``cdf(t)`` is the fitted CDF (``ToolLatencyModel.cdf`` bound to the tool).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(4.2, 2.6))
    x = np.maximum(quantiles, 1e-4)
    ax.step(x, CDF_LEVELS, where="post", color=DATA_COLOR, lw=1.6, label=f"observed ({n:,})")
    if entry is not None and cdf is not None:
        grid = np.geomspace(max(x.min(), 1e-4) / 1.5, x.max() * 1.5, 200)
        poor = entry.get("poor_fit")
        ax.plot(grid, cdf(grid), color=BAD_COLOR if poor else FIT_COLOR, lw=1.4, ls="--",
                label=f"lognormal μ={entry['mu']:.2f} σ={entry['sigma']:.2f}, KS={entry['ks']:.3f}"
                      + (" (poor fit)" if poor else ""))
        ax.axvline(entry["p95_s"], color=FIT_COLOR, lw=0.8, ls=":",
                   label=f"served p95 {entry['p95_s']:.3g} s ({entry.get('source', '')})")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("latency (s)")
    ax.set_ylabel("P(latency ≤ x)")
    ax.set_title(tool, fontsize=10, loc="left")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(0, -0.3))
    return to_data_uri(fig)


def timeline(tl: Any, title: str) -> str:
    """Gantt chart of one workflow (:class:`scoring.report.data.Timeline`): a lane per agent with
    a bar per call, a lane per tool with its executions, and the idle gaps (nothing running)
    shaded across all lanes. Order-only logs draw one slot per call and say so."""
    plt = _pyplot()
    agents = list(dict.fromkeys(a for a, _, _ in tl.calls))
    tools = list(dict.fromkeys(t for t, _, _ in tl.tools))
    lanes = agents + [f"tool: {t}" for t in tools]
    lane = {a: i for i, a in enumerate(agents)}
    lane.update({t: len(agents) + i for i, t in enumerate(tools)})
    labels = [_wrap(x, 24) for x in lanes]
    fig, ax = plt.subplots(figsize=(6.8, 1.0 + 0.1 * sum(lab.count("\n") + 1 for lab in labels)
                                    + 0.22 * len(lanes)))
    palette = plt.get_cmap("tab10")
    end = max([e for _, _, e in tl.calls] + [e for _, _, e in tl.tools] + [1e-9])
    min_w = end / 400
    for a, s0, e0 in tl.calls:
        ax.broken_barh([(s0, max(e0 - s0, min_w))], (lane[a] - 0.36, 0.72),
                       facecolors=palette(lane[a] % 10), edgecolor="white", linewidth=0.3)
    for t, s0, e0 in tl.tools:
        ax.broken_barh([(s0, max(e0 - s0, min_w))], (lane[t] - 0.36, 0.72), facecolors="#dd6b20",
                       edgecolor="white", linewidth=0.3)
    busy = sorted([(s0, e0) for _, s0, e0 in tl.calls] + [(s0, e0) for _, s0, e0 in tl.tools])
    gaps, reach, idle = [], busy[0][1] if busy else 0.0, 0.0
    for s0, e0 in busy[1:]:
        if s0 > reach:
            gaps.append((reach, s0 - reach))
            idle += s0 - reach
        reach = max(reach, e0)
    if tl.real_times and gaps:
        ax.broken_barh(gaps, (-0.5, len(lanes)), facecolors="#e2e8f0", alpha=0.6, zorder=0)
    ax.set_yticks(range(len(lanes)), labels, fontsize=7.5)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(0, end * 1.01)
    n_tool = len(tl.tools)
    if tl.real_times:
        busy_calls = sum(e0 - s0 for _, s0, e0 in tl.calls)
        ax.set_xlabel("seconds since the workflow's first call")
        sub = (f"{len(tl.calls)} calls ({busy_calls:,.1f} s), {n_tool} tool executions, "
               f"idle gaps {idle:,.1f} s (grey) of {end:,.1f} s")
    else:
        ax.set_xlabel("call position (order only: this log has no real times)")
        sub = f"{len(tl.calls)} calls in order; no real times in this log, so no durations or gaps"
    ax.set_title(title, fontsize=10, loc="left", pad=16)
    ax.text(0, 1.01, sub, transform=ax.transAxes, fontsize=7, color="#2d3748", va="bottom")
    ax.grid(axis="x", color="#edf2f7", lw=0.6)
    return to_data_uri(fig)


def coverage_bars(title: str, labels: list[str], values: list[float], nominal: float,
                  annotations: list[str] | None = None) -> str:
    """Horizontal bars of coverage per item with the nominal level as a dashed line; labels are
    wrapped (never cut) and the figure grows with the number of items, so nothing overlaps."""
    plt = _pyplot()
    wrapped = [_wrap(lab) for lab in labels]
    heights = [0.1 + 0.14 * (w.count("\n") + 1) for w in wrapped]
    ypos = np.cumsum([0.0, *heights[:-1]]) + np.array(heights) / 2
    fig, ax = plt.subplots(figsize=(6.8, 0.9 + sum(heights)))
    colors = [BAND_COLOR if v >= nominal - 0.02 else BAD_COLOR for v in values]
    ax.barh(ypos, values, height=[0.8 * h for h in heights], color=colors, alpha=0.8)
    ax.axvline(nominal, color="#2d3748", lw=1, ls="--", label=f"nominal {nominal:g}")
    ax.set_yticks(ypos, wrapped, fontsize=7.5)
    ax.set_ylim(sum(heights), 0)
    left = min(0.5, math.floor(20 * (min(values, default=1.0) - 0.05)) / 20)
    ax.set_xlim(max(left, 0.0), 1.0)
    for y, v, note in zip(ypos, values, annotations or [""] * len(values)):
        ax.text(1.0, y, f" {v:.1%} {note}", va="center", ha="left", fontsize=7, color="#2d3748",
                clip_on=False)
    ax.legend(fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0))
    ax.set_title(title, fontsize=10, loc="left", pad=16)
    return to_data_uri(fig)


def grouped_bars(title: str, labels: list[str], series: dict[str, list[float]], xlabel: str = "") -> str:
    """Horizontal grouped bars: one group per label, one bar per series (e.g. model vs baseline);
    labels wrapped, legend above the axes (never over the bars)."""
    plt = _pyplot()
    k = max(len(series), 1)
    fig, ax = plt.subplots(figsize=(6.4, 1.0 + 0.26 * max(len(labels), 1) * k))
    height = 0.8 / k
    ypos = np.arange(len(labels))
    palette = [FIT_COLOR, DATA_COLOR, BAND_COLOR, BAD_COLOR]
    top = max([v for vs in series.values() for v in vs] or [1.0])
    for j, (name, values) in enumerate(series.items()):
        ys = ypos - 0.4 + height * (j + 0.5)
        ax.barh(ys, values, height=height * 0.92, color=palette[j % len(palette)], alpha=0.85, label=name)
        for y, v in zip(ys, values):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)
    ax.set_xlim(0, top * 1.15)
    ax.set_yticks(ypos, [_wrap(lab) for lab in labels], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.legend(fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=min(k, 3))
    ax.set_title(title, fontsize=10, loc="left", pad=18 + 10 * ((k - 1) // 3))
    return to_data_uri(fig)


def context_growth(cg: Any) -> str:
    """Input tokens by call index (:class:`scoring.report.data.ContextGrowth`): a thin grey line
    per sampled workflow, the median across workflows and its 10–90 % band."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 2.8))
    for idx, tok in cg.lines:
        ax.plot(idx, tok, color=DATA_COLOR, lw=0.6, alpha=0.25)
    ax.fill_between(cg.index, cg.q10, cg.q90, color=FIT_COLOR, alpha=0.15, lw=0, label="10–90 % of workflows")
    ax.plot(cg.index, cg.q50, color=FIT_COLOR, lw=2, label="median")
    ax.plot([], [], color=DATA_COLOR, lw=0.6, alpha=0.5, label=f"one workflow ({len(cg.lines)} shown)")
    ax.set_xlabel("call index in the workflow")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("input tokens")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=3)
    ax.set_title("context growth: input tokens by call index", fontsize=10, loc="left", pad=18)
    ax.grid(color="#edf2f7", lw=0.6)
    return to_data_uri(fig)


def cached_share(cg: Any) -> str:
    """Share of input tokens served from the prefix cache (Σ cached / Σ input) by call index."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 2.4))
    ax.plot(cg.index, cg.cached_share, color=BAND_COLOR, lw=1.8, marker="o", ms=3)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("call index in the workflow")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel("cached / input tokens")
    total = f"{cg.cached_total_share:.1%}" if cg.cached_total_share is not None else "–"
    ax.set_title("cached-token share by call index", fontsize=10, loc="left", pad=16)
    ax.text(0, 1.01, f"{total} of input tokens cached overall · {cg.cached_calls:,} of {cg.calls:,} calls "
            "report cached_tokens", transform=ax.transAxes, fontsize=7, color="#2d3748", va="bottom")
    ax.grid(color="#edf2f7", lw=0.6)
    return to_data_uri(fig)


def load_over_time(ld: Any) -> str:
    """Workflow arrivals per bin (bars) and, on the same time axis, calls in flight and open
    workflows (:class:`scoring.report.data.Load`)."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.8, 3.6), sharex=True,
                                      gridspec_kw={"height_ratios": [1, 1.6]})
    top.bar(ld.t[:-1], ld.arrivals, width=ld.bin_s, align="edge", color=DATA_COLOR, alpha=0.75)
    top.set_ylabel("arrivals", fontsize=8)
    top.set_title(f"workflow arrivals per {ld.bin_s:,.3g} s and concurrency", fontsize=10, loc="left")
    fig.subplots_adjust(hspace=0.35)
    bottom.step(ld.t, ld.calls, where="post", color=FIT_COLOR, lw=1.4, label="calls in flight")
    bottom.step(ld.t, ld.workflows, where="post", color=BAND_COLOR, lw=1.4, label="open workflows")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("seconds since the first call")
    bottom.set_ylabel("concurrent", fontsize=8)
    bottom.legend(fontsize=7, frameon=False, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=2)
    for ax in (top, bottom):
        ax.grid(color="#edf2f7", lw=0.6)
    return to_data_uri(fig)


def calibration_curves(curves: dict[str, tuple[np.ndarray, int]], levels: tuple[float, ...],
                       nominal: float | None, title: str) -> str:
    """Observed vs nominal band coverage, one line per agent or role, the diagonal (perfect
    calibration) dashed and the profile's nominal level dotted; below the diagonal = the band
    covers less than it promises."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    lv = np.asarray(levels)
    ax.plot([lv[0], 1], [lv[0], 1], color="#2d3748", lw=1, ls="--", label="perfectly calibrated")
    palette = plt.get_cmap("tab10")
    for k, (name, (obs, n)) in enumerate(curves.items()):
        ax.plot(lv, obs, marker="o", ms=3, lw=1.4, color=palette(k % 10), label=f"{_wrap(name, 30)} (n {n:,})")
    if nominal is not None:
        ax.axvline(nominal, color="#718096", lw=0.8, ls=":")
    lo = min([lv[0]] + [float(np.min(o)) for o, _ in curves.values()])
    ax.set_xlim(lv[0] - 0.02, 1.0)
    ax.set_ylim(max(0.0, lo - 0.05), 1.01)
    ax.set_xlabel("nominal coverage")
    ax.set_ylabel("observed coverage (held-out)")
    ax.set_title(title, fontsize=10, loc="left")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(color="#edf2f7", lw=0.6)
    return to_data_uri(fig)
