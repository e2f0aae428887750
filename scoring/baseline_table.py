""""Ours vs baselines": the lift table of ``profiler eval`` and ``bench/bench_real.py``.

A prediction is only worth serving if it beats what a user would run without us, on the same
held-out calls. This module reads one eval result (``profiler eval --json``) or one
cross-validation result (``profiler eval --cv K --json``: the weighted fold means, with the
standard deviation across folds as the spread) and lays the comparable numbers side by side:

=============================  ==========================================================
metric                         methods
=============================  ==========================================================
output-length coverage, width  ours, ``global`` (one band for all), ``per_agent_empirical``,
                               ``nat_trie`` (NAT's prediction trie: ``[0, p95]``)
next-agent top-1, log-loss     ours, ``markov1`` (first order), ``markov_vo`` (variable order),
                               ``markov_wb`` (variable order, Witten–Bell smoothed; log-loss)
top-1 after the response       ours (once the call's response and tool calls were observed)
next-agent scored share        ours (1.0 = every call got a prediction)
remaining-calls MAE            ours, ``position_median``, ``nat_trie``
keep-alive idle-gap coverage   ours, ``idle_gap_p95``, ``tool_p95``, ``nat_trie``
keep-alive mean TTL            the same (the KV time each held; coverage alone rewards a long TTL)
keep-alive KV-s/covered gap    the same and ``oracle`` (Σ min(TTL, gap) / gaps covered; the oracle
                               holds each gap under the cap exactly: the least cost of coverage)
=============================  ==========================================================

Keys a result lacks are shown as ``n/a`` (the table never fails on a missing key). A baseline
value may be a number or an object holding the metric (``{"top1_accuracy": …, "log_loss": …}``);
each cell lists the paths it tries, first found wins.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from rich.table import Table


@dataclass(frozen=True)
class Row:
    """One line of the table: a metric, a method, where its value may live, how to print it."""

    metric: str
    method: str
    paths: tuple[str, ...]
    fmt: str = "{:.3f}"
    better: str | None = None  # "max" or "min": the best method of a metric is shown in bold
    nominal: str | None = None  # path of the metric's nominal level, shown in the metric label


def _alts(base: str, *names: str) -> tuple[str, ...]:
    """``base.name`` for each name, then ``base`` itself (a baseline given as a bare number)."""
    return tuple(f"{base}.{n}" for n in names) + (base,)


OL, NA, RC, KA, RW = "output_len", "next_agent", "remaining_calls", "keep_alive", "remaining_work"
#: The rows, in order. Paths are dotted keys of one eval result.
ROWS: tuple[Row, ...] = (
    Row("output-length coverage", "ours", (f"{OL}.coverage",), nominal=f"{OL}.nominal"),
    Row("output-length coverage", "global",
        (f"{OL}.baselines.global.coverage", f"{OL}.global_band_coverage"), nominal=f"{OL}.nominal"),
    Row("output-length coverage", "per_agent_empirical",
        (f"{OL}.baselines.per_agent_empirical.coverage",), nominal=f"{OL}.nominal"),
    Row("output-length coverage", "nat_trie", (f"{OL}.baselines.nat_trie.coverage",), nominal=f"{OL}.nominal"),
    Row("output-length mean width", "ours", (f"{OL}.mean_width",), "{:,.0f}"),
    Row("output-length mean width", "global",
        (f"{OL}.baselines.global.mean_width", f"{OL}.global_band_width"), "{:,.0f}"),
    Row("output-length mean width", "per_agent_empirical",
        (f"{OL}.baselines.per_agent_empirical.mean_width",), "{:,.0f}"),
    Row("output-length mean width", "nat_trie", (f"{OL}.baselines.nat_trie.mean_width",), "{:,.0f}"),
    Row("next-agent top-1", "ours", (f"{NA}.top1_accuracy",), better="max"),
    Row("next-agent top-1", "markov1",
        _alts(f"{NA}.baselines.markov1", "top1_accuracy", "top1"), better="max"),
    Row("next-agent top-1", "markov_vo",
        _alts(f"{NA}.baselines.markov_vo", "top1_accuracy", "top1"), better="max"),
    Row("next-agent top-1 after the response", "ours",
        (f"{NA}.top1_after_response", f"{NA}.top1_accuracy")),  # older results: same as top-1
    Row("next-agent log-loss", "ours", (f"{NA}.log_loss",), better="min"),
    Row("next-agent log-loss", "markov1", (f"{NA}.baselines_log_loss.markov1", f"{NA}.baselines.markov1.log_loss"), better="min"),
    Row("next-agent log-loss", "markov_vo", (f"{NA}.baselines_log_loss.markov_vo", f"{NA}.baselines.markov_vo.log_loss"), better="min"),
    Row("next-agent log-loss", "markov_wb", (f"{NA}.baselines_log_loss.markov_wb",), better="min"),
    Row("next-agent scored share", "ours", (f"{NA}.scored_share",)),
    Row("remaining-calls MAE", "ours", (f"{RC}.mae",), "{:.2f}", better="min"),
    Row("remaining-calls MAE", "position_median",
        _alts(f"{RC}.baselines.position_median", "mae"), "{:.2f}", better="min"),
    Row("remaining-calls MAE", "nat_trie", (f"{RC}.baselines.nat_trie.mae",), "{:.2f}", better="min"),
    *(Row("remaining-tokens C-index", m, (f"{RW}.c_index",) if m == "ours" else (f"{RW}.baselines.{m}.c_index",),
          better="max") for m in ("ours", "position_median", "mrl", "nat_trie", "age")),
    *(Row("remaining-tokens MAE", m, (f"{RW}.mae_tokens",) if m == "ours" else (f"{RW}.baselines.{m}.mae_tokens",),
          "{:,.0f}", better="min") for m in ("ours", "position_median", "mrl", "nat_trie")),
    Row("keep-alive idle-gap coverage", "ours", (f"{KA}.idle_gap_coverage",), nominal=f"{KA}.nominal"),
    Row("keep-alive idle-gap coverage", "idle_gap_p95",
        _alts(f"{KA}.baselines.idle_gap_p95", "idle_gap_coverage", "coverage"), nominal=f"{KA}.nominal"),
    Row("keep-alive idle-gap coverage", "tool_p95",
        _alts(f"{KA}.baselines.tool_p95", "idle_gap_coverage", "coverage"), nominal=f"{KA}.nominal"),
    Row("keep-alive idle-gap coverage", "nat_trie", (f"{KA}.baselines.nat_trie",), nominal=f"{KA}.nominal"),
    *(Row("keep-alive mean TTL (s)", m, (f"{KA}.mean_ttl_s",) if m == "ours" else (f"{KA}.baseline_mean_ttl_s.{m}",),
          "{:,.1f}") for m in ("ours", "idle_gap_p95", "tool_p95", "nat_trie")),
    *(Row("keep-alive KV-s per covered gap", m, (f"{KA}.kv_s_per_covered_gap.{m}",), "{:,.1f}")
      for m in ("ours", "idle_gap_p95", "tool_p95", "nat_trie", "oracle")),
)
NA_TEXT = "n/a"


def lookup(result: Mapping[str, Any], path: str) -> float | None:
    """The finite number at dotted ``path`` of a nested result, else None."""
    node: Any = result
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
        return None
    return float(node)


def _is_cv(result: Mapping[str, Any]) -> bool:
    return "folds" in result and isinstance(result.get("mean"), Mapping)


def cell(result: Mapping[str, Any], row: Row) -> tuple[float | None, float | None, str | None]:
    """``(value, spread, path)`` of ``row`` in ``result``; spread is the across-fold standard
    deviation for a cross-validation result (None for a single split); all None if missing."""
    values = result["mean"] if _is_cv(result) else result
    for path in row.paths:
        v = lookup(values, path)
        if v is not None:
            spread = None
            if _is_cv(result):
                spread = (result.get("summary") or {}).get(path, {}).get("std")
            return v, spread, path
    return None, None, None


def baseline_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The table as plain data: one dict per :data:`ROWS` entry with ``metric``, ``method``,
    ``value``, ``spread`` (None when missing or a single split) and ``key`` (the path found)."""
    out = []
    for row in ROWS:
        value, spread, path = cell(result, row)
        out.append({"metric": row.metric, "method": row.method, "value": value, "spread": spread,
                    "key": path})
    return out


def _label(row: Row, results: Sequence[Mapping[str, Any]]) -> str:
    if row.nominal is None:
        return row.metric
    noms = {round(v, 4) for r in results
            if (v := lookup(r["mean"] if _is_cv(r) else r, row.nominal)) is not None}
    return f"{row.metric} (nominal {noms.pop():.2f})" if len(noms) == 1 else row.metric


def baseline_table(results: Mapping[str, Mapping[str, Any]], title: str | None = None) -> Table:
    """A rich table: rows = (metric, method), one column per named result; ``mean ± std`` for
    cross-validation results, ``n/a`` for missing keys, the best method of a metric in bold."""
    t = Table(title=title, title_justify="left")
    t.add_column("metric")
    t.add_column("method")
    for name in results:
        t.add_column(name, justify="right")
    res = list(results.values())
    cells = {row: [cell(r, row) for r in res] for row in ROWS}
    best: dict[tuple[str, int], float] = {}
    for row in ROWS:
        if row.better:
            for j, (v, _, _) in enumerate(cells[row]):
                if v is not None:
                    key = (row.metric, j)
                    pick = max if row.better == "max" else min
                    best[key] = pick(best.get(key, v), v)
    previous = None
    for row in ROWS:
        label = _label(row, res) if row.metric != previous else ""
        if row.metric != previous and previous is not None:
            t.add_section()
        previous = row.metric
        texts = []
        for j, (v, spread, _) in enumerate(cells[row]):
            if v is None:
                texts.append(f"[dim]{NA_TEXT}[/]")
                continue
            text = row.fmt.format(v) + (f" ± {row.fmt.format(spread)}" if spread is not None else "")
            if row.better and best.get((row.metric, j)) == v:
                text = f"[bold]{text}[/]"
            texts.append(text)
        t.add_row(label, row.method, *texts)
    return t
