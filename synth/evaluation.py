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
* **ours minus each baseline** (``next_agent.vs_baselines``, ``remaining_calls.vs_baselines``):
  the paired difference on the calls both scored, ± its delete-one-workflow jackknife standard
  error (:func:`paired_jackknife`), and ``dominated``: the baseline ahead by over one standard
  error (higher top-1, lower log-loss, lower MAE).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields
from typing import Mapping, Sequence

import numpy as np

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
    # per held-out workflow: {"metric:baseline": (Σ ours − baseline, paired events)}
    paired: list = field(default_factory=list)

    def add(self, other: "PathScores") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def vs_baselines(self) -> dict[str, dict[str, dict]]:
        """``{"next_agent": {baseline: {top1_diff, top1_diff_se, log_loss_diff, log_loss_diff_se,
        n, dominated}}, "remaining_calls": {"position_median": {mae_diff, mae_diff_se, n,
        dominated}}}``: ours minus each baseline (:func:`paired_jackknife`)."""
        out: dict[str, dict[str, dict]] = {"next_agent": {}, "remaining_calls": {}}
        keys = sorted({k for w in self.paired for k in w})
        for key in keys:
            metric, name = key.split(":")
            sums = np.array([w.get(key, (0.0, 0))[0] for w in self.paired], dtype=float)
            counts = np.array([w.get(key, (0.0, 0))[1] for w in self.paired], dtype=float)
            diff, se = paired_jackknife(sums, counts)
            if diff is None:
                continue
            part = "remaining_calls" if metric == "mae" else "next_agent"
            entry = out[part].setdefault(name, {"dominated": False})
            entry.update({f"{metric}_diff": diff, f"{metric}_diff_se": se, f"{metric}_n": int(counts.sum())})
            behind = diff < -(se or 0.0) if metric == "top1" else diff > (se or 0.0)
            entry["dominated"] = bool(entry["dominated"] or behind)
        return out

    def summary(self) -> dict:
        def ratio(a: float, b: float) -> float | None:
            return float(a / b) if b else None
        vs = self.vs_baselines()
        out = {
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
        out["next_agent"]["vs_baselines"] = vs["next_agent"]
        out["remaining_calls"]["vs_baselines"] = vs["remaining_calls"]
        return out


def paired_jackknife(sums: np.ndarray, counts: np.ndarray) -> tuple[float | None, float | None]:
    """``(Σ sums / Σ counts, its delete-one-workflow jackknife standard error)`` from per-workflow
    sums of a paired per-call difference and the calls paired: ``θ₋g = (S − s_g) / (N − n_g)``,
    ``se² = (G − 1)/G · Σ_g (θ₋g − θ̄)²`` over the G workflows with a paired call. (None, None)
    without any; se None with one workflow."""
    keep = counts > 0
    sums, counts = sums[keep], counts[keep]
    total, n = float(sums.sum()), float(counts.sum())
    if n == 0:
        return None, None
    if len(sums) < 2:
        return total / n, None
    theta = (total - sums) / (n - counts)
    g = len(theta)
    return total / n, float(np.sqrt((g - 1) / g * np.sum((theta - theta.mean()) ** 2)))


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
        pair: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])

        def paired(key: str, d: float) -> None:
            pair[key][0] += d
            pair[key][1] += 1
        for i, state, served, pred, after in served_predictions(paths, seq, marks, tool_seq):
            scores.calls += 1
            remaining = n - 1 - i
            history = served["history"]
            if i < n - 1:
                actual = seq.calls[i + 1]
                scores.next_total += 1
                hit, loss = False, None
                if modelled:
                    nxt = pred["next_agents"]
                    scores.next_scored += 1
                    p = paths.vomm_probability(state, history, actual, served["arrival"])
                    loss = -math.log(max(p, 1e-6))
                    scores.log_loss_sum += loss
                    hit = bool(nxt) and nxt[0]["agent_id"] == actual
                    scores.next_correct += hit
                    nxt_after = after["next_agents"]
                    scores.after_correct += bool(nxt_after) and nxt_after[0]["agent_id"] == actual
                    p_after = (paths.vomm_probability(state, history, actual, served["after"])
                               if served["after"] is not None else p)
                    scores.after_log_loss_sum -= math.log(max(p_after, 1e-6))
                elif state is not None:
                    nxt = paths.estimates(state)["next_agents"]
                    hit = bool(nxt) and nxt[0]["agent_id"] == actual
                    scores.next_correct += hit
                if base is not None:
                    scores.baseline_events += 1
                    m1, vo = base.markov1(history) == actual, base.markov_vo(history) == actual
                    scores.markov1_correct += m1
                    scores.markov_vo_correct += vo
                    paired("top1:markov1", float(hit) - m1)
                    paired("top1:markov_vo", float(hit) - vo)
                    ll1 = -math.log(max(base.markov1_probability(history, actual), 1e-6))
                    scores.markov1_log_loss_sum += ll1
                    if loss is not None:
                        paired("log_loss:markov1", loss - ll1)
                    p_vo = base.markov_vo_probability(history, actual)
                    if p_vo is not None:
                        scores.markov_vo_log_loss_events += 1
                        scores.markov_vo_log_loss_sum -= math.log(max(p_vo, 1e-6))
                        if loss is not None:
                            paired("log_loss:markov_vo", loss + math.log(max(p_vo, 1e-6)))
                    dist = base.markov_wb_distribution(history)
                    if dist is not None:
                        scores.markov_wb_events += 1
                        ll_wb = -math.log(max(dist.get(actual, dist["\0unseen"]), 1e-6))
                        scores.markov_wb_log_loss_sum += ll_wb
                        wb = base.markov_wb_from(dist) == actual
                        scores.markov_wb_correct += wb
                        paired("top1:markov_wb", float(hit) - wb)
                        if loss is not None:
                            paired("log_loss:markov_wb", loss - ll_wb)
            pm_err = None
            if base is not None:
                scores.baseline_calls += 1
                pm_err = abs(base.position_median(i) - remaining)
                scores.position_median_abs_error += pm_err
            if modelled:
                scores.scored_calls += 1
                err = abs(pred.get("remaining_calls_point", pred.get("expected_remaining_calls") or 0.0) - remaining)
                scores.model_abs_error += err
                if pm_err is not None:
                    paired("mae:position_median", err - pm_err)
            if state is None:
                continue
            scores.known_calls += 1
            auto_err = abs(paths.estimates(state)["expected_remaining_calls"] - remaining)
            scores.abs_error += auto_err
            if not modelled and pm_err is not None:
                paired("mae:position_median", auto_err - pm_err)
            guess = baseline[i] if i < len(baseline) else 0.0
            scores.baseline_abs_error += abs(guess - remaining)
        scores.paired.append({k: (v[0], v[1]) for k, v in pair.items()})
    return scores
