"""Fit the workflow section of one workflow type from its sequences.

sequences → prefix tree → ALERGIA (``alpha``) → pruned PFA (``prune``) → bounded regex →
counting session automaton (regex DFA × PFA, :mod:`synth.counting`) → call-level chain →
precomputed session table; and (when the logs carry text) prompt templates.
The result is a JSON-ready dict stored at ``profile.json["workflows"][wt]`` and read back by
:class:`synth.session.WorkflowPaths`.
"""
from __future__ import annotations

from collections import Counter
from typing import Mapping, Sequence

import numpy as np

from synth.chain import (build_chain, chain_estimates, combine_chains, member_shares,
                         session_table)
from synth.counting import DEFAULT_PRIOR_WEIGHT, counting_pfa
from synth.pfa import learn_pfa, prune as prune_pfa
from synth.prompts import TextCall, evaluate_templates, learn_templates, template_string
from synth.regex_synth import LOOP_QUANTILES, RegexMatcher, synthesize_regex, width_ranges
from synth.markov_baselines import fit_baselines
from synth.next_select import select_served
from synth.remaining import RemainingWork
from synth.sequence_select import select_models
from synth.sequences import WorkflowSequence
from synth.session import WorkflowPaths
from synth.vomm import END, VariableOrderMarkov, project_all

SECTION_FORMAT = 1
DEFAULT_ALPHA = 0.2
DEFAULT_PRUNE = 0.05


def remaining_by_index(sequences: Sequence[WorkflowSequence],
                       counts: Sequence[int] | None = None) -> list[float]:
    """Mean number of calls still to come after the i-th call (a position-only baseline);
    ``counts[i]`` = how many workflows ``sequences[i]`` stands for (default 1)."""
    lengths: Counter = Counter()
    for s, n in zip(sequences, counts or [1] * len(sequences)):
        lengths[len(s.calls)] += n
    longest = max(lengths, default=0)
    sums, totals = np.zeros(longest), np.zeros(longest)
    for n, k in lengths.items():
        sums[:n] += k * np.arange(n - 1, -1, -1)
        totals[:n] += k
    return [float(round(v, 4)) for v in sums / np.maximum(totals, 1)]


def fit_sequences(sequences: Sequence[WorkflowSequence],
                  timings: Mapping[str, tuple[float, float]] | None = None,
                  alpha: float = DEFAULT_ALPHA, prune: float = DEFAULT_PRUNE,
                  loop_quantiles: tuple[float, float] = LOOP_QUANTILES,
                  text_workflows: Sequence[list[TextCall]] | None = None,
                  prior_weight: float = DEFAULT_PRIOR_WEIGHT,
                  counts: Sequence[int] | None = None, select: bool = True,
                  cv_folds: int = 3, cv_max_workflows: int = 1000, seed: int = 0,
                  contexts: Sequence[Sequence[str]] | None = None,
                  context_alphabet: str = "agent_tool",
                  groups: Sequence[Mapping[str, int]] | None = None,
                  forward: Sequence[int] | None = None,
                  time_slices: Sequence[Mapping[int, int]] | None = None) -> dict:
    """The workflow section for one workflow type (see the module docstring).

    ``timings[agent] = (mean latency_s, mean gap_after_s)`` feeds the remaining-seconds
    estimates; agents without timings count 0 s. ``counts[i]`` says how many workflows
    ``sequences[i]`` stands for (default 1 each; :func:`synth.sequences.load_sequence_counts`
    returns distinct sequences and their counts): the result is the same as for the list
    with every sequence repeated that often, but costs O(distinct sequences).

    With ``select`` (the default) the section also carries the variable-order sequence model,
    the context-conditioned remaining-work model (both chosen by ``cv_folds``-fold
    cross-validation by workflow on at most ``cv_max_workflows`` workflows, see
    :mod:`synth.sequence_select`) and the naive baselines ``profiler eval`` scores beside them.
    ``contexts[i]`` (optional): the context symbols of ``sequences[i]``'s calls in
    ``context_alphabet`` (agent marked with whether its response called a tool,
    :func:`synth.sequences.tool_mark`, and/or with its stage, :func:`synth.vomm.stage_symbol`),
    whose context families are offered to the next-agent selection (and, with stages, to the
    remaining-work selection). ``groups[i]`` (optional, ``profiler fit --group-by``): how many
    of ``sequences[i]``'s ``counts[i]`` workflows belong to each group (a task); the selection
    folds then keep a group's workflows together (:func:`synth.sequence_select.select_models`).
    ``forward[i]`` (optional): how many of them are among the last fifth of the type's
    workflows by start time, the time-ordered validation slice the selection checks its
    choices on. ``time_slices[i]`` (optional): how many of them fall in each start-time slice
    (0 earliest), the rolling origins on which the served next-agent candidate is chosen
    (:mod:`synth.next_select`).
    """
    if not sequences:
        raise ValueError("no workflows to fit")
    if not 0.0 <= prune < 1.0:
        raise ValueError(f"prune must be in [0, 1), got {prune}")
    counts = [1] * len(sequences) if counts is None else [int(n) for n in counts]
    if len(counts) != len(sequences) or min(counts) < 1:
        raise ValueError("counts must give a positive count for every sequence")
    timings = dict(timings or {})
    # identical workflows are fitted once, with their multiplicity as weight
    distinct: Counter = Counter()
    step_counts: Counter = Counter()  # Step -> how many training steps it stands for
    calls: Counter = Counter()
    for s, n in zip(sequences, counts):
        distinct[(s.step_symbols, s.step_widths)] += n
        calls[s.calls] += n
        for step in s.steps:
            step_counts[step] += n
    steps = [symbols for symbols, _ in distinct]
    weights = list(distinct.values())
    learned = learn_pfa(steps, [w for _, w in distinct], alpha=alpha, weights=weights)
    pruned = prune_pfa(learned, prune)
    regexes = synthesize_regex(pruned, steps, loop_quantiles, weights)
    shares = member_shares([(st.symbol, st.agents) for st in step_counts],
                           list(step_counts.values()))
    counted = None
    if regexes["step_tree"] is not None:
        counted = counting_pfa(regexes["step_tree"], pruned, steps, [w for _, w in distinct],
                               weights, prior_weight)
    if counted is None:
        session_pfa = pruned
        chain = build_chain(pruned, shares)
        fallback = None
    else:
        # sessions run on the counting automaton; beyond its loop bounds they continue on
        # the PFA (memoryless, but still on the pruned automaton)
        session_pfa, pfa_state = counted
        inner, outer = build_chain(session_pfa, shares), build_chain(pruned, shares)
        chain = combine_chains(inner, outer)
        outer_index = {key: i + inner.size for i, key in enumerate(outer.keys)}
        fallback = {}
        for c, key in enumerate(inner.keys):
            q = pfa_state[key[1]]
            if key[0] == "q":
                target = outer_index.get(("q", q))
            else:  # inside a fan-out step: the same step of the PFA, else the step done
                _, _, symbol, k = key
                target = outer_index.get(("g", q, symbol, k),
                                         outer_index.get(("q", pruned.trans[q][symbol])))
            if target is not None:
                fallback[c] = target
    estimates = chain_estimates(chain, timings)
    table = session_table(chain, estimates, timings, fallback)
    matcher = RegexMatcher(regexes["regex"])
    widths = width_ranges(pruned, loop_quantiles)
    agent_index = {a: i for i, a in enumerate(chain.agents)}
    section = {
        "format": SECTION_FORMAT,
        "alphabet": "agent",
        "regex": regexes["regex"],
        "step_regex": regexes["step_regex"],
        "unbounded_regex": regexes["unbounded_regex"],
        "train_acceptance": float(np.average([pruned.accepts(s) for s in steps],
                                             weights=weights)),
        "train_counting_acceptance": float(np.average(
            [session_pfa.accepts(s) for s in steps], weights=weights)),
        "train_regex_acceptance": float(np.average([matcher.accepts(c) for c in calls],
                                                   weights=list(calls.values()))),
        "workflows": int(sum(counts)),
        "calls": int(sum(len(s.calls) * n for s, n in zip(sequences, counts))),
        "params": {"alpha": alpha, "prune": prune, "loop_quantiles": list(loop_quantiles),
                   "prior_weight": prior_weight},
        "states": {"learned": len(learned.states), "pruned": len(pruned.states),
                   "counting": len(session_pfa.states), "chain": chain.size,
                   "session": len(table.next)},
        "fanout": {symbol: {"members": shares.get(symbol, {}),
                            "widths": {str(w): c for w, c in
                                       sorted(pruned.width_counts(symbol).items())},
                            "width_range": list(widths[symbol])}
                   for symbol in pruned.alphabet},
        "timings": {a: {"mean_latency_s": float(t[0]), "mean_gap_after_s": float(t[1])}
                    for a, t in sorted(timings.items())},
        "remaining_calls_by_index": remaining_by_index(sequences, counts),
        "pfa": pruned.to_dict(),
        "session_pfa": session_pfa.to_dict(),
        "chain": {"agents": chain.agents,
                  "rows": [[[agent_index[a], t, round(p, 9)] for a, t, p, _ in row]
                           for row in chain.rows],
                  "p_end": [round(p, 9) for p in chain.p_end]},
        "session": {"next": table.next, "estimates": table.estimates,
                    "chain_state": table.chain_state, "last_agent": table.last_agent,
                    "accepting": table.accepting},
    }
    if select:
        section.update(sequence_models(sequences, counts, timings, alpha=alpha, prune=prune,
                                       loop_quantiles=loop_quantiles,
                                       prior_weight=prior_weight, folds=cv_folds,
                                       max_workflows=cv_max_workflows, seed=seed,
                                       contexts=contexts, context_alphabet=context_alphabet,
                                       groups=groups, forward=forward,
                                       time_slices=time_slices))
    if text_workflows:
        parts = learn_templates(text_workflows)
        section["prompt_composition"] = {
            "unit": "characters",
            "templates": {a: template_string(t) for a, t in parts.items()},
            "template_parts": parts,
            "train": evaluate_templates(parts, text_workflows),
        }
    return section


def _pfa_next(section: dict):
    """``history -> {symbol: p}`` (END included) from a section's session automaton, None
    once the history left it; states are memoized by history."""
    paths = WorkflowPaths.from_section(section)
    states: dict[tuple, int | None] = {(): paths.start()}

    def state_of(history: tuple) -> int | None:
        k = len(history)
        while history[:k] not in states:  # longest memoized prefix, then step forward
            k -= 1
        for j in range(k, len(history)):
            states[history[:j + 1]] = paths.advance(states[history[:j]], history[j])
        return states[history]

    def predict(history: Sequence[str]) -> dict[str, float] | None:
        state = state_of(tuple(history))
        if state is None:
            return None
        est = paths.estimates(state)
        out = {a["agent_id"]: a["p"] for a in est["next_agents"]}
        out[END] = est["p_end"]
        return out
    return predict


def sequence_models(sequences: Sequence[WorkflowSequence], counts: Sequence[int],
                    timings: Mapping[str, tuple[float, float]], *, alpha: float, prune: float,
                    loop_quantiles: tuple[float, float], prior_weight: float, folds: int = 3,
                    max_workflows: int = 1000, seed: int = 0,
                    contexts: Sequence[Sequence[str]] | None = None,
                    context_alphabet: str = "agent_tool",
                    groups: Sequence[Mapping[str, int]] | None = None,
                    forward: Sequence[int] | None = None,
                    time_slices: Sequence[Mapping[int, int]] | None = None) -> dict:
    """``sequence_model``, ``remaining_model`` and ``baselines`` keys of a section.

    The automaton of every validation fold is fitted like the real one (same ``alpha``,
    ``prune``…, without text and without this selection) so that the mixture weight compares
    like with like.
    """
    # identical workflows merged, in a canonical order: the folds depend only on the multiset
    ctx_of = (list(contexts) if contexts is not None else [None] * len(sequences))
    merged: Counter = Counter()
    merged_groups: dict[tuple, Counter] = {}
    merged_late: Counter = Counter()
    merged_slices: dict[tuple, Counter] = {}
    first = {}
    for i, (s, n, c) in enumerate(zip(sequences, counts, ctx_of)):
        key = (s.calls, s.step_symbols, s.step_widths, tuple(c) if c is not None else ())
        merged[key] += n
        first.setdefault(key, s)
        if groups is not None:
            merged_groups.setdefault(key, Counter()).update(groups[i])
        if forward is not None:
            merged_late[key] += int(forward[i])
        if time_slices is not None:
            merged_slices.setdefault(key, Counter()).update(time_slices[i])
    keys = sorted(merged)
    distinct = [first[k] for k in keys]
    counts = [merged[k] for k in keys]
    path_groups = [dict(merged_groups[k]) for k in keys] if groups is not None else None
    calls = [s.calls for s in distinct]
    ctxs = [k[3] for k in keys] if contexts is not None else None

    def pfa_factory(indices: Sequence[int], weights: Sequence[int]):
        fold = fit_sequences([distinct[j] for j in indices], timings, alpha=alpha,
                             prune=prune, loop_quantiles=loop_quantiles,
                             prior_weight=prior_weight, counts=list(weights), select=False)
        return _pfa_next(fold)

    chosen = select_models(calls, counts, pfa_factory, folds=folds,
                           max_workflows=max_workflows, seed=seed, contexts=ctxs,
                           context_alphabet=context_alphabet, groups=path_groups,
                           forward=[merged_late[k] for k in keys] if forward is not None else None)
    nxt, rem = chosen["next"], chosen["remaining"]
    context = nxt.get("context", "agent")
    vomm = VariableOrderMarkov(max_order=nxt["max_order"], escape=nxt["escape"],
                               min_context=nxt.get("min_context", 1.0)).fit(
        calls, counts, (project_all(ctxs, context)
                        if context != "agent" and ctxs is not None else None))
    rem_alphabet = rem.get("alphabet", "agent")
    rem_calls = (calls if rem_alphabet == "agent" or ctxs is None
                 else project_all(ctxs, rem_alphabet))
    params = {k: rem[k] for k in ("order", "position", "min_n", "point")}
    remaining = RemainingWork(**params).fit(rem_calls, counts,
                                            _by_symbol(timings, rem_calls, calls))
    if rem_calls is not calls:  # a session that reports no stage reads the plain agents
        remaining.add_backoff(RemainingWork(**params).fit(calls, counts, timings))
    validation = {k: chosen[k] for k in ("folds", "workflows", "groups") if k in chosen}
    served = select_served(calls, counts,
                           [dict(merged_slices[k]) for k in keys] if time_slices is not None else None,
                           nxt, ctxs, pfa_factory, max_workflows, seed)
    return {
        "sequence_model": {"alphabet": "agent", "context": context, "vomm": vomm.to_dict(),
                           "mixture": nxt["mixture"], "served": served,
                           "selection": {**nxt, **validation}},
        "remaining_model": {**remaining.to_dict(),
                            **({"alphabet": rem_alphabet} if rem_alphabet != "agent" else {}),
                            "selection": {**validation, **rem}},
        "baselines": fit_baselines(calls, counts),
    }


def _by_symbol(timings: Mapping[str, tuple[float, float]], symbols: Sequence[Sequence[str]],
               agents: Sequence[Sequence[str]]) -> Mapping[str, tuple[float, float]]:
    """Per-agent ``timings`` keyed by the symbols the remaining-work model reads (an agent
    with its stage takes its agent's timings; the agent alphabet: ``timings`` itself)."""
    if symbols is agents:
        return timings
    out = dict(timings)
    for q, a in zip(symbols, agents):
        for sym, agent in zip(q, a):
            if sym not in out and agent in timings:
                out[sym] = timings[agent]
    return out
