"""The served next-agent candidate of a workflow type, chosen forward in time at fit time.

The candidates (:data:`synth.next_served.CANDIDATES`): ours (the model chosen by
cross-validation and the time-ordered slice, :mod:`synth.sequence_select`), the Markov
baselines ``profiler eval`` scores it against, and convex blends of ours with ``markov_wb``.

**Rolling origins on the training side** (:func:`select_served`). The type's training
workflows are cut by start time into :data:`ROLLING_BUCKETS` slices; for each of the last
:data:`ROLLING_TESTS` slices every candidate is fitted on the slices before it (our model with
the chosen order, escape, context family and automaton mixture; the baselines by
:func:`synth.markov_baselines.fit_baselines`) and scored on it as served at each call's arrival:
top-1 and log-loss of the next agent after every call but the last, as ``profiler eval`` scores.
A candidate is *behind* another when their paired per-workflow difference over the pooled slices
is worse beyond one standard error, on either figure.

**The rule** (:func:`_choose`): the simplest candidate behind no other (baselines first, then
the blends nearest the baselines, ours last: where ours is not ahead beyond noise, the simpler
one is served). Where every candidate is behind some other (the two figures disagree: on the
messy workload a Laplace-smoothed ``markov_vo`` has the least log-loss forward and ours the best
top-1), the blend of ours and ``markov_wb`` (weights 0 and 1 included) of least forward
log-loss: a convex blend is never much worse than either part, and the smoothed baseline is
among them. (Keeping ours' top-1 instead — only blends not behind ours on top-1 — left messy's
log-loss behind ``markov_wb`` on its future: +0.036 ± 0.006.) Fewer than :data:`ROLLING_MIN`
test workflows: ours, unchecked.
"""
from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np

from store.folds import paired_se
from synth.markov_baselines import BaselinePredictor, fit_baselines
from synth.next_served import (CANDIDATES, blend_weight, candidate_vector, mix_automaton, probability_of,
                               ranked)
from synth.sequence_select import EPS, subsample
from synth.vomm import VariableOrderMarkov, project_all, strip_tool_mark

#: Start-time slices of a type's training workflows and how many of the last are test slices.
ROLLING_BUCKETS = 5
ROLLING_TESTS = 3
#: Pooled test workflows below which the choice is not made (``ours`` is served).
ROLLING_MIN = 20


def _rolling_cells(counts: Sequence[int], buckets: Sequence[Mapping[int, int]],
                   max_workflows: int, seed: int) -> tuple[list[int], list[int], list[int]]:
    """(path, bucket, count) cells of a seeded sample of at most ``max_workflows`` workflows."""
    cells = [(j, b, n) for j, m in enumerate(buckets) for b, n in sorted(m.items()) if n]
    sub = subsample([n for *_, n in cells], max_workflows, seed)
    keep = [(j, b, int(n)) for (j, b, _), n in zip(cells, sub.tolist()) if n]
    return [c[0] for c in keep], [c[1] for c in keep], [c[2] for c in keep]


def select_served(calls: Sequence[Sequence[str]], counts: Sequence[int],
                  buckets: Sequence[Mapping[int, int]] | None, chosen: Mapping,
                  contexts: Sequence[Sequence[str]] | None = None,
                  pfa_factory: Callable | None = None, max_workflows: int = 1000,
                  seed: int = 0) -> dict:
    """The served next-agent candidate of one type (module docstring): ``{"candidate", ...}``
    with the pooled rolling-origin figures of every candidate.

    ``calls[j]``: path j's agents; ``buckets[j]``: how many of its ``counts[j]`` workflows fall
    in each start-time slice (0 earliest); ``chosen``: the next-agent model's parameters
    (``context``, ``max_order``, ``escape``, ``min_context``, ``mixture``); ``contexts``: the
    paths' context symbols (read in ``chosen["context"]`` at each call's arrival);
    ``pfa_factory`` as :func:`synth.sequence_select.select_models` takes it (the automaton
    mixed in when ``mixture`` < 1)."""
    if buckets is None:
        return {"candidate": "ours", "reason": "no start times"}
    paths, slices, weights = _rolling_cells(counts, buckets, max_workflows, seed)
    first_test = ROLLING_BUCKETS - ROLLING_TESTS
    tested = sum(w for b, w in zip(slices, weights) if b >= first_test)
    if tested < ROLLING_MIN:
        return {"candidate": "ours", "reason": f"{tested} workflows in the rolling test slices",
                "test_workflows": tested}
    family = chosen.get("context", "agent")
    marked = (project_all(contexts, family) if family != "agent" and contexts is not None
              else None)
    lam = float(chosen.get("mixture", 1.0))
    rows_loss: list[np.ndarray] = []
    rows_hits: list[np.ndarray] = []
    rows_w: list[float] = []
    rows_events: list[float] = []
    for origin in range(first_test, ROLLING_BUCKETS):
        train = [(j, w) for j, b, w in zip(paths, slices, weights) if b < origin]
        test = [(j, w) for j, b, w in zip(paths, slices, weights) if b == origin]
        if not train or not test:
            continue
        tr_idx, tr_w = [j for j, _ in train], [w for _, w in train]
        model = VariableOrderMarkov(max_order=chosen["max_order"], escape=chosen["escape"],
                                    min_context=chosen.get("min_context", 1.0)).fit(
            [calls[j] for j in tr_idx], tr_w,
            [marked[j] for j in tr_idx] if marked is not None else None)
        base = BaselinePredictor(fit_baselines([calls[j] for j in tr_idx], tr_w))
        pfa = pfa_factory(tr_idx, tr_w) if pfa_factory is not None and lam < 1.0 else None
        vocab = model.vocab_
        index = {y: i for i, y in enumerate(vocab)}
        memo: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        for j, w in test:
            seq = calls[j]
            loss, hits = np.zeros(len(CANDIDATES)), np.zeros(len(CANDIDATES))
            for t in range(1, len(seq)):
                history = seq[:t]
                ctx = ((*marked[j][:t - 1], strip_tool_mark(marked[j][t - 1]))
                       if marked is not None else history)
                auto = pfa(history) if pfa is not None else None
                key = (tuple(history[-8:]), len(history) <= 8, tuple(ctx[-model.max_order:]),
                       len(ctx) <= model.max_order,
                       None if auto is None else tuple(sorted(auto.items())), seq[t])
                if key not in memo:
                    p, novel = mix_automaton(model.predict_proba(ctx), model.novel_probability(ctx),
                                             auto, lam, index.get)
                    step_loss, step_hit = np.zeros(len(CANDIDATES)), np.zeros(len(CANDIDATES))
                    for c, name in enumerate(CANDIDATES):
                        vec = candidate_vector(name, p, novel, vocab, base, history)
                        step_loss[c] = -math.log(max(probability_of(vec, index, seq[t]), EPS))
                        top = ranked(name, vec, vocab, base, history)
                        step_hit[c] = bool(top) and top[0][0] == seq[t]
                    memo[key] = (step_loss, step_hit)
                step_loss, step_hit = memo[key]
                loss += step_loss
                hits += step_hit
            rows_loss.append(loss)
            rows_hits.append(hits)
            rows_w.append(float(w))
            rows_events.append(float(len(seq) - 1))
    return _choose(np.array(rows_loss), np.array(rows_hits), np.array(rows_w),
                   np.array(rows_events))


def _choose(loss: np.ndarray, hits: np.ndarray, w: np.ndarray, events: np.ndarray) -> dict:
    """The simplest candidate behind no other beyond one paired standard error on log-loss or
    top-1. Rows: held-out paths (``loss[r, c]``, ``hits[r, c]`` summed over one workflow's
    ``events[r]`` scored calls), row r standing for ``w[r]`` identical workflows. None such:
    the blend of ours and ``markov_wb`` (weights 0 and 1 included) of least log-loss."""
    n = len(CANDIDATES)
    per = {"log_loss": loss, "top1": hits}
    worst = np.full(n, -np.inf)   # the largest deficit (in standard errors) of each candidate
    for metric, sign in (("log_loss", 1.0), ("top1", -1.0)):
        for c in range(n):
            for d in range(n):
                if c == d:
                    continue
                mean, se = paired_se(sign * (per[metric][:, c] - per[metric][:, d]), w)
                worst[c] = max(worst[c], mean / max(se, 1e-9))   # equal candidates: 0
    clear = [c for c in range(n) if worst[c] <= 1.0]
    # CANDIDATES are simplest first. None behind no other (the two figures disagree): the
    # convex blend of ours and markov_wb (weights 0 and 1 included) of least log-loss
    blends = [c for c, name in enumerate(CANDIDATES) if name in ("markov_wb", "ours")
              or blend_weight(name) is not None]
    pick = min(clear) if clear else min(blends, key=lambda c: (float(w @ loss[:, c]), c))
    total, scored = float(w.sum()), float(w @ events)
    return {"candidate": CANDIDATES[pick],
            "rule": ("the simplest candidate behind no other beyond one paired standard error "
                     "(log-loss or top-1) on rolling origins forward in time" if clear else
                     "every candidate behind another: the blend of ours and markov_wb (weights 0 "
                     "and 1 included) of least log-loss on rolling origins forward in time"),
            "test_workflows": int(total),
            "behind_none": [CANDIDATES[c] for c in clear],
            "test_calls": int(scored),
            "log_loss": {name: round(float(w @ loss[:, c]) / max(scored, 1.0), 5)
                         for c, name in enumerate(CANDIDATES)},
            "top1": {name: round(float(w @ hits[:, c]) / max(scored, 1.0), 5)
                     for c, name in enumerate(CANDIDATES)}}
