"""``profiler report``: one self-contained HTML page per profile.

For each workflow type the page shows

* the synthesized **workflow graph** (:mod:`profiler.report.graph`): agents as nodes, transition
  probabilities on the edges, edges the pruned automaton dropped greyed, and the bounded regex;
* per agent, the **output-length histogram** of the stored calls with the predicted band;
* per tool, the **latency CDF** of the stored executions with the fitted lognormal overlaid;

and, given held-out logs, the **evaluation** of :func:`profiler.evaluation.evaluate` (band
coverage per agent, tool p95 coverage, and every key other parts add through
``EVAL_EXTENSIONS``). Data come from the profile (``profile.json``) and, for histograms and
CDFs, from the store (``<profile root>/store.duckdb`` unless ``db`` says otherwise) by grouped
queries (:mod:`profiler.report.data`). Charts are matplotlib SVGs inlined as data URIs; the
graph is inline SVG; nothing on the page loads from the network.
"""
from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any, Sequence

from predictors.band_selection import band_warnings
from profiler.report import page
from profiler.report.graph import WorkflowGraph, edge_rows, render_svg

#: Sampled workflows per type for the graph's edge probabilities.
MAX_GRAPH_WORKFLOWS = 20_000
#: Charts per workflow type and kind (agents, tools) beyond which the rest are listed only.
MAX_CHARTS = 36
#: Edges rarer than this are not drawn (they stay in the edge table).
MIN_EDGE_P = 0.01


def _graph_section(wt: str, section: dict | None, con, notes: list[str]) -> str:
    pfa = (section or {}).get("pfa")
    graph = None
    if con is not None:
        from profiler.report.data import symbol_sequences

        seqs, total = symbol_sequences(con, wt, MAX_GRAPH_WORKFLOWS)
        if seqs:
            graph = WorkflowGraph.from_symbol_sequences(wt, seqs, pfa)
            if total > len(seqs):
                notes.append(f"edge probabilities from a sample of {len(seqs):,} of {total:,} workflows")
    if graph is None and pfa is not None:
        graph = WorkflowGraph.from_pfa(wt, pfa)
        notes.append("edge probabilities from the automaton's counts (no store data for this type); "
                     "pruned edges cannot be shown without the data")
    if graph is None:
        return '<p class="note">No workflow data and no synthesized automaton for this type.</p>'
    gid = page.slug(wt) + "-graph"
    out = [f'<div class="legend note"><span><i class="swatch"></i>kept transition</span>'
           f'<span><i class="swatch pruned"></i>pruned from the automaton</span>'
           f'<span>line width ∝ probability; hover for counts</span>'
           f'<label><input type="checkbox" class="toggle-pruned" data-target="{gid}-box" checked> '
           f'show pruned edges</label></div>',
           f'<div class="graph-box" id="{gid}-box">{render_svg(graph, gid, MIN_EDGE_P)}</div>']
    rows = edge_rows(graph)
    out.append(f"<details><summary class=\"note\">all {len(rows)} transitions "
               f"({len(graph.pruned)} pruned)</summary>"
               + page.table(["from", "to", "p", "count", "pruned"], rows, numeric={2, 3},
                            row_classes=["pruned" if r[4] else "" for r in rows]) + "</details>")
    return "".join(out)


def _regex_block(section: dict | None) -> str:
    if not section:
        return '<p class="note">No synthesized workflow section (the <code>workflows</code> builder did not run).</p>'
    states = section.get("states") or {}
    facts = [f"training acceptance {section.get('train_acceptance', float('nan')):.1%}",
             f"{states.get('learned', '?')} learned → {states.get('pruned', '?')} pruned states",
             f"prune threshold {(section.get('params') or {}).get('prune', '?')}"]
    return (f'<code class="regex">{escape(section.get("regex", ""))}</code>'
            f'<p class="note">{" · ".join(escape(f) for f in facts)}</p>')


def _output_length_block(wt: str, data: dict, con) -> str:
    from profiler.report import figures
    from profiler.report.data import band_coverage, output_histograms

    bands = (data.get("output_length") or {}).get("agents", {}).get(wt, {})
    warned = {a: notes for (t, a), notes in band_warnings(data.get("output_length") or {}).items() if t == wt}
    badge = "".join(f'<p class="note">⚠ {escape(a)}: {escape("; ".join(n))}</p>' for a, n in warned.items())
    if con is None:
        rows = [(a, b["n"], b["lo"], b["hi"], "conditional" if b.get("conditional") else b["level"])
                for a, b in bands.items()]
        return page.table(["agent", "calls", "lo", "hi", "served by"], rows, numeric={1, 2, 3}) + badge
    hists = output_histograms(con, wt)
    inside = band_coverage(con, wt, {a: (b["lo"], b["hi"]) for a, b in bands.items()})
    figs = []
    for agent, h in list(hists.items())[:MAX_CHARTS]:
        h.inside = inside.get(agent)
        figs.append(page.figure(figures.output_length_histogram(h, bands.get(agent)),
                                f"output-length histogram of {agent}"))
    more = len(hists) - MAX_CHARTS
    tail = f'<p class="note">{more} more agents not drawn.</p>' if more > 0 else ""
    return f'<div class="grid">{"".join(figs)}</div>{tail}{badge}'


def _tool_block(wt: str, data: dict, con) -> str:
    from predictors.tool_latency import ToolLatencyModel
    from profiler.report import figures
    from profiler.report.data import tool_latency_quantiles

    tl = data.get("tool_latency") or {}
    model = ToolLatencyModel.from_dict(tl) if tl else None
    fitted = (tl.get("workflow_types") or {}).get(wt, {})
    if con is None:
        rows = [(t, e["n"], e["mu"], e["sigma"], e["ks"], e["p95_s"], e["source"]) for t, e in fitted.items()]
        return page.table(["tool", "n", "μ", "σ", "KS", "p95 s", "served from"], rows, numeric={1, 2, 3, 4, 5})
    quantiles = tool_latency_quantiles(con, wt)
    if not quantiles:
        return '<p class="note">No timed tool executions for this type.</p>'
    figs = []
    for tool, (n, q) in list(quantiles.items())[:MAX_CHARTS]:
        entry = model.lookup(wt, tool) if model else None
        cdf = (lambda t, _tool=tool: model.cdf(wt, _tool, t)) if entry else None
        figs.append(page.figure(figures.tool_latency_cdf(tool, n, q, entry, cdf), f"latency CDF of {tool}"))
    more = len(quantiles) - MAX_CHARTS
    tail = f'<p class="note">{more} more tools not drawn.</p>' if more > 0 else ""
    return f'<div class="grid">{"".join(figs)}</div>{tail}'


def _scalars(d: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """Flatten the scalar values of a (nested) dict to (dotted key, value) rows."""
    rows: list[tuple[str, Any]] = []
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            rows.extend(_scalars(v, key + "."))
        elif isinstance(v, (int, float, str, bool)) or v is None:
            rows.append((key, v))
    return rows


def _eval_section(profile, eval_logs: Sequence[Path]) -> str:
    from profiler.evaluation import evaluate
    from profiler.report import figures

    scores, report = evaluate(profile, list(eval_logs))
    out = [f'<section class="eval" id="evaluation"><h2>Evaluation on held-out logs</h2>'
           f'<p class="note">{escape(", ".join(map(str, eval_logs)))}: {escape(report.summary())}</p>']
    ol = scores.get("output_len") or {}
    per_agent = ol.get("per_agent") or {}
    if per_agent:
        labels = list(per_agent)
        out.append("<h3>Output-length bands</h3><p class=\"note\">"
                   f"coverage {ol.get('coverage', float('nan')):.1%} (nominal {ol.get('nominal', 0):g}), "
                   f"mean band width {page.fmt(ol.get('mean_width'))} tokens vs "
                   f"{page.fmt(ol.get('global_band_width'))} for one global band</p>")
        out.append(page.figure(figures.coverage_bars(
            "held-out calls inside their agent's band", labels, [per_agent[k]["coverage"] for k in labels],
            float(ol.get("nominal", 0.99)),
            [f"(w {per_agent[k]['mean_width']:.0f})" for k in labels]), "band coverage per agent", wide=True))
    tl = scores.get("tool_latency") or {}
    known = {k: v for k, v in (tl.get("per_tool") or {}).items() if v.get("known")}
    if known:
        labels = list(known)
        out.append("<h3>Tool latency</h3><p class=\"note\">"
                   f"{tl.get('p95_coverage', float('nan')):.1%} of held-out executions within the served p95; "
                   f"largest KS distance {page.fmt(tl.get('ks_max'))}</p>")
        out.append(page.figure(figures.coverage_bars(
            "held-out executions within the served p95", labels, [known[k]["p95_coverage"] for k in labels],
            0.95, [f"(KS {known[k]['ks']:.2f})" for k in labels]), "tool p95 coverage", wide=True))
    by_type = {wt: v for wt, v in (scores.get("workflows_by_type") or {}).items() if v.get("known")}
    if by_type:
        wts = list(by_type)
        acc = {"next-agent top-1 accuracy": [(by_type[w].get("next_agent") or {}).get("top1_accuracy") for w in wts],
               "regex acceptance": [(by_type[w].get("path") or {}).get("regex_acceptance") for w in wts]}
        mae = {"profile": [(by_type[w].get("remaining_calls") or {}).get("mae") for w in wts],
               "position-only baseline": [(by_type[w].get("remaining_calls") or {}).get("baseline_mae") for w in wts]}
        out.append("<h3>Workflow paths</h3><div class=\"grid\">")
        for title, series, xlabel, alt in (
                ("held-out paths", acc, "share", "path accuracy per workflow type"),
                ("remaining calls: mean absolute error", mae, "calls", "remaining-calls error per workflow type")):
            series = {k: v for k, v in series.items() if all(x is not None for x in v)}
            if series:
                out.append(page.figure(figures.grouped_bars(title, wts, series, xlabel), alt))
        out.append("</div>")
    core = {"output_len", "tool_latency", "profile_version"}
    extra = {k: v for k, v in scores.items() if k not in core}
    rows = [(k, v) for k, v in _scalars(extra) if not k.endswith(".regex")]
    if rows:
        out.append("<h3>All figures</h3>" + page.table(["metric", "value"], rows, numeric={1}))
    out.append("</section>")
    return "".join(out)


def build_report(profile_path: str | Path, out: str | Path, *, db: str | Path | None = None,
                 eval_logs: Sequence[str | Path] | None = None) -> Path:
    """Write the HTML report of the profile at ``profile_path`` to ``out``; returns ``out``."""
    from profiler.profile_artifact import load_profile, store_path
    from profiler.report.data import StoreUnavailable, open_store, store_counts

    profile = load_profile(profile_path)
    data, manifest = profile.data, profile.manifest
    store = store_path(profile.root, db)
    con, store_note = None, ""
    try:
        con = open_store(store)
        sc = store_counts(con, "store")
        store_note = f"store {store}: {sc['calls']:,} calls, {sc['workflows']:,} workflows"
    except StoreUnavailable as exc:
        store_note = f"histograms and CDFs need the store: {exc}"
    counts = manifest.get("counts", {})
    workflows = data.get("workflows") or {}
    wts = sorted(set(data.get("workflow_types") or {}) | set(workflows))
    body = []
    try:
        for wt in wts:
            section = workflows.get(wt)
            info = (data.get("workflow_types") or {}).get(wt, {})
            notes: list[str] = []
            graph_html = _graph_section(wt, section, con, notes)
            note_html = f'<p class="note">{escape("; ".join(notes))}</p>' if notes else ""
            body.append(
                f'<section class="wt" id="{page.slug(wt)}"><h2>{escape(wt)}</h2>'
                f'<p class="note">{info.get("workflows", 0):,} workflows, {info.get("calls", 0):,} calls '
                f'in the profile</p>'
                f"<h3>Workflow graph</h3>{graph_html}{note_html}"
                f"<h3>Dominant paths (regex)</h3>{_regex_block(section)}"
                f"<h3>Output length per agent</h3>{_output_length_block(wt, data, con)}"
                f"<h3>Tool latency</h3>{_tool_block(wt, data, con)}</section>")
        if eval_logs:
            body.append(_eval_section(profile, [Path(p) for p in eval_logs]))
    finally:
        if con is not None:
            con.close()
    nav = "".join(f'<a href="#{page.slug(wt)}">{escape(wt)}</a>' for wt in wts)
    if eval_logs:
        nav += '<a href="#evaluation">evaluation</a>'
    opts = manifest.get("options") or {}
    meta = (f"version {escape(profile.version)} · created {escape(str(manifest.get('created_at', '')))} · "
            f"{counts.get('calls', 0):,} calls, {counts.get('workflows', 0):,} workflows from "
            f"{len(manifest.get('sources', []))} files · coverage target {opts.get('coverage', '?')}, "
            f"prune {opts.get('prune', '?')}<br>{escape(store_note)}")
    html = page.document(f"Workflow profile {profile.version}", meta, nav, "".join(body))
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, out)
    return out
