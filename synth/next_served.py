"""Which next-agent prediction a workflow type serves: ours, a Markov baseline, or a blend.

This module is what serving reads (numpy only); the choice is made at fit time by
:mod:`synth.next_select`.

The fitted variable-order model (``ours``, chosen by cross-validation and the time-ordered
slice, :mod:`synth.sequence_select`) is one candidate among the baselines ``profiler eval``
scores it against — ``markov1``, ``markov_vo``, ``markov_wb``, computed by
:class:`synth.markov_baselines.BaselinePredictor` itself — and convex blends
``w·ours + (1 − w)·markov_wb`` (:data:`BLEND_WEIGHTS`): a blend's log-loss is never much worse
than either part's. Each candidate is a distribution over the training symbols (END included)
plus the mass of an agent never seen (:func:`candidate_vector`); its top-1 is its most probable
agent (:func:`ranked`). :class:`synth.session.WorkflowPaths` serves the chosen one's next
agents and their probabilities, so ``profiler eval`` scores exactly what the ``Predictor``
serves; the annotation's ``p_end`` stays ours (the session-end rule and keep/drop were tuned on
it, and eval scores the next agent after every call but the last).

The candidates in :data:`CANDIDATES` are listed simplest first: the three baselines, then the
blends from the most baseline to the most ours, then ours (the order
:func:`synth.next_select.select_served` breaks ties in).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from synth.markov_baselines import MARKOV_BASELINES, UNSEEN, BaselinePredictor

#: Weights of ours in the blends with ``markov_wb`` offered.
BLEND_WEIGHTS = (0.75, 0.5, 0.25)
#: Candidate names, simplest first: the tie-break of :func:`synth.next_select.select_served`.
CANDIDATES = (*MARKOV_BASELINES, *(f"blend_{w}" for w in sorted(BLEND_WEIGHTS)), "ours")
#: Smallest probability listed among the next agents (as :mod:`synth.session` lists them).
MIN_NEXT_P = 1e-3


def blend_weight(name: str) -> float | None:
    """Ours' weight in a blend candidate's name (None for the others)."""
    return float(name.split("_", 1)[1]) if name.startswith("blend_") else None


def baseline_of(name: str) -> str | None:
    """The baseline a candidate reads (``markov_wb`` for a blend; None for ours)."""
    return "markov_wb" if blend_weight(name) is not None else (name if name in MARKOV_BASELINES else None)


def mix_automaton(p: np.ndarray, novel: float, auto: Mapping[str, float] | None, weight: float,
                  index_of: Callable[[str], int | None]) -> tuple[np.ndarray, float]:
    """Our model's next-symbol vector ``p`` (over its vocabulary, END last) and novel-agent mass
    ``novel`` mixed with the session automaton's next symbols ``auto`` ({symbol: p}, END
    included; None once the session left it): ``λ·p + (1 − λ)·p_auto``, a symbol our model
    never saw dropped, and ``λ·novel``, λ = ``weight`` (the validated mixture). Serving
    (:class:`synth.session.WorkflowPaths`) and the forward check of the served candidate
    (:mod:`synth.next_select`) both mix through here, so the check scores what is served."""
    if auto is None:
        return p, novel
    mixed = weight * p
    for symbol, q in auto.items():
        i = index_of(symbol)
        if i is not None:
            mixed[i] += (1.0 - weight) * q
    return mixed, min(weight, 1.0) * novel


def candidate_vector(name: str, ours: np.ndarray, ours_novel: float, vocab: Sequence[str],
                     base: BaselinePredictor | None, history: Sequence[str]) -> np.ndarray:
    """Candidate ``name``'s probabilities over ``vocab`` (END last) and, in the last slot, of an
    agent never seen in training. ``ours``: our vector over ``vocab`` (mixed with the automaton
    where served so), ``ours_novel`` its novel-agent mass; ``history``: the session's agents so
    far (what the baselines read)."""
    if name == "ours":
        return np.append(ours, ours_novel)
    dist = base.distribution(baseline_of(name), history)
    vec = np.array([dist.get(y, 0.0) for y in vocab] + [dist[UNSEEN]])
    w = blend_weight(name)
    return vec if w is None else w * np.append(ours, ours_novel) + (1.0 - w) * vec


def ranked(name: str, vec: np.ndarray, vocab: Sequence[str], base: BaselinePredictor | None,
           history: Sequence[str]) -> list[tuple[str, float]]:
    """The agents of ``vec`` (:func:`candidate_vector`) most probable first (ties by name),
    those below :data:`MIN_NEXT_P` left out; a baseline served alone lists its own top-1 first
    (among equals it may break a tie otherwise), so that its top-1 is what eval scores."""
    out = sorted(((a, float(q)) for a, q in zip(vocab[:-1], vec[:-2]) if q >= MIN_NEXT_P),
                 key=lambda aq: (-aq[1], aq[0]))
    if name in MARKOV_BASELINES:
        top = base.top1(name, history)
        if top is not None and (not out or out[0][0] != top):
            at = {a: i for i, (a, _) in enumerate(out)}
            q = out.pop(at[top])[1] if top in at else float(vec[list(vocab).index(top)])
            out.insert(0, (top, q))
    return out


def probability_of(vec: np.ndarray, vocab_index: Mapping[str, int], symbol: str) -> float:
    """``symbol``'s probability in ``vec`` (an agent never seen: the novel slot)."""
    i = vocab_index.get(symbol)
    return float(vec[-1] if i is None else vec[i])
