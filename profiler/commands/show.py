"""`profiler show`: a readable summary of a profile."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from profiler.commands.common import JsonOption, ProfileOption, app
from profiler.commands.common import console, fail, print_json


def _fmt_s(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s"


def tool_gap_reasons(data: dict) -> dict[str, str]:
    """Why each workflow type of a profile has no tool-latency fit: {type: reason}, for the types
    absent from ``tool_latency`` (a Claude Code session of a few calls names each tool a few
    times: below the fit's ``min_samples``, the table was empty with no word why, issue 35)."""
    fitted = (data.get("tool_latency") or {}).get("workflow_types") or {}
    need = ((data.get("tool_latency") or {}).get("params") or {}).get("min_samples", 5)
    limits = data.get("limitations") or {}
    out = {}
    for wt in (data.get("workflow_types") or {}):
        if wt in fitted:
            continue
        counts: dict[str, int] = {}
        for agent in ((data.get("agents") or {}).get(wt) or {}).values():
            for tool, n in (agent.get("tools") or {}).items():
                counts[tool] = counts.get(tool, 0) + int(n)
        if limits.get("timing") == "order_only" or wt in (limits.get("order_only_types") or []):
            out[wt] = "the calls have no real times (order only): no tool latency to measure"
        elif not counts:
            out[wt] = "the responses name no tool calls"
        else:
            top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
            shown = ", ".join(f"{t} {n}" for t, n in top[:4]) + (f", +{len(top) - 4} more" if len(top) > 4 else "")
            out[wt] = (f"no tool has the {need} timed executions a fit needs "
                       f"({sum(counts.values())} tool calls over {len(counts)} tools: {shown})")
    return out


def _summary(console, prof, escape) -> None:
    """The short part: one row per workflow type (calls, agents, bands, tools), and why a type has
    no tool fit."""
    from rich import box
    from rich.table import Table

    from predictors.band_selection import band_warnings

    d = prof.data
    ol = d["output_length"]
    warn = band_warnings(ol)
    tl = d["tool_latency"]["workflow_types"]
    t = Table(title=f"Workflow types (bands at coverage {ol['coverage']:.3g}; --full: every band, "
                    "tool fit, regex)", title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    # hi p50: the median agent's band upper end; ⚠: bands with a warning; tools: fitted tools and
    # their longest keep-alive TTL (narrow columns: one table at 80 columns, type names ≤ 18)
    for col in ("workflow type", "workflows", "calls", "agents", "hi p50", "⚠", "tools, TTL"):
        t.add_column(col, justify="left" if col == "workflow type" else "right")
    for wt, info in (d.get("workflow_types") or {}).items():
        agents = ol["agents"].get(wt, {})
        his = sorted(b["hi"] for b in agents.values())
        tools = tl.get(wt, {})
        ttl = max((e["ttl_s"] for e in tools.values()), default=None)
        t.add_row(wt, f"{info.get('workflows', 0):,}", f"{info.get('calls', 0):,}", f"{len(agents):,}",
                  f"{his[len(his) // 2]:,}" if his else "-",
                  f"{sum((wt, a) in warn for a in agents)}",
                  f"{len(tools)} ({_fmt_s(ttl)})" if tools else "0")
    console.print(t)
    by_reason: dict[str, list[str]] = {}
    for wt, reason in tool_gap_reasons(d).items():
        by_reason.setdefault(reason, []).append(wt)
    for reason, types in by_reason.items():
        console.print(f"  no tool latency for {escape(', '.join(types))}: {escape(reason)}", highlight=False)


@app.command(no_args_is_help=True)
def show(
    profile: Annotated[Path, ProfileOption("Profile root (or one version folder).")],
    full: Annotated[bool, typer.Option("--full", help="After the summary, every agent's band and its selection, every tool fit and each workflow type's regex.")] = False,
    json_out: Annotated[bool, JsonOption("Print the whole profile.json instead.")] = False,
) -> None:
    """Print what a profile knows. First a summary: what it was fitted on, its limits and alarms,
    and one row per workflow type (workflows, calls, agents, the median band's upper end, bands
    with a warning, tools fitted and their longest keep-alive TTL, and why a type has none).
    `--full` adds the per-agent output-length bands (and which level serves them, chosen how),
    the per-tool latency fits and the synthesized workflow regexes.

    Example: `profiler show --profile profile/ --full`
    """
    from rich.table import Table

    from predictors.band_selection import band_warnings, selection_text

    from rich.markup import escape

    from store.data_limits import summary_lines
    from store.profile_artifact import ProfileError, load_profile

    try:
        prof = load_profile(profile)
    except ProfileError as exc:
        fail(str(exc))
    if json_out:
        print_json({"manifest": prof.manifest, "profile": prof.data})
        return
    m, d = prof.manifest, prof.data
    c = m.get("counts", {})
    console.print(f"[bold]profile {prof.version}[/]  created {m['created_at']}  at {prof.path}")
    console.print(f"  {c.get('calls', 0):,} calls, {c.get('workflows', 0):,} workflows, "
                  f"{c.get('tool_calls', 0):,} tool executions from {len(m.get('sources', []))} files; "
                  f"{c.get('quarantined', 0):,} records quarantined")
    for line in summary_lines(d.get("limitations") or {}):
        console.print(f"  [yellow]{escape(line)}[/]", highlight=False)
    from serving_hooks.service import drift_alarm_lines  # alarms a server raised on this version

    for line in drift_alarm_lines(profile, prof.version):
        console.print(f"  [red]{escape(line)}[/]", highlight=False)
    for wt, h in (d.get("human_wait") or {}).items():  # think time, kept out of the keep-alive fit
        console.print(f"  human waits {escape(wt)}: {h['waits']:,} ({h['share_of_gaps']:.0%} of gaps), "
                      f"p50 {h['p50_s']:.1f} s, p95 {h['p95_s']:.1f} s", highlight=False)
    _summary(console, prof, escape)
    if not full:
        return
    ol = d["output_length"]
    warn = band_warnings(ol)
    t = Table(title=f"Output-length bands (coverage {ol['coverage']:.3g})", title_justify="left")
    for col in ("workflow type", "agent", "calls", "mean", "CV", "lo", "hi", "served by", "chosen"):
        t.add_column(col, justify="left" if col in ("workflow type", "agent", "served by", "chosen") else "right")
    for wt, agents in ol["agents"].items():
        for agent, b in agents.items():
            level = "conditional (quantile tree)" if b.get("conditional") else b["level"]
            if b.get("method") == "lognormal" and not b.get("conditional"):
                level += " (lognormal)"
            chosen = (b.get("selection") or {}).get("chosen", "-")
            if (wt, agent) in warn:
                chosen += " [yellow]⚠[/]"
            t.add_row(wt, agent, f"{b['n']:,}", f"{b.get('mean', float('nan')):.0f}",
                      f"{b.get('cv', float('nan')):.2f}", str(b["lo"]), str(b["hi"]), level, chosen)
    g = ol["global"]
    t.add_row("(all)", "(global band)", f"{g['n']:,}", "", "", str(g["lo"]), str(g["hi"]), "",
              (g.get("selection") or {}).get("chosen", ""))
    console.print(t)
    console.print("[bold]Band selection[/] (held-out coverage/mean width per candidate, K-fold by "
                  "workflow; ✓ = reaches nominal):", highlight=False)
    for wt, agents in ol["agents"].items():
        for agent, b in agents.items():
            console.print(f"  {wt}/{agent}: {selection_text(b)}", highlight=False)
            if "certified_alpha" in b:
                console.print(f"    U(α) certified down to α = {b['certified_alpha']:.2g}; "
                              f"below it the ceiling {b['ceiling']:,} tokens", highlight=False)
            for note in warn.get((wt, agent), []):
                console.print(f"    [yellow]warning:[/] {note}", highlight=False)
    tl = d["tool_latency"]["workflow_types"]
    t = Table(title="Tool latency (lognormal MLE; TTL = served p95)", title_justify="left")
    for col in ("workflow type", "tool", "n", "mu", "sigma", "KS", "fit", "p50", "p95", "p99", "TTL"):
        t.add_column(col, justify="left" if col in ("workflow type", "tool", "fit") else "right")
    for wt, tools in tl.items():
        for tool, e in tools.items():
            t.add_row(wt, tool, f"{e['n']:,}", f"{e['mu']:.2f}", f"{e['sigma']:.2f}", f"{e['ks']:.3f}",
                      "[yellow]poor → empirical[/]" if e["poor_fit"] else "lognormal",
                      _fmt_s(e["p50_s"]), _fmt_s(e["p95_s"]), _fmt_s(e["p99_s"]), _fmt_s(e["ttl_s"]))
    console.print(t)
    for wt, reason in tool_gap_reasons(d).items():   # an empty row says nothing: say why
        console.print(f"  (no rows for {escape(wt)}: {escape(reason)})", highlight=False)
    for wt, section in d.get("workflows", {}).items():
        regex = section.get("regex")
        if regex:
            acc = section.get("train_acceptance")
            extra = f"  (accepts {acc:.1%} of training workflows)" if isinstance(acc, (int, float)) else ""
            console.print(f"[bold]{wt}[/] dominant paths: [cyan]{regex}[/]{extra}", highlight=False)
