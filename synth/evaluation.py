"""Held-out scores of a workflow section.

For every held-out workflow the session is replayed call by call through
:class:`synth.session.WorkflowPaths`:

* **next-agent top-1**: after each call but the last, is the most probable next agent the one
  that actually came next? (Sections without a sequence model: a session that left the
  automaton scores a miss.) Inside a fan-out
  group the next call is often a sibling whose existence depends on the group's (random)
  width, so ``step_top1_accuracy`` also scores, after each step, the most probable next step
  (symbol of the session automaton) against the step that followed.
* **remaining-calls MAE**: after each call, | predicted remaining calls − calls that really
  followed |. With a sequence model (sections fitted with selection, see
  :mod:`synth.sequence_select`) every call is scored (``scored_share`` = 1): next agent from
  the variable-order model (mixed with the automaton while on it), remaining calls from the
  context model's point prediction (median or mean, chosen by validation); ``log_loss`` is
  the mean ``−log p(actual next agent)``. Older sections score only calls still on the
  automaton (``known_share``), with its expected remaining calls. ``baselines`` (first-order and plain variable-order Markov top-1, position
  median remaining calls, :mod:`synth.markov_baselines`) are scored on the same calls;
  ``baseline_mae`` is the position-only mean's error on the automaton's calls.
  ``baselines_log_loss`` gives the two Markov baselines' log-loss (add-one smoothed, see
  :mod:`synth.markov_baselines`) on the same calls, and ``markov_wb``'s: the variable-order
  Markov with interpolated Witten–Bell smoothing (top-1 in ``baselines.markov_wb``).
* **acceptance**: share of workflows whose whole sequence is accepted by the pruned PFA (step
  symbols), by the bounded regex parsed back into an NFA (calls), and by the session tracker
  (call by call on the counting session automaton: never left it and ended where the workflow
  may stop).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Mapping, Sequence

from synth.markov_baselines import BaselinePredictor

from synth.pfa import PFA
from synth.session import WorkflowPaths
from synth.sequences import WorkflowSequence
from synth.vomm import START, strip_tool_mark


@dataclass
class PathScores:
    """Running sums; :meth:`summary` turns them into the ``profiler eval`` keys."""

    workflows: int = 0
    pfa_accepted: int = 0
    regex_accepted: int = 0
    session_accepted: int = 0
    next_total: int = 0
    next_correct: int = 0
    step_total: int = 0
    step_correct: int = 0
    calls: int = 0
    known_calls: int = 0
    abs_error: float = 0.0
    baseline_abs_error: float = 0.0
    next_scored: int = 0
    log_loss_sum: float = 0.0
    scored_calls: int = 0
    model_abs_error: float = 0.0
    baseline_events: int = 0
    markov1_correct: int = 0
    markov_vo_correct: int = 0
    markov1_log_loss_sum: float = 0.0
    markov_vo_log_loss_sum: float = 0.0
    markov_vo_log_loss_events: int = 0
    markov_wb_correct: int = 0
    markov_wb_log_loss_sum: float = 0.0
    markov_wb_events: int = 0
    position_median_abs_error: float = 0.0
    baseline_calls: int = 0
    after_correct: int = 0
    after_log_loss_sum: float = 0.0

    def add(self, other: "PathScores") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> dict:
        def ratio(a: float, b: float) -> float | None:
            return float(a / b) if b else None
        return {
            "next_agent": {"top1_accuracy": ratio(self.next_correct, self.next_total),
                           "log_loss": ratio(self.log_loss_sum, self.next_scored),
                           "top1_after_response": ratio(self.after_correct, self.next_scored),
                           "log_loss_after_response": ratio(self.after_log_loss_sum,
                                                            self.next_scored),
                           "scored_share": ratio(self.next_scored, self.next_total),
                           "baselines": {
                               "markov1": ratio(self.markov1_correct, self.baseline_events),
                               "markov_vo": ratio(self.markov_vo_correct,
                                                  self.baseline_events),
                               "markov_wb": ratio(self.markov_wb_correct, self.markov_wb_events)},
                           "baselines_log_loss": {
                               "markov1": ratio(self.markov1_log_loss_sum, self.baseline_events),
                               "markov_vo": ratio(self.markov_vo_log_loss_sum,
                                                  self.markov_vo_log_loss_events),
                               "markov_wb": ratio(self.markov_wb_log_loss_sum,
                                                  self.markov_wb_events)},
                           "n": self.next_total,
                           "step_top1_accuracy": ratio(self.step_correct, self.step_total),
                           "n_steps": self.step_total},
            "path": {"regex_acceptance": ratio(self.regex_accepted, self.workflows),
                     "pfa_acceptance": ratio(self.pfa_accepted, self.workflows),
                     "session_acceptance": ratio(self.session_accepted, self.workflows),
                     "n_workflows": self.workflows},
            "remaining_calls": {"mae": (ratio(self.model_abs_error, self.scored_calls)
                                        if self.scored_calls else
                                        ratio(self.abs_error, self.known_calls)),
                                "scored_share": ratio(self.scored_calls or self.known_calls,
                                                      self.calls),
                                "baselines": {"position_median": ratio(
                                    self.position_median_abs_error, self.baseline_calls)},
                                "automaton_mae": ratio(self.abs_error, self.known_calls),
                                "baseline_mae": ratio(self.baseline_abs_error,
                                                      self.known_calls),
                                "known_share": ratio(self.known_calls, self.calls),
                                "n": self.calls},
        }


def served_contexts(paths: WorkflowPaths, seq: WorkflowSequence, i: int,
                    marks: Sequence[str] = (), tools: Sequence[str] = ()) -> dict:
    """What a serving session holds when it predicts after call ``i`` of ``seq``, as
    :class:`predictors.Predictor` builds it: ``arrival`` (at call i's annotation: the marks of
    the finished calls, call i plain) and ``after`` (once call i's response was observed: every
    mark) context symbols, and ``tools`` for a remaining-work model over tool names (the first
    tool of every call *before* call i, after :data:`synth.vomm.START`: call i's own tool is
    not known when it is annotated; its stage is: the request carries it). ``marks``: the
    workflow's calls in the ``agent_tool`` (or ``agent_stage_tool``) alphabet; ``tools``: in
    the ``tool`` alphabet (empty when not loaded)."""
    history = seq.calls[:i + 1]
    out: dict = {"history": history, "arrival": None, "after": None, "tools": None}
    if paths.reads_context and marks:
        out["arrival"] = (*marks[:i], strip_tool_mark(marks[i]))
        out["after"] = tuple(marks[:i + 1])
    if paths.remaining_alphabet == "tool" and tools:
        out["tools"] = (START, *tools[:i])
    return out


def served_predictions(paths: WorkflowPaths, seq: WorkflowSequence,
                       marks: Sequence[str] = (), tools: Sequence[str] = ()):
    """Yield ``(i, state, served, at_arrival, after_response)`` for every call ``i`` of
    ``seq``: the automaton state, :func:`served_contexts`, and the predictions
    :class:`predictors.Predictor` serves in its annotation of call i and, once call i's
    response was observed, in ``annotate(..., advance=False)`` (sections with a sequence model;
    None otherwise). :func:`score_sequences` scores exactly these."""
    modelled = paths.has_sequence_model
    for i, state in enumerate(paths.track(seq.calls)):
        served = served_contexts(paths, seq, i, marks, tools)
        if not modelled:
            yield i, state, served, None, None
            continue
        history = served["history"]
        pred = paths.predict_at(state, history, i + 1, served["tools"], served["arrival"])
        after = (paths.predict_at(state, history, i + 1, served["tools"], served["after"])
                 if served["after"] is not None else pred)
        yield i, state, served, pred, after


def score_sequences(section: dict, sequences: Sequence[WorkflowSequence],
                    paths: WorkflowPaths | None = None,
                    tools: Mapping[str, Sequence[str]] | None = None,
                    contexts: Mapping[str, Sequence[str]] | None = None) -> PathScores:
    """Replay held-out ``sequences`` against one workflow type's section (``tools``: workflow
    id → first tool name of each call, for a remaining-work model over tool names;
    ``contexts``: workflow id → the calls in the ``agent_tool`` alphabet, for a sequence model
    over tool-marked agents). Every prediction is made from what a serving session holds at
    that moment (:func:`served_contexts`)."""
    paths = paths or WorkflowPaths.from_section(section)
    pfa = PFA.from_dict(section["pfa"])
    stepper = PFA.from_dict(section.get("session_pfa") or section["pfa"])
    baseline = section.get("remaining_calls_by_index", [])
    modelled = paths.has_sequence_model
    base = BaselinePredictor(section["baselines"]) if section.get("baselines") else None
    scores = PathScores()
    regex_memo: dict[tuple[str, ...], bool] = {}  # the NFA check is the slow part
    for seq in sequences:
        n = len(seq.calls)
        scores.workflows += 1
        scores.pfa_accepted += pfa.accepts(seq.step_symbols)
        q: int | None = stepper.initial
        for i, symbol in enumerate(seq.step_symbols[:-1]):
            q = stepper.trans[q].get(symbol) if q is not None else None
            scores.step_total += 1
            if q is not None and stepper.trans[q]:
                best = max(sorted(stepper.counts[q]), key=stepper.counts[q].__getitem__)
                scores.step_correct += best == seq.step_symbols[i + 1]
        if seq.calls not in regex_memo:
            regex_memo[seq.calls] = paths.regex_accepts(seq.calls)
        scores.regex_accepted += regex_memo[seq.calls]
        tool_seq = tuple((tools or {}).get(seq.workflow_id, ()))
        marks = tuple((contexts or {}).get(seq.workflow_id, ()))
        states = paths.track(seq.calls)
        last = states[-1] if states else paths.start()
        scores.session_accepted += paths.is_accepting(last)
        for i, state, served, pred, after in served_predictions(paths, seq, marks, tool_seq):
            scores.calls += 1
            remaining = n - 1 - i
            history = served["history"]
            if i < n - 1:
                actual = seq.calls[i + 1]
                scores.next_total += 1
                if modelled:
                    nxt = pred["next_agents"]
                    scores.next_scored += 1
                    p = paths.vomm_probability(state, history, actual, served["arrival"])
                    scores.log_loss_sum -= math.log(max(p, 1e-6))
                    scores.next_correct += bool(nxt) and nxt[0]["agent_id"] == actual
                    nxt_after = after["next_agents"]
                    scores.after_correct += bool(nxt_after) and nxt_after[0]["agent_id"] == actual
                    p_after = (paths.vomm_probability(state, history, actual, served["after"])
                               if served["after"] is not None else p)
                    scores.after_log_loss_sum -= math.log(max(p_after, 1e-6))
                elif state is not None:
                    nxt = paths.estimates(state)["next_agents"]
                    scores.next_correct += bool(nxt) and nxt[0]["agent_id"] == actual
                if base is not None:
                    scores.baseline_events += 1
                    scores.markov1_correct += base.markov1(history) == actual
                    scores.markov_vo_correct += base.markov_vo(history) == actual
                    scores.markov1_log_loss_sum -= math.log(max(base.markov1_probability(history, actual), 1e-6))
                    p_vo = base.markov_vo_probability(history, actual)
                    if p_vo is not None:
                        scores.markov_vo_log_loss_events += 1
                        scores.markov_vo_log_loss_sum -= math.log(max(p_vo, 1e-6))
                    dist = base.markov_wb_distribution(history)
                    if dist is not None:
                        scores.markov_wb_events += 1
                        scores.markov_wb_log_loss_sum -= math.log(max(dist.get(actual, dist["\0unseen"]), 1e-6))
                        scores.markov_wb_correct += base.markov_wb_from(dist) == actual
            if base is not None:
                scores.baseline_calls += 1
                scores.position_median_abs_error += abs(base.position_median(i) - remaining)
            if modelled:
                scores.scored_calls += 1
                scores.model_abs_error += abs(pred.get("remaining_calls_point",
                                                       pred.get("expected_remaining_calls")
                                                       or 0.0) - remaining)
            if state is None:
                continue
            scores.known_calls += 1
            scores.abs_error += abs(paths.estimates(state)["expected_remaining_calls"]
                                    - remaining)
            guess = baseline[i] if i < len(baseline) else 0.0
            scores.baseline_abs_error += abs(guess - remaining)
    return scores
