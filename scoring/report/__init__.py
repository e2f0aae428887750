"""``profiler report``: one self-contained HTML page per profile.

For each workflow type the page shows

* the synthesized **workflow graph** (:mod:`scoring.report.graph`): agents as nodes, transition
  probabilities on the edges, edges the pruned automaton dropped greyed, and the bounded regex;
* per agent, the **output-length histogram** of the stored calls with the predicted band;
* per tool, the **latency CDF** of the stored executions with the fitted lognormal overlaid;

and, given held-out logs, the **evaluation** of :func:`scoring.evaluation.evaluate` (band
coverage per agent, tool p95 coverage, and every key other parts add through
``EVAL_EXTENSIONS``). Data come from the profile (``profile.json``) and, for histograms and
CDFs, from the store (``<profile root>/store.duckdb`` unless ``db`` says otherwise) by grouped
queries (:mod:`scoring.report.data`). Charts are matplotlib SVGs inlined as data URIs; the
graph is inline SVG; nothing on the page loads from the network.
"""
from __future__ import annotations

import os
from html import escape
from pathlib import Path
from typing import Any, Callable, Sequence

from predictors.band_selection import band_warnings
from scoring.report import page
from scoring.report.graph import END, MAX_NODES, START, WorkflowGraph, collapse_rare, edge_rows, pool, render_svg
from scoring.report.roles import DEFAULT_RULES, GROUP_ABOVE, RoleMap, RoleRule, group_roles, role_paths

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
#: Workflow shapes listed under the regex.
PATH_SHAPES = 8
#: Calibration curves per workflow type (roles and the busiest agents).
MAX_CURVES = 8
#: Agents with fewer held-out calls are pooled into one bar of the evaluation chart.
EVAL_MIN_CALLS = 5


def _agent_calls(wt: str, data: dict, con) -> dict[str, int]:
    """Calls per agent of a type: from the store, else from the profile's bands."""
    if con is not None:
        rows = con.execute("SELECT agent_id, count(*) FROM store.calls WHERE workflow_type_id = ? "
                           "GROUP BY agent_id", [wt]).fetchall()
        if rows:
            return {a: int(n) for a, n in rows}
    bands = ((data.get("output_length") or {}).get("agents") or {}).get(wt, {})
    return {a: int(b.get("n", 0)) for a, b in bands.items()}


def _roles_block(roles: RoleMap, calls: dict[str, int]) -> str:
    """What the grouping did: the rules, and per role its agents and calls."""
    if not roles.active:
        return ""
    rules = "; ".join(f"<code>{escape(r.pattern)}</code> → {escape(r.role)}" for r in roles.rules)
    rows = []
    for role, members in roles.members.items():
        names = ", ".join(members)
        rows.append((role, len(members), sum(calls.get(m, 0) for m in members),
                     f"<details><summary>{escape(', '.join(members[:4]))}"
                     f"{' …' if len(members) > 4 else ''}</summary>{escape(names)}</details>"))
    alone = sum(1 for a, r in roles.role_of.items() if a == r)
    kept = f" and {_count(alone, 'agent')} no rule pools" if alone else ""
    return (f'<p class="note">{len(roles.role_of)} agents drawn as '
            f'{_count(len(roles.members), "role")}{kept}, each agent taking the role of the first name rule '
            f'it matches: {rules}. Change the rules with <code>profiler report --group \'REGEX=ROLE\'</code> '
            '(repeatable) or turn them off with <code>--no-group</code>; the profile itself stays per '
            'agent.</p>' + page.table(["role", "agents", "calls", "agents (most calls first)"], rows,
                                      numeric={1, 2}, raw={3}))


def _graph_section(wt: str, section: dict | None, seqs: list, total: int, roles: RoleMap,
                   notes: list[str], show_pruned: bool) -> str:
    pfa = (section or {}).get("pfa")
    graph = None
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
    shown = pool(graph, roles.symbol, roles.members) if roles.active else graph
    pooled = collapse_rare(shown)
    if pooled is not shown:
        other = next(k for k in pooled.merged if k not in shown.merged)
        notes.append(f"the {len(pooled.merged[other])} nodes beyond the {MAX_NODES} busiest are pooled "
                     f"into \"{other}\" (hover it for their names; every transition is in the table)")
    shown = pooled
    if not show_pruned and shown.pruned:
        lone = [n for n in shown.nodes if n not in (START, END) and not any(
            n in e and e not in shown.pruned and p >= MIN_EDGE_P for e, p in shown.edges.items())]
        if lone:
            notes.append(f"{', '.join(lone)}: every transition in or out was pruned from the automaton "
                         "(tick \"show pruned edges\" to draw them)")
    n_rare = sum(1 for p in shown.edges.values() if p < MIN_EDGE_P)
    n_pruned = len(shown.pruned)
    checked = " checked" if show_pruned else ""
    out = [f'<div class="legend note"><span><i class="swatch"></i>kept transition</span>'
           f'<span><i class="swatch pruned"></i>pruned from the automaton</span>'
           f'<span><i class="swatch back"></i>loop back</span>'
           f'<span>line width ∝ probability; hover for counts</span>'
           f'<label><input type="checkbox" class="toggle-pruned" data-target="{gid}-box"{checked}> '
           f'show pruned edges ({n_pruned})</label>'
           f'<label><input type="checkbox" class="toggle-rare" data-target="{gid}-box"> '
           f'show rare edges (p &lt; {MIN_EDGE_P:g}: {n_rare})</label></div>',
           f'<div class="graph-box" id="{gid}-box">{render_svg(shown, gid, MIN_EDGE_P, show_pruned)}</div>']
    rows = edge_rows(graph)
    out.append(f"<details><summary class=\"note\">all {len(rows)} transitions between agents "
               f"({len(graph.pruned)} pruned)</summary>"
               + page.table(["from", "to", "p", "count", "pruned"], rows, numeric={2, 3},
                            row_classes=["pruned" if r[4] else "" for r in rows]) + "</details>")
    return "".join(out)


def _regex_block(section: dict | None, seqs: list, roles: RoleMap) -> str:
    """The bounded regex with how much it covers, and the most common workflow shapes (over
    roles, runs folded) with their cumulative coverage: what the regex leaves out."""
    if not section:
        return '<p class="note">No synthesized workflow section (the <code>workflows</code> builder did not run).</p>'
    states = section.get("states") or {}
    n = section.get("workflows")
    cov = section.get("train_regex_acceptance", section.get("train_acceptance"))
    cover = (f'<p class="coverage"><b>path coverage: the regex accepts {cov:.1%} of the '
             f'{n:,} training workflows</b>' if cov is not None and n else '<p class="coverage">')
    if cov is not None and n and section.get("train_acceptance") is not None:
        cover += f' · the pruned automaton {section["train_acceptance"]:.1%}'
    cover += "</p>"
    facts = [f"{states.get('learned', '?')} learned → {states.get('pruned', '?')} pruned states",
             f"prune threshold {(section.get('params') or {}).get('prune', '?')}"]
    shapes = ""
    if seqs:
        rows, total = role_paths(seqs, roles, PATH_SHAPES)
        what = "roles" if roles.active else "agents"
        shapes = (f'<p class="note">The {len(rows)} most common workflow shapes over {what} (a run of '
                  f'one {what[:-1]} folded to <code>+</code>), of {total:,} workflows, with their cumulative '
                  'coverage:</p>' + page.table(["shape", "workflows", "cumulative coverage"],
                                                [(s, k, f"{c:.1%}") for s, k, c in rows], numeric={1, 2}))
    return (f'<code class="regex">{escape(section.get("regex", ""))}</code>{cover}'
            f'<p class="note">{" · ".join(escape(f) for f in facts)}</p>{shapes}')


def _load_block(wt: str, con) -> str:
    """Context growth, cached-token share, and arrivals/concurrency over time."""
    from scoring.report import figures
    from scoring.report.data import context_growth, load_over_time

    if con is None:
        return '<p class="note">Context and load plots need the store.</p>'
    figs, notes = [], []
    cg = context_growth(con, wt)
    if cg is None:
        notes.append("no input token counts in this log: no context-growth plot")
    else:
        figs.append(page.figure(figures.context_growth(cg), "context growth per workflow", wide=True))
        if cg.cached_share is not None:
            figs.append(page.figure(figures.cached_share(cg), "cached-token share", wide=True))
        else:
            notes.append("no call reports cached_tokens: no cached-token share")
    ld = load_over_time(con, wt)
    if ld is None:
        notes.append("this log has no real times (order only): no arrivals or concurrency over time")
    else:
        figs.append(page.figure(figures.load_over_time(ld), "arrivals and concurrency over time", wide=True))
    note = f'<p class="note">{escape("; ".join(notes))}.</p>' if notes else ""
    return f'<div class="grid">{"".join(figs)}</div>{note}'


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
                       stored_n: dict[str, int] | None, roles: RoleMap | None = None) -> str:
    """Per agent: the served band, how it was chosen, its held-out (cross-validated) coverage and
    width, the share of stored calls inside it, and a badge when it is wider than its parent's.
    Agents with fewer than ``SMALL_N`` calls are folded into a second table (a team of experts
    can have a hundred of those)."""
    from scoring.report.data import SMALL_N

    grouped = roles is not None and roles.active

    def rows_of(items):
        rows, classes = [], []
        for agent, b in items:
            sel = b.get("selection") or {}
            chosen = sel.get("chosen", "–")
            cand = (sel.get("candidates") or {}).get(chosen) or {}
            served = "conditional" if b.get("conditional") else b.get("level", "")
            stored = (f"{inside[agent] / stored_n[agent]:.1%}" if inside is not None and stored_n
                      and stored_n.get(agent) and agent in inside else None)
            row = (agent, b["n"], f"[{b['lo']:,}, {b['hi']:,}]", served, chosen,
                   cand.get("coverage"), cand.get("mean_width"), stored,
                   _badge(warned[agent]) if agent in warned else "")
            rows.append(row if not grouped else (row[0], roles.role_of.get(agent, agent), *row[1:]))
            classes.append("warn" if agent in warned else "")
        head = ["agent", "calls", "band", "served by", "chosen", "held-out coverage",
                "held-out width", "stored calls inside", ""]
        if grouped:
            return page.table([head[0], "role", *head[1:]], rows, numeric={2, 6, 7, 8},
                              row_classes=classes, raw={9})
        return page.table(head, rows, numeric={1, 5, 6, 7}, row_classes=classes, raw={8})

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


def _strips(small: dict[str, list[int]], bands: dict, warned: dict) -> list[str]:
    """Strip plots of small-sample agents, :data:`STRIP_ROWS` rows each, with their bands."""
    from scoring.report import figures
    from scoring.report.data import SMALL_N

    names = list(small)
    out = []
    for k in range(0, len(names), STRIP_ROWS):
        chunk = {a: small[a] for a in names[k:k + STRIP_ROWS]}
        part = f" ({k // STRIP_ROWS + 1} of {-(-len(names) // STRIP_ROWS)})" if len(names) > STRIP_ROWS else ""
        out.append(page.figure(figures.strip_plot(
            f"agents with fewer than {SMALL_N} calls: every call{part}", chunk, "output tokens",
            {a: (bands[a]["lo"], bands[a]["hi"]) for a in chunk if a in bands}, "served band",
            flagged=set(warned)), f"output lengths of small-sample agents{part}", wide=True))
    return out


def _calibration_curves(wt: str, con, hists: dict, roles: RoleMap, nominal: float | None) -> str:
    """One chart: observed vs nominal coverage of each role (pooled) and of the busiest agents
    with at least ``SMALL_N`` calls, up to :data:`MAX_CURVES` lines."""
    from scoring.report import figures
    from scoring.report.data import CALIBRATION_FOLDS, CALIBRATION_LEVELS, SMALL_N, calibration_curves

    groups: dict[str, list[str]] = {f"{r} (pooled)": m for r, m in roles.members.items()}
    for h in sorted(hists.values(), key=lambda h: (-h.n, h.agent)):
        if len(groups) >= MAX_CURVES:
            break
        if h.n >= SMALL_N:
            groups[h.agent] = [h.agent]
    curves = calibration_curves(con, wt, groups)
    if not curves:
        return ""
    return (page.figure(figures.calibration_curves(
        curves, CALIBRATION_LEVELS, nominal,
        f"band calibration: nominal vs observed coverage ({CALIBRATION_FOLDS}-fold by workflow)"),
        "coverage calibration curve per agent", wide=True)
        + f'<p class="note">Each line: the order-statistic band (the profile\'s marginal rule) fit at '
        f'nominal {", ".join(f"{x:g}" for x in CALIBRATION_LEVELS)} on the other folds\' workflows and '
        'scored on the held-out fold\'s; below the dashed diagonal the band covers less than it promises. '
        'Roles pool their agents\' calls into one band (what an agent with too few calls falls back to).</p>')


def _output_length_block(wt: str, data: dict, con, roles: RoleMap) -> str:
    from scoring.report import figures
    from scoring.report.data import SMALL_N, band_coverage, output_histograms, small_sample_outputs

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
        return head + _calibration_table(wt, bands, warned, None, None, roles)
    hists = output_histograms(con, wt)
    inside = band_coverage(con, wt, {a: (b["lo"], b["hi"]) for a, b in bands.items()})
    table = _calibration_table(wt, bands, warned, inside, {a: h.n for a, h in hists.items()}, roles)
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
    strips = _strips(small, bands, warned)
    small_html = ""
    if small and roles.active:
        pooled: dict[str, list[int]] = {}
        for a, vals in small.items():
            pooled.setdefault(roles.role_of.get(a, a), []).extend(vals)
        pooled = dict(sorted(pooled.items(), key=lambda kv: (-len(kv[1]), kv[0])))
        role_strip = page.figure(figures.strip_plot(
            f"agents with fewer than {SMALL_N} calls, pooled by role: every call", pooled, "output tokens"),
            "output lengths of small-sample agents by role", wide=True)
        small_html = (f'<p class="note">{_count(len(small), "agent")} with fewer than {SMALL_N} calls, drawn '
                      f'by role ({len(pooled)} rows, each dot a call); one row per agent with its served band '
                      f'folds out below.</p>{role_strip}<details><summary class="note">every small-sample '
                      f'agent on its own row ({len(strips)} plots)</summary>{"".join(strips)}</details>')
    elif small:
        small_html = (f'<p class="note">{_count(len(small), "agent")} with fewer than {SMALL_N} calls: each call is '
                      f'a dot (no histogram of so few points); ⚠ marks a band wider than its parent\'s.</p>'
                      + "".join(strips))
    curves_html = _calibration_curves(wt, con, hists, roles, nominal)
    return f'{head}{table}{curves_html}<div class="grid">{"".join(figs)}</div>{tail}{small_html}'


def _tool_block(wt: str, data: dict, con) -> str:
    from predictors.tool_latency import ToolLatencyModel
    from scoring.report import figures
    from scoring.report.data import SMALL_N, small_sample_latencies, tool_latency_quantiles

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
    from scoring.report import figures
    from scoring.report.data import sample_timelines

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
    from scoring.evaluation import evaluate
    from scoring.report import figures

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
                 eval_logs: Sequence[str | Path] | None = None,
                 group_rules: Sequence[RoleRule] | None = DEFAULT_RULES, group_above: int = GROUP_ABOVE,
                 show_pruned: bool = False,
                 on_step: Callable[[str, int, int], None] | None = None) -> Path:
    """Write the HTML report of the profile at ``profile_path`` to ``out``; returns ``out``.

    ``on_step(label, done, total)`` is called before each workflow type's section (and the
    evaluation), for a progress bar.

    ``group_rules``: name rules that pool the agents of a team of more than ``group_above`` agents
    into roles (:mod:`scoring.report.roles`; ``None`` or empty: no grouping). ``show_pruned``: draw the
    transitions the pruned automaton dropped from the start (the page's checkbox still toggles)."""
    from store.profile_artifact import load_profile, store_path
    from scoring.report.data import StoreUnavailable, open_store, store_counts, symbol_sequences

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
    steps = len(wts) + bool(eval_logs)
    try:
        for i, wt in enumerate(wts):
            if on_step is not None:
                on_step(f"workflow type {wt}", i, steps)
            section = workflows.get(wt)
            info = (data.get("workflow_types") or {}).get(wt, {})
            notes: list[str] = []
            calls = _agent_calls(wt, data, con)
            roles = group_roles(calls, tuple(group_rules or ()), group_above)
            seqs, total = symbol_sequences(con, wt, MAX_GRAPH_WORKFLOWS) if con is not None else ([], 0)
            graph_html = _graph_section(wt, section, seqs, total, roles, notes, show_pruned)
            note_html = f'<p class="note">{escape("; ".join(notes))}</p>' if notes else ""
            roles_html = f"<h3>Roles</h3>{_roles_block(roles, calls)}" if roles.active else ""
            body.append(
                f'<section class="wt" id="{page.slug(wt)}"><h2>{escape(wt)}</h2>'
                f'<p class="note">{info.get("workflows", 0):,} workflows, {info.get("calls", 0):,} calls '
                f'in the profile</p>{roles_html}'
                f"<h3>Workflow graph</h3>{graph_html}{note_html}"
                f"<h3>Dominant paths (regex)</h3>{_regex_block(section, seqs, roles)}"
                f"<h3>Context and load</h3>{_load_block(wt, con)}"
                f"<h3>Output length per agent</h3>{_output_length_block(wt, data, con, roles)}"
                f"<h3>Tool latency</h3>{_tool_block(wt, data, con)}"
                f"<h3>Timelines</h3>{_timeline_block(wt, con)}</section>")
        if eval_logs:
            if on_step is not None:
                on_step("evaluation", len(wts), steps)
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
