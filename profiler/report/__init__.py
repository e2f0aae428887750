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
from profiler.report.graph import WorkflowGraph, collapse_rare, edge_rows, render_svg

#: Sampled workflows per type for the graph's edge probabilities.
MAX_GRAPH_WORKFLOWS = 20_000
#: Charts per workflow type and kind (agents, tools) beyond which the rest are listed only.
MAX_CHARTS = 36
#: Edges rarer than this are hidden until the page's "show rare edges" box is ticked.
MIN_EDGE_P = 0.01
#: Rows per small-sample strip plot (more agents: more plots).
STRIP_ROWS = 40
#: Workflows drawn as a timeline per workflow type.
TIMELINES = 3
#: Agents with fewer held-out calls are pooled into one bar of the evaluation chart.
EVAL_MIN_CALLS = 5


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
    shown = collapse_rare(graph)
    if shown is not graph:
        (other, rest), = shown.merged.items()
        notes.append(f"the {len(rest)} agents beyond the {len(shown.nodes) - 3} busiest are pooled "
                     f"into \"{other}\" (hover it for their names; every transition is in the table)")
    n_rare = sum(1 for p in shown.edges.values() if p < MIN_EDGE_P)
    out = [f'<div class="legend note"><span><i class="swatch"></i>kept transition</span>'
           f'<span><i class="swatch pruned"></i>pruned from the automaton</span>'
           f'<span><i class="swatch back"></i>loop back</span>'
           f'<span>line width ∝ probability; hover for counts</span>'
           f'<label><input type="checkbox" class="toggle-pruned" data-target="{gid}-box" checked> '
           f'show pruned edges</label>'
           f'<label><input type="checkbox" class="toggle-rare" data-target="{gid}-box"> '
           f'show rare edges (p &lt; {MIN_EDGE_P:g}: {n_rare})</label></div>',
           f'<div class="graph-box" id="{gid}-box">{render_svg(shown, gid, MIN_EDGE_P)}</div>']
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


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _badge(notes: list[str]) -> str:
    """A visible warning badge; the full reasons in its tooltip."""
    return (f'<span class="badge warn" title="{escape("; ".join(notes))}">⚠ '
            f'{escape(_badge_text(notes))}</span>')


def _badge_text(notes: list[str]) -> str:
    if any("workflow type's band" in n for n in notes):
        return "band wider than its workflow type's"
    if any("global band" in n for n in notes):
        return "band wider than the global band"
    return "fallback band"


def _calibration_table(wt: str, bands: dict, warned: dict, inside: dict[str, int] | None,
                       stored_n: dict[str, int] | None) -> str:
    """Per agent: the served band, how it was chosen, its held-out (cross-validated) coverage and
    width, the share of stored calls inside it, and a badge when it is wider than its parent's.
    Agents with fewer than ``SMALL_N`` calls are folded into a second table (a team of experts
    can have a hundred of those)."""
    from profiler.report.data import SMALL_N

    def rows_of(items):
        rows, classes = [], []
        for agent, b in items:
            sel = b.get("selection") or {}
            chosen = sel.get("chosen", "–")
            cand = (sel.get("candidates") or {}).get(chosen) or {}
            served = "conditional" if b.get("conditional") else b.get("level", "")
            stored = (f"{inside[agent] / stored_n[agent]:.1%}" if inside is not None and stored_n
                      and stored_n.get(agent) and agent in inside else None)
            rows.append((agent, b["n"], f"[{b['lo']:,}, {b['hi']:,}]", served, chosen,
                         cand.get("coverage"), cand.get("mean_width"), stored,
                         _badge(warned[agent]) if agent in warned else ""))
            classes.append("warn" if agent in warned else "")
        return page.table(["agent", "calls", "band", "served by", "chosen", "held-out coverage",
                           "held-out width", "stored calls inside", ""], rows, numeric={1, 5, 6, 7},
                          row_classes=classes, raw={8})

    ordered = sorted(bands.items(), key=lambda kv: (-kv[1]["n"], kv[0]))
    big = [(a, b) for a, b in ordered if b["n"] >= SMALL_N]
    small = [(a, b) for a, b in ordered if b["n"] < SMALL_N]
    out = rows_of(big) if big else ""
    if small:
        n_warn = sum(1 for a, _ in small if a in warned)
        body = rows_of(small)
        if big:
            body = (f'<details><summary class="note">{_count(len(small), "agent")} with fewer than '
                    f'{SMALL_N} calls ({n_warn} with ⚠)</summary>{body}</details>')
        out += body
    return out


def _output_length_block(wt: str, data: dict, con) -> str:
    from profiler.report import figures
    from profiler.report.data import SMALL_N, band_coverage, output_histograms, small_sample_outputs

    ol = data.get("output_length") or {}
    bands = ol.get("agents", {}).get(wt, {})
    warned = {a: notes for (t, a), notes in band_warnings(ol).items() if t == wt}
    nominal = ol.get("coverage")
    wider = sum(1 for notes in warned.values() if any("wider than" in n for n in notes))
    head = (f'<p class="note">Calibration: the band each agent is served (nominal coverage '
            f'{nominal if nominal is not None else "?"}), the candidate chosen by cross-validation by '
            f'workflow, and its held-out coverage and width. ⚠: {wider} of {len(bands)} agents have a '
            f'band wider than their workflow type\'s or the global band; {len(warned) - wider} more '
            f'are served a fallback band (too few calls to validate; hover the badge).</p>')
    if con is None:
        return head + _calibration_table(wt, bands, warned, None, None)
    hists = output_histograms(con, wt)
    inside = band_coverage(con, wt, {a: (b["lo"], b["hi"]) for a, b in bands.items()})
    table = _calibration_table(wt, bands, warned, inside, {a: h.n for a, h in hists.items()})
    figs = []
    big = sorted((h for h in hists.values() if h.n >= SMALL_N), key=lambda h: (-h.n, h.agent))
    for h in big[:MAX_CHARTS]:
        h.inside = inside.get(h.agent)
        figs.append(page.figure(figures.output_length_histogram(h, bands.get(h.agent)),
                                f"output-length histogram of {h.agent}",
                                caption=_badge(warned[h.agent]) if h.agent in warned else ""))
    more = len(big) - MAX_CHARTS
    tail = f'<p class="note">{more} more agents not drawn (see the table).</p>' if more > 0 else ""
    small = small_sample_outputs(con, wt, SMALL_N)
    strips = []
    names = list(small)
    for k in range(0, len(names), STRIP_ROWS):
        chunk = {a: small[a] for a in names[k:k + STRIP_ROWS]}
        part = f" ({k // STRIP_ROWS + 1} of {-(-len(names) // STRIP_ROWS)})" if len(names) > STRIP_ROWS else ""
        strips.append(page.figure(figures.strip_plot(
            f"agents with fewer than {SMALL_N} calls: every call{part}", chunk, "output tokens",
            {a: (bands[a]["lo"], bands[a]["hi"]) for a in chunk if a in bands}, "served band",
            flagged=set(warned)), f"output lengths of small-sample agents{part}", wide=True))
    small_html = (f'<p class="note">{_count(len(small), "agent")} with fewer than {SMALL_N} calls: each call is '
                  f'a dot (no histogram of so few points); ⚠ marks a band wider than its parent\'s.</p>'
                  + "".join(strips)) if small else ""
    return f'{head}{table}<div class="grid">{"".join(figs)}</div>{tail}{small_html}'


def _tool_block(wt: str, data: dict, con) -> str:
    from predictors.tool_latency import ToolLatencyModel
    from profiler.report import figures
    from profiler.report.data import SMALL_N, small_sample_latencies, tool_latency_quantiles

    tl = data.get("tool_latency") or {}
    model = ToolLatencyModel.from_dict(tl) if tl else None
    fitted = (tl.get("workflow_types") or {}).get(wt, {})
    if con is None:
        rows = [(t, e["n"], e["mu"], e["sigma"], e["ks"], e["p95_s"], e["source"]) for t, e in fitted.items()]
        return page.table(["tool", "n", "μ", "σ", "KS", "p95 s", "served from"], rows, numeric={1, 2, 3, 4, 5})
    quantiles = {t: v for t, v in tool_latency_quantiles(con, wt).items() if v[0] >= SMALL_N}
    small = small_sample_latencies(con, wt, SMALL_N)
    if not quantiles and not small:
        return '<p class="note">No timed tool executions for this type.</p>'
    figs = []
    for tool, (n, q) in list(quantiles.items())[:MAX_CHARTS]:
        entry = model.lookup(wt, tool) if model else None
        cdf = (lambda t, _tool=tool: model.cdf(wt, _tool, t)) if entry else None
        figs.append(page.figure(figures.tool_latency_cdf(tool, n, q, entry, cdf), f"latency CDF of {tool}"))
    more = len(quantiles) - MAX_CHARTS
    tail = f'<p class="note">{more} more tools not drawn.</p>' if more > 0 else ""
    if small:
        marks = {}
        for tool in small:
            entry = model.lookup(wt, tool) if model else None
            if entry:
                marks[tool] = entry["p95_s"]
        tail += (f'<p class="note">{_count(len(small), "tool")} ran fewer than {SMALL_N} times: each execution is '
                 'a dot (a CDF of so few points would draw straight lines between them).</p>'
                 + page.figure(figures.strip_plot(f"tools with fewer than {SMALL_N} executions",
                                                  small, "latency (s)", marks=marks,
                                                  mark_label="served p95"),
                               "latencies of small-sample tools", wide=True))
    return f'<div class="grid">{"".join(figs)}</div>{tail}'


def _timeline_block(wt: str, con) -> str:
    from profiler.report import figures
    from profiler.report.data import sample_timelines

    if con is None:
        return '<p class="note">Timelines need the store.</p>'
    tls = sample_timelines(con, wt, TIMELINES)
    if not tls:
        return '<p class="note">No workflows in the store for this type.</p>'
    note = ("" if all(t.real_times for t in tls) else
            '<p class="note">This log has no real times (order only): each call takes one slot; '
            'durations, tool gaps and idle gaps cannot be shown.</p>')
    figs = [page.figure(figures.timeline(t, f"workflow {t.workflow_id}"),
                        f"timeline of workflow {t.workflow_id}", wide=True) for t in tls]
    return (f'<p class="note">{len(tls)} workflows taken at the 20th, middle and 95th percentile of '
            f'call count: calls per agent, tool executions, idle gaps (grey).</p>{note}'
            f'<div class="grid">{"".join(figs)}</div>')


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


def _pooled_coverage(per_agent: dict[str, dict]) -> tuple[list[str], list[float], list[str]]:
    """Bars of the per-agent coverage chart: agents with at least :data:`EVAL_MIN_CALLS` held-out
    calls each (most calls first), the rest pooled (coverage weighted by calls)."""
    def calls(v: dict) -> int:
        return int(v.get("calls") or v.get("n") or 0)

    big = sorted(((k, v) for k, v in per_agent.items() if calls(v) >= EVAL_MIN_CALLS),
                 key=lambda kv: (-calls(kv[1]), kv[0]))
    rest = [v for v in per_agent.values() if calls(v) < EVAL_MIN_CALLS]
    labels = [k for k, _ in big]
    values = [float(v["coverage"]) for _, v in big]
    notes = [f"(n {calls(v):,}, w {v['mean_width']:.0f})" for _, v in big]
    n_rest = sum(calls(v) for v in rest)
    if rest and n_rest:
        labels.append(f"{len(rest)} agents with < {EVAL_MIN_CALLS} calls")
        values.append(sum(v["coverage"] * calls(v) for v in rest) / n_rest)
        notes.append(f"(n {n_rest:,})")
    elif rest:  # no call counts in this result: one bar each
        labels += [k for k, v in per_agent.items() if calls(v) < EVAL_MIN_CALLS]
        values += [float(v["coverage"]) for v in rest]
        notes += [f"(w {v['mean_width']:.0f})" for v in rest]
    return labels, values, notes


def _eval_section(profile, eval_logs: Sequence[Path]) -> str:
    from profiler.evaluation import evaluate
    from profiler.report import figures

    scores, report = evaluate(profile, list(eval_logs))
    out = [f'<section class="eval" id="evaluation"><h2>Evaluation on held-out logs</h2>'
           f'<p class="note">{escape(", ".join(map(str, eval_logs)))}: {escape(report.summary())}</p>']
    ol = scores.get("output_len") or {}
    per_agent = ol.get("per_agent") or {}
    if per_agent:
        labels, values, notes = _pooled_coverage(per_agent)
        out.append("<h3>Output-length bands</h3><p class=\"note\">"
                   f"coverage {ol.get('coverage', float('nan')):.1%} (nominal {ol.get('nominal', 0):g}), "
                   f"mean band width {page.fmt(ol.get('mean_width'))} tokens vs "
                   f"{page.fmt(ol.get('global_band_width'))} for one global band; agents with fewer "
                   f"than {EVAL_MIN_CALLS} held-out calls pooled into one bar</p>")
        out.append(page.figure(figures.coverage_bars(
            "held-out calls inside their agent's band", labels, values,
            float(ol.get("nominal", 0.99)), notes), "band coverage per agent", wide=True))
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
        def na(w: str) -> dict:
            return by_type[w].get("next_agent") or {}

        acc = {"next-agent top-1 accuracy": [na(w).get("top1_accuracy") for w in wts],
               "baseline: first-order Markov": [(na(w).get("baselines") or {}).get("markov1") for w in wts],
               "regex acceptance": [(by_type[w].get("path") or {}).get("regex_acceptance") for w in wts]}
        mae = {"profile": [(by_type[w].get("remaining_calls") or {}).get("mae") for w in wts],
               "position-only baseline": [(by_type[w].get("remaining_calls") or {}).get("baseline_mae") for w in wts]}
        out.append("<h3>Workflow paths</h3><div class=\"grid\">")
        for title, series, xlabel, alt in (
                ("held-out paths", acc, "share", "path accuracy per workflow type"),
                ("remaining calls: mean absolute error", mae, "calls", "remaining-calls error per workflow type")):
            series = {k: v for k, v in series.items() if all(x is not None for x in v)}
            if series:
                out.append(page.figure(figures.grouped_bars(title, wts, series, xlabel), alt, wide=True))
        out.append("</div>")
    core = {"output_len", "tool_latency", "profile_version"}
    extra = {k: v for k, v in scores.items() if k not in core}
    rows = [(k, v) for k, v in _scalars(extra) if not k.endswith(".regex")]
    if rows:
        out.append(f'<details><summary class="note">all {len(rows)} figures of <code>profiler eval</code>'
                   '</summary>' + page.table(["metric", "value"], rows, numeric={1}) + "</details>")
    out.append("</section>")
    return "".join(out)


def build_report(profile_path: str | Path, out: str | Path, *, db: str | Path | None = None,
                 eval_logs: Sequence[str | Path] | None = None) -> Path:
    """Write the HTML report of the profile at ``profile_path`` to ``out``; returns ``out``."""
    from store.profile_artifact import load_profile, store_path
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
                f"<h3>Tool latency</h3>{_tool_block(wt, data, con)}"
                f"<h3>Timelines</h3>{_timeline_block(wt, con)}</section>")
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
