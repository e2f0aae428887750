"""The ``workflows`` profile section and its ``profiler eval`` extension (CONTRACTS §3).

* :func:`build_workflows_section` — registered in ``fitting.profile_fit.SECTION_BUILDERS`` as
  ``"workflows"``: reads the ``calls`` table, fits one section per workflow type
  (:func:`synth.fit.fit_sequences`).
* :func:`evaluate_workflows` — registered in ``scoring.evaluation.EVAL_EXTENSIONS``: replays the
  held-out ``calls`` against the profile and returns the ``next_agent``, ``path``,
  ``remaining_calls`` and (when the held-out logs carry text) ``prompt_composition`` blocks.

Fit options read from ``options``: ``prune`` (default 0.05), ``alergia_alpha`` (0.2),
``loop_quantiles`` ((0.01, 0.99)), ``prompt_workflows`` (how many workflows per type are
mined for prompt templates, default 100), ``synth_max_workflows`` (at most this many
workflows per type train the automaton, a seeded random sample — ``seed`` — drawn in SQL;
default :data:`DEFAULT_MAX_WORKFLOWS`; 0 = all).

**Why 20,000 workflows are enough.** Every fitted quantity is a frequency: transition and
stop probabilities (ALERGIA's Hoeffding tests, pruning at 5 %), fan-out width histograms and
the 1st/99th percentiles of loop round counts. With n workflows a probability's sampling
error is ``sqrt(p(1-p)/n)`` — at most 0.35 percentage points at n = 20,000 — and a 1 % tail
quantile still rests on ~200 workflows. Measured on 1M generated coding-assistant calls
(76,994 workflows; ``profiler generate --workload coding-assistant --calls 1000000``), fitted
on all workflows, and on samples of 20,000 / 5,000 / 2,000 (seeds 0 and 1): the same regex
and state counts every time, train acceptance 1.000; start-state expected remaining calls
12.988 (all) vs 12.982 / 13.020 (20k); P(another explorer after the first) 0.750 vs
0.745 / 0.755; on 3,000 held-out workflows next-agent top-1 0.8244 vs 0.8249 / 0.8252 and
remaining-calls MAE 1.403 vs 1.405 / 1.407. The automaton is settled well below 20,000;
the cap only keeps the fit's cost flat as logs grow (the window functions that form fan-out
groups scale with calls, the paths handed to Python with distinct workflows): on that store
this section takes 0.6 s CPU with the cap, 1.6 s CPU without.
"""
from __future__ import annotations

from typing import Any

import duckdb

from store.duckdb_store import sql_string
from store.split import call_group_sql
from synth.evaluation import PathScores, score_sequences
from synth.fit import DEFAULT_ALPHA, DEFAULT_PRUNE, fit_sequences
from synth.prompts import evaluate_templates, load_text_workflows
from synth.regex_synth import LOOP_QUANTILES
from synth.remaining import RemainingWork
from synth.next_select import ROLLING_BUCKETS
from synth.sequence_select import FORWARD_SHARE, is_position_median, select_remaining
from synth.sequences import (has_stage_variation, has_tool_variation,
                             load_sequence_groups, load_sequences, sampled_agent_counts,
                             symbol_expression, unmarked,
                             workflow_counts)
from synth.session import WorkflowPaths
from synth.vomm import FAMILY_PARTS, START

DEFAULT_PROMPT_WORKFLOWS = 100
#: Default of ``synth_max_workflows``: workflows per type that train the automaton.
DEFAULT_MAX_WORKFLOWS = 20_000
#: Separates the late-slice flag from the ``--group-by`` group in the loaded group keys.
_LATE_SEP = "\x1f"
#: Held-out workflows per type whose prompts are scored (the first ones by workflow id).
EVAL_PROMPT_WORKFLOWS = 1000


def _late_flag_sql(con: duckdb.DuckDBPyConnection) -> str:
    """SQL over a ``calls`` row: ``'L'`` when the call starts at or after the cut of its type's
    last :data:`FORWARD_SHARE` of workflows by start time (read on a workflow's first call: its
    start), else ``'E'``; then the digit of its start-time slice, 0 to
    :data:`synth.next_select.ROLLING_BUCKETS` − 1 (the rolling origins of
    :func:`synth.next_select.select_served`). The cut of a type is the start of its
    ``⌈share·n⌉``-th latest workflow; slice k starts at the ``⌊k·n/B⌋ + 1``-th earliest
    (workflows starting together fall on the same side of every cut)."""
    cuts = con.execute(
        "SELECT workflow_type_id, max(s) FILTER (WHERE r = greatest(1, CAST(ceil($share * n) AS BIGINT))), "
        "list(s ORDER BY s) "
        "FROM (SELECT workflow_type_id, s, row_number() OVER (PARTITION BY workflow_type_id "
        "ORDER BY s DESC, workflow_id DESC) AS r, count(*) OVER (PARTITION BY workflow_type_id) AS n "
        "FROM (SELECT workflow_type_id, workflow_id, min(t_arrival) AS s FROM calls "
        "GROUP BY ALL)) GROUP BY ALL ORDER BY 1", {"share": FORWARD_SHARE}).fetchall()
    if not cuts:
        return "'E0'"
    late = " ".join(f"WHEN {sql_string(wt)} THEN {float(cut)!r}" for wt, cut, _ in cuts
                    if cut is not None)
    slices = []
    for wt, _, starts in cuts:
        n = len(starts)
        bounds = [float(starts[k * n // ROLLING_BUCKETS]) for k in range(1, ROLLING_BUCKETS)]
        slices.append(f"WHEN {sql_string(wt)} THEN "
                      + " + ".join(f"(t_arrival >= {b!r})::INT" for b in bounds))
    return (f"(CASE WHEN t_arrival >= (CASE workflow_type_id {late} END) THEN 'L' ELSE 'E' END"
            f" || CAST(CASE workflow_type_id {' '.join(slices)} ELSE 0 END AS VARCHAR))")


def _split_late(mixed: list[dict[str, int]] | None, grouped: bool
                ) -> tuple[list[dict[str, int]] | None, list[int] | None, list[dict[int, int]] | None]:
    """Per path, its ``--group-by`` groups' counts (None without ``--group-by``), how many of
    its workflows are in the time-ordered slice and how many fall in each start-time slice,
    from group keys ``flag digit[SEP group]``."""
    if mixed is None:
        return None, None, None
    late = [sum(k for g, k in m.items() if g.startswith("L")) for m in mixed]
    buckets = []
    for m in mixed:
        out_b: dict[int, int] = {}
        for g, k in m.items():
            b = int(g.split(_LATE_SEP, 1)[0][1:])
            out_b[b] = out_b.get(b, 0) + k
        buckets.append(out_b)
    if not grouped:
        return None, late, buckets
    groups = []
    for m in mixed:
        out: dict[str, int] = {}
        for g, k in m.items():
            name = g.split(_LATE_SEP, 1)[1]
            out[name] = out.get(name, 0) + k
        groups.append(out)
    return groups, late, buckets


def agent_timings(con: duckdb.DuckDBPyConnection, alphabet: str = "agent"
                  ) -> dict[str, dict[str, tuple[float, float]]]:
    """Per workflow type and symbol (agent, or first tool with ``alphabet="tool"``):
    (mean call latency s, mean gap after a call s — the tool/think time)."""
    columns = {row[0] for row in con.execute("DESCRIBE calls").fetchall()}
    latency = "latency_s" if "latency_s" in columns else "t_finish - t_arrival"
    gap = "gap_after_s" if "gap_after_s" in columns else "NULL::DOUBLE"
    symbol = symbol_expression(con, alphabet)  # the symbols the sequences are read in
    rows = con.execute(f"""
        SELECT workflow_type_id, {symbol}, avg({latency}), coalesce(avg({gap}), 0)
        FROM calls GROUP BY ALL""").fetchall()
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for wt, agent, lat, gap_s in rows:
        out.setdefault(wt, {})[agent] = (float(lat or 0.0), float(gap_s or 0.0))
    return out


def build_workflows_section(con: duckdb.DuckDBPyConnection, options: dict[str, Any]) -> dict:
    """``profile.json["workflows"]``: one synth section per workflow type in ``calls``.

    Each section records in ``training_sample`` how many workflows trained it
    (``workflows_used``) of how many the store holds (``workflows_total``).
    """
    prune = options.get("prune")
    alpha = options.get("alergia_alpha")
    quantiles = tuple(options.get("loop_quantiles") or LOOP_QUANTILES)
    prompt_workflows = int(options.get("prompt_workflows") or DEFAULT_PROMPT_WORKFLOWS)
    max_workflows = options.get("synth_max_workflows")
    max_workflows = DEFAULT_MAX_WORKFLOWS if max_workflows is None else int(max_workflows)
    seed = int(options.get("seed") or 0)
    timings = agent_timings(con)
    tool_timings = agent_timings(con, "tool")
    totals = workflow_counts(con)
    sections = {}
    group = (call_group_sql(options["group_by"], options.get("group_pattern"))
             if options.get("group_by") else None)

    late_sql = (_late_flag_sql(con) if options.get("forward_validation", True)
                else None)

    def load(wt: str | None, alphabet: str, limit: int | None) -> dict:
        """Distinct paths, counts, (with ``--group-by``) their groups' counts, how many of
        each path's workflows are in the time-ordered validation slice and in each start-time
        slice (or None, None)."""
        if late_sql is None:
            rows = load_sequence_groups(con, group, wt, alphabet=alphabet, max_workflows=limit,
                                        seed=seed)
            return {t: (*r, None, None) for t, r in rows.items()}
        both = (late_sql if group is None
                else f"{late_sql} || {sql_string(_LATE_SEP)} || {group}")
        rows = load_sequence_groups(con, both, wt, alphabet=alphabet, max_workflows=limit,
                                    seed=seed)
        return {t: (seqs, counts, *_split_late(mixed, group is not None))
                for t, (seqs, counts, mixed) in rows.items()}
    # each type's alphabet first (its sampled agents: one grouping), so that the agent
    # sequences are read only where some type is read in plain agents
    alphabets = {wt: context_alphabet(con, wt, agents)
                 for wt, agents in sampled_agent_counts(con, max_workflows, seed).items()}
    distinct = (load(None, "agent", max_workflows)
                if "agent" in alphabets.values() else dict.fromkeys(alphabets))
    for wt, loaded in sorted(distinct.items()):
        text = load_text_workflows(con, wt, max_workflows=prompt_workflows)
        contexts, alphabet = None, alphabets[wt]
        if alphabet == "agent":
            sequences, counts, groups, forward, buckets = loaded
        else:
            # some responses call tools (several agents), or some agent runs in several
            # stages: offer the marked contexts
            marked, counts, groups, forward, buckets = load(
                wt, alphabet, max_workflows if max_workflows > 0 else None)[wt]
            contexts = [q.calls for q in marked]
            sequences = [unmarked(q) for q in marked]
        section = fit_sequences(
            sequences, timings.get(wt, {}),
            alpha=DEFAULT_ALPHA if alpha is None else float(alpha),
            prune=DEFAULT_PRUNE if prune is None else float(prune),
            loop_quantiles=quantiles, text_workflows=text or None, counts=counts,
            contexts=contexts, context_alphabet=alphabet, groups=groups, forward=forward,
            time_slices=buckets)
        if section.get("remaining_model") and len({a for q in sequences for a in q.calls}) == 1:
            tool_remaining(con, wt, section, tool_timings, max_workflows, seed, group)
        section["training_sample"] = {
            "workflows_used": section["workflows"], "workflows_total": totals.get(wt, 0),
            "distinct_paths": len(sequences),
            "max_workflows": max_workflows if max_workflows > 0 else None, "seed": seed}
        sections[wt] = section
    return sections


def context_alphabet(con: duckdb.DuckDBPyConnection, wt: str, agents: int) -> str:
    """The richest alphabet the calls of type ``wt`` are worth reading in: tool marks where
    there are several agents (``agents``: how many the sampled workflows hold,
    :func:`synth.sequences.sampled_agent_counts`) and some responses call tools
    (:func:`synth.sequences.has_tool_variation`), stages where some agent runs in several
    stages (:func:`synth.sequences.has_stage_variation`); ``"agent"`` when neither."""
    tools = agents > 1 and has_tool_variation(con, wt)
    parts = (has_stage_variation(con, wt), tools)
    return next(fam for fam, fam_parts in FAMILY_PARTS.items() if fam_parts == parts)


def tool_remaining(con: duckdb.DuckDBPyConnection, wt: str, section: dict,
                   tool_timings: dict[str, dict[str, tuple[float, float]]],
                   max_workflows: int, seed: int, group: str | None = None) -> None:
    """Where a workflow type has one agent its agent sequence says nothing but the call index;
    the tool each call ran (``tool_names[1]``; SWE-agent's ``submit``, ``str_replace_editor``…)
    may say more. The context of call i is the tools of the calls before it (the sequence
    shifted by one after :data:`synth.vomm.START`): that is what a session knows when call i
    is annotated, so what ``profiler eval`` scores is what the Predictor serves. The remaining-work model is refit over tool names and replaces the agent one
    when its validation beat the position median by the Bonferroni bar
    (:func:`synth.sequence_select.select_remaining`) and its validation MAE is lower than the
    agent model's; the choice is recorded either way (``selection.tool_alphabet``).
    ``group`` (SQL, ``--group-by``): the selection folds keep a group's workflows together."""
    limit = max_workflows if max_workflows > 0 else None
    counted = load_sequence_groups(con, group, wt, alphabet="tool", max_workflows=limit,
                                   seed=seed).get(wt)
    if not counted:
        return
    seqs, counts, groups = counted
    # the context of call i is the tools of the calls before it (after START): call i's own
    # tool is not known when call i is annotated, so a model that read it could not be served
    calls = [(START, *s.calls[:-1]) for s in seqs]
    if len({t for c in calls for t in c} - {START}) < 2:
        section["remaining_model"]["selection"]["tool_alphabet"] = {"chosen": False,
                                                                    "reason": "one tool name (or none)"}
        return
    sel = select_remaining(calls, counts, seed=seed, groups=groups)
    agent_mae = section["remaining_model"]["selection"].get("validation_mae")  # None: not validated
    chosen = (not is_position_median(sel) and sel.get("validation_mae") is not None
              and agent_mae is not None and sel["validation_mae"] < agent_mae)
    summary = {"chosen": bool(chosen), "validation_mae": sel.get("validation_mae"),
               "agent_validation_mae": agent_mae,
               "order": sel.get("order"), "position": sel.get("position")}
    if not chosen:
        section["remaining_model"]["selection"]["tool_alphabet"] = summary
        return
    model = RemainingWork(order=sel["order"], position=sel["position"], min_n=sel["min_n"],
                          point=sel["point"]).fit(calls, counts, tool_timings.get(wt, {}))
    section["remaining_model"] = {**model.to_dict(), "alphabet": "tool", "tool_context": "previous",
                                  "selection": {**sel, "tool_alphabet": summary}}


def evaluate_workflows(profile: Any, con: duckdb.DuckDBPyConnection) -> dict:
    """``profiler eval --json`` keys for workflow paths (see :mod:`synth.evaluation`).

    ``profile`` is a ``store.profile_artifact.Profile`` (or its ``data`` dict). Held-out
    workflow types missing from the profile count as unknown: every call a miss, no
    acceptance, and no remaining-calls estimate.
    """
    data = profile.data if hasattr(profile, "data") else profile
    sections = data.get("workflows") or {}
    total = PathScores()
    by_type: dict[str, dict] = {}
    prompt_totals = {"n_prompts": 0, "exact": 0, "chars": 0, "covered_chars": 0}
    for wt, sequences in sorted(load_sequences(con).items()):
        section = sections.get(wt)
        if section is None:
            unknown = PathScores(workflows=len(sequences),
                                 next_total=sum(max(len(s.calls) - 1, 0) for s in sequences),
                                 calls=sum(len(s.calls) for s in sequences))
            total.add(unknown)
            by_type[wt] = {"known": False, **unknown.summary()}
            continue
        paths = WorkflowPaths.from_section(section)
        tools = contexts = None
        if paths.remaining_alphabet == "tool":
            tools = {s.workflow_id: s.calls for s in load_sequences(con, wt, alphabet="tool").get(wt, [])}
        if paths.reads_context:
            # every call as served: its stage (when recorded) and its tool mark; the
            # WorkflowPaths reads the parts its models use
            contexts = {s.workflow_id: s.calls for s in load_sequences(
                con, wt, alphabet="agent_stage_tool").get(wt, [])}
        scores = score_sequences(section, sequences, paths, tools=tools, contexts=contexts)
        total.add(scores)
        by_type[wt] = {"known": True, "regex": section.get("regex"), **scores.summary()}
        if paths.has_sequence_model:   # the next-agent candidate served (synth.next_served)
            by_type[wt]["next_agent"]["served"] = paths.served_next
        templates = (section.get("prompt_composition") or {}).get("template_parts")
        if templates:
            text = load_text_workflows(con, wt, max_workflows=EVAL_PROMPT_WORKFLOWS)
            if text:
                result = evaluate_templates(templates, text)
                by_type[wt]["prompt_composition"] = result
                for key in prompt_totals:
                    prompt_totals[key] += result[key]
    out = total.summary()
    out["workflows_by_type"] = by_type
    if prompt_totals["n_prompts"]:
        out["prompt_composition"] = {
            "unit": "characters",
            "exact_share": prompt_totals["exact"] / prompt_totals["n_prompts"],
            "covered_char_share": (prompt_totals["covered_chars"] / prompt_totals["chars"]
                                   if prompt_totals["chars"] else None),
            "n_prompts": prompt_totals["n_prompts"]}
    return out
