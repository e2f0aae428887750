"""Held-out scores of a workflow section.

For every held-out workflow the session is replayed call by call through
:class:`synth.session.WorkflowPaths`:

* **next-agent top-1**: after each call but the last, is the most probable next agent the one
  that actually came next? A session that left the automaton scores a miss. Inside a fan-out
  group the next call is often a sibling whose existence depends on the group's (random)
  width, so ``step_top1_accuracy`` also scores, after each step, the most probable next step
  (symbol of the session automaton) against the step that followed.
* **remaining-calls MAE**: after each call, | expected remaining calls − calls that really
  followed |, over calls whose session is still on the automaton (``known_share`` says how
  many); ``baseline_mae`` is the same error for the position-only mean.
* **acceptance**: share of workflows whose whole sequence is accepted by the pruned PFA (step
  symbols), by the bounded regex parsed back into an NFA (calls), and by the session tracker
  (call by call on the counting session automaton: never left it and ended where the workflow
  may stop).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

from synth.pfa import PFA
from synth.session import WorkflowPaths
from synth.sequences import WorkflowSequence


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

    def add(self, other: "PathScores") -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def summary(self) -> dict:
        def ratio(a: float, b: float) -> float | None:
            return float(a / b) if b else None
        return {
            "next_agent": {"top1_accuracy": ratio(self.next_correct, self.next_total),
                           "n": self.next_total,
                           "step_top1_accuracy": ratio(self.step_correct, self.step_total),
                           "n_steps": self.step_total},
            "path": {"regex_acceptance": ratio(self.regex_accepted, self.workflows),
                     "pfa_acceptance": ratio(self.pfa_accepted, self.workflows),
                     "session_acceptance": ratio(self.session_accepted, self.workflows),
                     "n_workflows": self.workflows},
            "remaining_calls": {"mae": ratio(self.abs_error, self.known_calls),
                                "baseline_mae": ratio(self.baseline_abs_error,
                                                      self.known_calls),
                                "known_share": ratio(self.known_calls, self.calls),
                                "n": self.known_calls},
        }


def score_sequences(section: dict, sequences: Sequence[WorkflowSequence],
                    paths: WorkflowPaths | None = None) -> PathScores:
    """Replay held-out ``sequences`` against one workflow type's section."""
    paths = paths or WorkflowPaths.from_section(section)
    pfa = PFA.from_dict(section["pfa"])
    stepper = PFA.from_dict(section.get("session_pfa") or section["pfa"])
    baseline = section.get("remaining_calls_by_index", [])
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
        states = paths.track(seq.calls)
        last = states[-1] if states else paths.start()
        scores.session_accepted += paths.is_accepting(last)
        for i, state in enumerate(states):
            scores.calls += 1
            remaining = n - 1 - i
            if i < n - 1:
                scores.next_total += 1
                if state is not None:
                    nxt = paths.estimates(state)["next_agents"]
                    scores.next_correct += bool(nxt) and nxt[0]["agent_id"] == seq.calls[i + 1]
            if state is None:
                continue
            scores.known_calls += 1
            scores.abs_error += abs(paths.estimates(state)["expected_remaining_calls"]
                                    - remaining)
            guess = baseline[i] if i < len(baseline) else 0.0
            scores.baseline_abs_error += abs(guess - remaining)
    return scores
