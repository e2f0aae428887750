"""Choose the sequence model and the remaining-work model by cross-validation by workflow.

The training workflows of one type are split into ``folds`` folds (identical workflows are
separate workflows: their multiplicity is spread over the folds), or, with ``groups``
(``profiler fit --group-by``), whole groups of workflows (a task's trials) are dealt to the
folds and a distinct path's count is split by group (:func:`group_fold_counts`); every fold
is held out once while the others train. For each held-out call the candidates predict

* **the next symbol** (an agent, or END after the last call): the variable-order model
  (:class:`synth.vomm.VariableOrderMarkov`) for every context family (plain agents; where the
  log says whether responses called tools, agents marked with it; where it records stages, agents
  with their stage, and both) × ``min_context`` (sparse
  contexts skipped) × ``escape`` × ``max_order`` of the grid, each mixed with the automaton
  fitted on the same training folds, ``p = λ·p_vomm + (1 − λ)·p_pfa`` while the session is on
  the automaton (``p_vomm`` alone once it left it), for every λ of the grid. The model alone
  (what a session off the automaton gets) is chosen by the one-standard-error rule on the mean
  held-out log-loss ``−log p(actual)`` (the simplest within one paired standard error of the
  best: the fewest parts read (plain agents, then tool mark or stage, then both), then the
  shortest order), then the λ with the
  smallest log-loss of the mixture;
* **the remaining calls** (:class:`synth.remaining.RemainingWork`) for every ``order`` ×
  ``position`` × ``min_n`` × point (median or mean), over the agents and, where the log records
  stages, over the agents with their stages: among the candidates that beat the position
  median (``order = 0``, median) by more than z standard errors of the paired per-workflow
  difference (z ≥ 2, Bonferroni over the context families compared), the simplest within one
  paired standard error of the best mean absolute error (:func:`_choose_remaining`).

At most ``max_workflows`` workflows (a seeded multinomial sample of the distinct paths by
their counts) take part, which keeps the cost flat on large stores; the fit itself then uses
every training workflow.
"""
from __future__ import annotations

from statistics import NormalDist
from typing import Callable, Mapping, Sequence

import numpy as np

from store.folds import group_folds, paired_se
from synth.remaining import RemainingWork
from synth.vomm import (END, FAMILY_PARTS, VariableOrderMarkov, families_of, family_rank,
                        project_all, strip_tool_mark)

ORDERS = (1, 2, 3, 4, 6, 8)
ESCAPES = (0.5, 1.0, 2.0)
#: Sparse-context backoff: contexts with fewer training observations are skipped (see
#: :mod:`synth.vomm`); 1 keeps every context.
MIN_CONTEXTS = (1.0, 3.0, 10.0)
#: Context families of the next-symbol model: plain agents, or agents marked with whether
#: their response called a tool (only where the log says so); with stage labels also the
#: agent with its stage, and both (:data:`synth.vomm.FAMILY_PARTS`).
CONTEXTS = ("agent", "agent_tool")
MIXTURES = (1.0, 0.75, 0.5, 0.25, 0.0)
REMAINING_ORDERS = (0, 1, 2, 3, 4, 6, 8)
REMAINING_POSITIONS = ("none", "bucket")
REMAINING_MIN_N = (1, 3, 10)
#: Point predictions scored: the median (best in-sample MAE) or the mean (steadier when the
#: held-out workflows' lengths drift from the training ones); column in the table rows.
REMAINING_POINTS = {"p50": 1, "mean": 3}
EPS = 1e-6
#: How many standard errors a remaining-work candidate must beat the position median by, at
#: least; with F context families (order × position) compared the bar is the Bonferroni one,
#: z = Φ⁻¹(1 − FAMILY_ALPHA / (2F)), so that the best of many near-equal families does not win
#: by chance (winner's curse).
SE_FACTOR = 2.0
FAMILY_ALPHA = 0.05
#: Remaining-work validation: folds and repeats (different fold draws), pooled; repeated
#: only below ``REPEAT_BELOW`` workflows, where one draw of folds is noisy.
REMAINING_FOLDS = 5
REMAINING_REPEATS = 2
REPEAT_BELOW = 300
#: The time-ordered validation slice: the last 20 % of a type's training workflows by start
#: time (``profiler fit`` counts them per path); used when it holds at least
#: ``FORWARD_MIN`` workflows (fewer switch on noise: 8 held-out Magentic-One sessions did).
FORWARD_SHARE = 0.2
FORWARD_MIN = 20
#: The position-median baseline among the remaining-work candidates.
BASE_REMAINING = (0, REMAINING_POSITIONS[0], REMAINING_MIN_N[0], "p50")

#: ``pfa_factory(indices, counts) -> callable(history) -> {symbol: p} | None``: the automaton
#: fitted on ``counts[k]`` copies of the training path ``indices[k]`` (indices into the
#: ``sequences`` given to :func:`select_models`); the callable returns None off the automaton.
#: Supplied by :mod:`synth.fit` so that this module needs no automaton code.
PfaFactory = Callable[[Sequence[int], Sequence[int]], Callable]


def fold_counts(counts: Sequence[int], folds: int, seed: int = 0) -> np.ndarray:
    """``out[j, f]``: how many of the ``counts[j]`` workflows of path j fall in fold f (a
    seeded shuffle of all workflows dealt round-robin)."""
    counts = np.asarray(counts, dtype=np.int64)
    owner = np.repeat(np.arange(len(counts)), counts)
    rng = np.random.default_rng(seed)
    rng.shuffle(owner)
    out = np.zeros((len(counts), folds), dtype=np.int64)
    np.add.at(out, (owner, np.arange(len(owner)) % folds), 1)
    return out


def group_fold_counts(groups: Sequence[Mapping[str, int]], folds: int, seed: int = 0) -> np.ndarray:
    """``out[j, f]``: how many of path j's workflows fall in fold f when whole *groups* are
    dealt to the folds (``groups[j][g]``: how many of path j's workflows belong to group g, a
    task run in several workflows): a seeded shuffle of the distinct groups dealt round-robin
    (:func:`store.folds.group_folds`), so that a held-out fold never shares a task with its
    training folds. A path whose workflows belong to several groups is split between their
    folds."""
    fold_of = group_fold_of(groups, folds, seed)
    out = np.zeros((len(groups), folds), dtype=np.int64)
    for j, m in enumerate(groups):
        for g, n in m.items():
            out[j, fold_of[g]] += n
    return out


def group_fold_of(groups: Sequence[Mapping[str, int]], folds: int, seed: int = 0) -> dict[str, int]:
    """The fold of every group id of ``groups`` (:func:`group_fold_counts` deals them so)."""
    names = sorted({g for m in groups for g in m})
    return dict(zip(names, (int(f) for f in group_folds(names, folds, seed))))


def _clusters(row_groups: Sequence[Mapping[str, float]] | None) -> np.ndarray | None:
    """Groups × rows membership matrix of :func:`store.folds.paired_se` (None: no groups)."""
    if row_groups is None:
        return None
    names = sorted({g for m in row_groups for g in m})
    at = {g: i for i, g in enumerate(names)}
    out = np.zeros((len(names), len(row_groups)))
    for r, m in enumerate(row_groups):
        for g, n in m.items():
            out[at[g], r] += n
    return out


def subsample(counts: Sequence[int], max_workflows: int, seed: int = 0) -> np.ndarray:
    """Counts of a seeded sample of at most ``max_workflows`` workflows (without replacement)."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if max_workflows <= 0 or total <= max_workflows:
        return counts
    rng = np.random.default_rng(seed)
    return rng.multivariate_hypergeometric(counts, max_workflows)


def subsample_groups(groups: Sequence[Mapping[str, int]], max_workflows: int,
                     seed: int = 0) -> list[dict[str, int]]:
    """:func:`subsample` over the (path, group) cells: each sampled workflow keeps its group."""
    cells = [(j, g, n) for j, m in enumerate(groups) for g, n in sorted(m.items())]
    sub = subsample([n for _, _, n in cells], max_workflows, seed)
    out: list[dict[str, int]] = [{} for _ in groups]
    for (j, g, _), n in zip(cells, sub.tolist()):
        if n:
            out[j][g] = n
    return out


def _folds_of(counts: np.ndarray, groups: Sequence[Mapping[str, int]] | None, folds: int,
              seed: int) -> np.ndarray:
    """The path × fold counts: by workflow (:func:`fold_counts`), or by group."""
    return fold_counts(counts, folds, seed) if groups is None else group_fold_counts(groups, folds, seed)


def select_models(sequences: Sequence[Sequence[str]], counts: Sequence[int],
                  pfa_factory: PfaFactory | None = None, folds: int = 3,
                  max_workflows: int = 1000, seed: int = 0,
                  contexts: Sequence[Sequence[str]] | None = None,
                  context_alphabet: str = "agent_tool",
                  groups: Sequence[Mapping[str, int]] | None = None,
                  forward: Sequence[int] | None = None) -> dict:
    """Cross-validated choice of the next-symbol model and the remaining-work model.

    ``contexts`` (optional; one context symbol per call of each sequence, read in
    ``context_alphabet``: the agent with the mark of whether its response called a tool,
    :func:`synth.sequences.tool_mark`, and/or its stage, :func:`synth.vomm.stage_symbol`) adds
    the context families that alphabet offers (:func:`synth.vomm.families_of`) to the
    next-symbol candidates. With tool marks every held-out target is scored twice, as it is
    served: at the previous call's arrival (its own mark unknown; its stage known) and after
    that call's response (:mod:`synth.vomm`); the plain-agent family predicts the same at both.
    With stages the remaining-work candidates also read the agents with their stages
    (``alphabet = "agent_stage"``; a call's stage is known when it is annotated).

    Returns ``{"next": {max_order, escape, min_context, context, mixture, validation_log_loss,
    best_candidates…}, "remaining": {order, position, min_n, point, validation_mae,
    position_median_mae…}, "folds", "workflows"}``; with fewer than ``folds`` workflows the
    defaults (order 3, no automaton mixing; the position median) come back with ``"reason"``.

    ``groups`` (optional; ``profiler fit --group-by``): ``groups[j]`` maps a group id (a task
    run in several workflows) to how many of path j's ``counts[j]`` workflows belong to it.
    The folds then deal whole groups (:func:`group_fold_counts`), in the order-and-context
    selection and in the remaining-work one: repeated trials of one task that took the same
    path no longer sit on both sides of a fold, where they would reward the longest contexts
    (a held-out trial's exact path is in training). Without it the folds deal workflows.

    ``forward`` (optional): ``forward[j]`` of path j's workflows are among the last
    :data:`FORWARD_SHARE` of the type's training workflows by start time. Every candidate is
    then also trained on the earlier ones and scored on those (a time-ordered validation
    slice), and the cross-validated choice gives way where that slice shows it behind a
    candidate beyond one paired standard error (:func:`_forward_next`, :func:`_forward_remaining`):
    a richer context that wins in shuffled folds but not forward in time is not served.
    """
    keep, sub, gsub = _sampled(counts, groups, max_workflows, seed)
    seqs = [tuple(sequences[j]) for j in keep]
    ctxs = [tuple(contexts[j]) for j in keep] if contexts is not None else None
    families = (families_of(context_alphabet) if ctxs is not None else CONTEXTS[:1])
    # each family's context symbols (the parts it does not read dropped)
    fam_ctx = {fam: project_all(ctxs, fam) for fam in families[1:]} if ctxs is not None else {}
    marked_families = [fam for fam in families if FAMILY_PARTS[fam][1]]
    stage_seqs = fam_ctx.get("agent_stage")
    total = int(sub.sum())
    n_units, units = _cv_units(sub, gsub)
    if n_units < max(folds, 2):
        reason = f"{n_units} {units}: too few to cross-validate"
        return {"next": {"max_order": 3, "escape": 1.0, "mixture": 1.0, "min_context": 1.0,
                         "context": "agent", "reason": reason},
                "remaining": {"order": 0, "position": "none", "min_n": 1, "point": "p50",
                              "reason": reason}}
    split = _folds_of(sub, gsub, folds, seed)
    grid = [(fam, order, escape, floor) for fam in families for floor in MIN_CONTEXTS
            for escape in ESCAPES for order in ORDERS]

    def score(train: np.ndarray, test: np.ndarray) -> tuple | None:
        """Every candidate trained on ``train`` counts and scored on ``test`` counts:
        (summed log-loss, hits, per-path log-loss of the model alone, events, agent events)."""
        n_cfg = len(grid)
        loss = np.zeros((n_cfg, len(MIXTURES)))
        hits = np.zeros((n_cfg, len(MIXTURES)))
        wf_loss = np.zeros((len(seqs), n_cfg))
        events = agent_events = 0.0
        lams = np.array(MIXTURES)
        tr = np.flatnonzero(train)
        te = np.flatnonzero(test)
        if len(tr) == 0 or len(te) == 0:
            return None
        tr_seqs, tr_w = [seqs[j] for j in tr], train[tr].tolist()
        models = {"agent": VariableOrderMarkov(max_order=max(ORDERS)).fit(tr_seqs, tr_w)}
        for fam, fctx in fam_ctx.items():
            models[fam] = VariableOrderMarkov(max_order=max(ORDERS)).fit(
                tr_seqs, tr_w, [fctx[j] for j in tr])
        vocab = models["agent"].vocab_
        for fam, model in models.items():
            assert model.vocab_ == vocab  # same targets, same order
        pfa = pfa_factory(keep[tr].tolist(), tr_w) if pfa_factory is not None else None
        index = {y: i for i, y in enumerate(vocab)}
        memo: dict[tuple, np.ndarray] = {}
        scored_memo: dict[tuple, tuple] = {}

        def scored(history_by_family: dict, pv: np.ndarray | None, actual: int | None,
                   agent_step: bool) -> tuple[np.ndarray, np.ndarray | None]:
            """One held-out event's log-loss per (candidate, mixture) and, at an agent step, its
            top-1 hits: a function of the last symbols, the automaton's vector and the target,
            so an event held-out paths share is computed once."""
            vkey = tuple((fam, tuple(h[-max(ORDERS):]), len(h) <= max(ORDERS))
                         for fam, h in history_by_family.items())
            key = (vkey, None if pv is None else pv.tobytes(), actual, agent_step)
            if key in scored_memo:
                return scored_memo[key]
            if vkey not in memo:
                memo[vkey] = _vomm_vectors(models, history_by_family, families)
            vecs = memo[vkey]
            mixed = (lams[:, None, None] * vecs[None]
                     + ((1.0 - lams)[:, None, None] * pv if pv is not None else 0.0))
            if pv is None:
                mixed = np.broadcast_to(vecs[None], mixed.shape)
            if actual is not None:
                p = mixed[..., actual]
            else:  # a symbol the training folds never saw: the novel-symbol mass
                novel = np.maximum(1.0 - vecs.sum(axis=-1), 0.0)[None]
                p = (lams[:, None] if pv is not None else np.ones((len(lams), 1))) * novel
            step = -np.log(np.maximum(p, EPS)).T
            # top-1 over agents, as profiler eval scores it
            hit = (np.argmax(mixed[..., :-1], axis=-1) == actual).T if agent_step else None
            scored_memo[key] = (step, hit)
            return step, hit
        for j in te:
            seq, w = seqs[j], float(test[j])
            targets = (*seq, END)
            for t in range(len(seq) + 1):
                history = seq[:t]
                p_pfa = pfa(history) if pfa is not None else None
                actual = index.get(targets[t])
                pv = None
                if p_pfa is not None:
                    pv = np.zeros(len(vocab))
                    for sym, p in p_pfa.items():
                        if sym in index:
                            pv[index[sym]] += p
                # the histories a session holds when it predicts targets[t]: at the previous
                # call's arrival and, with tool marks, after its response
                moments = [{"agent": history}]
                if fam_ctx:
                    after = {"agent": history}
                    arrival = {"agent": history}
                    for fam, fctx in fam_ctx.items():
                        marked = fctx[j][:t]
                        after[fam] = marked
                        arrival[fam] = ((*marked[:-1], strip_tool_mark(marked[-1])) if t
                                        else ())
                    # a call's stage is known at its arrival, its tool mark only after its
                    # response: without tool marks both moments are one
                    moments = [arrival, after] if marked_families else [after]
                for hist in moments:
                    step, hit = scored(hist, pv, actual, t < len(seq))
                    events += w
                    loss += w * step
                    wf_loss[j] += w * step[:, 0]
                    if hit is not None:
                        agent_events += w
                        hits += w * hit
        return loss, hits, wf_loss, events, agent_events

    n_cfg = len(grid)
    loss = np.zeros((n_cfg, len(MIXTURES)))
    hits = np.zeros((n_cfg, len(MIXTURES)))
    wf_loss = np.zeros((len(seqs), n_cfg))  # model alone, per distinct workflow (one-SE rule)
    events = agent_events = 0.0
    for f in range(folds):
        out = score(split.sum(axis=1) - split[:, f], split[:, f])
        if out is not None:
            loss += out[0]
            hits += out[1]
            wf_loss += out[2]
            events += out[3]
            agent_events += out[4]
    chosen_next = _choose_next(loss, hits, events, agent_events, pfa_factory is not None,
                               grid, wf_loss, sub, gsub)
    late = _forward_counts(forward, keep, counts, sub)
    if late is not None:
        out = score(sub - late, late)
        if out is not None:
            chosen_next = _forward_next(chosen_next, out, late, grid, wf_loss, sub, gsub,
                                        pfa_factory is not None)
    return {"next": chosen_next,
            "remaining": _remaining_cv(seqs, sub, REMAINING_FOLDS,
                                       REMAINING_REPEATS if total < REPEAT_BELOW else 1, seed,
                                       stage_seqs, gsub, late),
            "folds": folds, "workflows": total,
            **({"groups": n_units} if gsub is not None else {})}


def _sampled(counts: Sequence[int], groups: Sequence[Mapping[str, int]] | None, max_workflows: int,
             seed: int) -> tuple[np.ndarray, np.ndarray, list[dict[str, int]] | None]:
    """A seeded sample of at most ``max_workflows`` workflows: the indices of the paths it
    keeps, their counts and (with ``groups``) their groups' counts (:func:`subsample`,
    :func:`subsample_groups`)."""
    if groups is None:
        sub, gsub = subsample(counts, max_workflows, seed), None
    else:
        _check_groups(groups, counts)
        gsub = subsample_groups(groups, max_workflows, seed)
        sub = np.array([sum(m.values()) for m in gsub], dtype=np.int64)
    keep = np.flatnonzero(sub)
    return keep, sub[keep], None if gsub is None else [gsub[j] for j in keep]


def _cv_units(sub: np.ndarray, gsub: Sequence[Mapping[str, int]] | None) -> tuple[int, str]:
    """How many units the folds deal and what they are: workflows, or whole groups."""
    if gsub is None:
        return int(sub.sum()), "workflows"
    return len({g for m in gsub for g in m}), "groups of workflows"


def _check_groups(groups: Sequence[Mapping[str, int]], counts: Sequence[int]) -> None:
    """``groups[j]`` must split ``counts[j]`` exactly."""
    if len(groups) != len(counts) or any(sum(m.values()) != int(n) or min(m.values(), default=0) < 0
                                         for m, n in zip(groups, counts)):
        raise ValueError("groups must split every path's count among its groups")


def select_remaining(sequences: Sequence[Sequence[str]], counts: Sequence[int],
                     max_workflows: int = 1000, seed: int = 0,
                     groups: Sequence[Mapping[str, int]] | None = None) -> dict:
    """The remaining-work choice of :func:`select_models` alone, for another alphabet of the
    same workflows (tool names where a workflow type has a single agent); ``groups`` as
    there."""
    keep, sub, gsub = _sampled(counts, groups, max_workflows, seed)
    seqs = [tuple(sequences[j]) for j in keep]
    total = int(sub.sum())
    n_units, units = _cv_units(sub, gsub)
    if n_units < REMAINING_FOLDS:
        return {"order": 0, "position": "none", "min_n": 1, "point": "p50",
                "reason": f"{n_units} {units}: too few to cross-validate"}
    return _remaining_cv(seqs, sub, REMAINING_FOLDS,
                         REMAINING_REPEATS if total < REPEAT_BELOW else 1, seed, groups=gsub)


def is_position_median(choice: Mapping) -> bool:
    """Is this remaining-work choice the position-median baseline itself (no context, median)?"""
    return choice.get("order") == 0 and choice.get("point") == "p50"


def _remaining_cv(seqs: Sequence[tuple], counts: np.ndarray, folds: int, repeats: int,
                  seed: int, stage_seqs: Sequence[tuple] | None = None,
                  groups: Sequence[Mapping[str, int]] | None = None,
                  late: np.ndarray | None = None) -> dict:
    """Remaining-work candidates scored by ``repeats`` × ``folds``-fold CV by workflow, or by
    group with ``groups`` (no
    automaton is fitted here, so repeating is cheap and steadies the choice on small data).

    ``stage_seqs`` (the same workflows read in the ``agent_stage`` alphabet) adds candidates
    whose context is the agents with their stages: keys ``(order, position, min_n, point,
    "agent_stage")``, order ≥ 1 (order 0 reads no symbol: the agent candidates' own)."""
    cands = [(order, pos, min_n, point) for order in REMAINING_ORDERS
             for pos in REMAINING_POSITIONS for min_n in REMAINING_MIN_N
             for point in REMAINING_POINTS]
    alphabets = {"agent": seqs}
    if stage_seqs is not None:
        alphabets["agent_stage"] = stage_seqs
        cands += [(order, pos, min_n, point, "agent_stage") for order in REMAINING_ORDERS[1:]
                  for pos in REMAINING_POSITIONS for min_n in REMAINING_MIN_N
                  for point in REMAINING_POINTS]
    col = {c: i for i, c in enumerate(cands)}
    # each (alphabet, position) table scores these columns, in this order
    columns = {(alpha, pos): np.array([col[(order, pos, min_n, point, *tag)]
                                       for order in REMAINING_ORDERS[1 if tag else 0:]
                                       for min_n in REMAINING_MIN_N for point in REMAINING_POINTS])
               for alpha in alphabets for tag in [() if alpha == "agent" else (alpha,)]
               for pos in REMAINING_POSITIONS}

    def score(train: np.ndarray, test: np.ndarray) -> tuple[list[int], list[np.ndarray], float]:
        """Every candidate fitted on ``train`` counts: the held-out paths of ``test``, each
        one's summed absolute errors, and the calls scored (unweighted per path)."""
        tr = np.flatnonzero(train)
        if len(tr) == 0:
            return [], [], 0.0
        tr_w = train[tr].tolist()
        rem = {(alpha, pos): RemainingWork(max(REMAINING_ORDERS), pos, 1).fit(
                   [aseqs[j] for j in tr], tr_w)
               for alpha, aseqs in alphabets.items() for pos in REMAINING_POSITIONS}
        memo: dict[tuple, np.ndarray] = {}

        def predicted(alpha: str, pos: str, seq: tuple, i: int) -> np.ndarray:
            """The point of every candidate column of model (alpha, pos) after call i of
            ``seq`` (in ``columns[alpha, pos]`` order); held-out paths share most contexts."""
            model = rem[alpha, pos]
            ctx = seq[max(0, i + 1 - model.order):i + 1]
            key = (alpha, pos, ctx, i)
            if key not in memo:
                keys = model.keys(ctx, i)
                rows = [model.table_.get(k) for k in keys]
                m = len(keys) - 1  # context keys, longest first, then the position
                out = []
                for order in REMAINING_ORDERS[0 if alpha == "agent" else 1:]:
                    for min_n in REMAINING_MIN_N:
                        for row in rows[m - min(order, m):m]:
                            if row is not None and row[0] >= min_n:
                                break
                        else:
                            row = rows[m] or [0.0] * 5
                        out.extend(row[c] for c in REMAINING_POINTS.values())
                memo[key] = np.array(out, dtype=float)
            return memo[key]
        paths, rows_err, n_calls = [], [], 0.0
        for j in np.flatnonzero(test):
            w = float(test[j])
            n = len(seqs[j])
            row_err = np.zeros(len(cands))  # this workflow's errors
            for i in range(n):
                n_calls += w
                truth = n - 1 - i
                for alpha, pos in rem:
                    row_err[columns[alpha, pos]] += np.abs(
                        predicted(alpha, pos, alphabets[alpha][j], i) - truth)
            paths.append(int(j))
            rows_err.append(row_err)
        return paths, rows_err, n_calls

    errors: list[np.ndarray] = []   # one row per held-out (repeat, path): summed abs errors
    weights: list[float] = []       # how many identical workflows the row stands for
    row_groups: list[dict[str, int]] | None = None if groups is None else []   # the row's groups
    calls = 0.0
    for r in range(repeats):
        split = _folds_of(counts, groups, folds, seed + 1 + r)
        fold_of = None if groups is None else group_fold_of(groups, folds, seed + 1 + r)
        for f in range(folds):
            test = split[:, f]
            paths, rows_err, n_calls = score(split.sum(axis=1) - test, test)
            calls += n_calls
            for j, row_err in zip(paths, rows_err):
                errors.append(row_err)
                weights.append(float(test[j]))
                if row_groups is not None:
                    row_groups.append({g: k for g, k in groups[j].items() if fold_of[g] == f})
    out = _choose_remaining(cands, np.array(errors), np.array(weights), calls, repeats,
                            _clusters(row_groups))
    out.update(folds=folds, repeats=repeats)
    if late is not None:
        paths, rows_err, n_calls = score(counts - late, late)
        if paths:
            out = _forward_remaining(out, cands, np.array(rows_err),
                                     late[paths].astype(float), n_calls)
    return out


def _forward_remaining(cv: dict, cands: Sequence[tuple], errors: np.ndarray,
                       weights: np.ndarray, calls: float) -> dict:
    """The served remaining-work choice, checked forward in time: on the time-ordered slice
    (``errors[r, c]``, summed absolute errors of held-out path r standing for ``weights[r]``
    workflows) the candidates are the position median, the cross-validated choice and every
    median over the last k agents (no position, any ``min_n``). The cross-validated choice
    stays unless it is behind the slice's best of them by more than one paired standard
    error; then the simplest (shortest context) within one standard error of that best."""
    index = {c: i for i, c in enumerate(cands)}
    alphabet = () if cv.get("alphabet", "agent") == "agent" else (cv["alphabet"],)
    chosen = (cv["order"], cv["position"], cv["min_n"], cv["point"], *alphabet)
    pool = {BASE_REMAINING, chosen} | {c for c in cands if len(c) == 4 and c[1] == "none"
                                       and c[3] == "p50"}
    total = weights @ errors
    mae = {c: float(total[index[c]]) for c in pool}
    best = min(pool, key=lambda c: (mae[c], c[0]))

    def behind(c: tuple) -> bool:
        if c == best:
            return False
        mean, se = paired_se((errors[:, index[c]] - errors[:, index[best]]) / weights, weights)
        return mean > se
    served = chosen
    if behind(chosen):
        served = min((c for c in pool if not behind(c)), key=lambda c: (c[0], -c[2], mae[c]))
    out = dict(cv)
    if served != chosen:
        out.update(order=served[0], position=served[1], min_n=served[2], point=served[3],
                   cv_choice={"order": chosen[0], "position": chosen[1], "min_n": chosen[2],
                              "point": chosen[3]})
        if "alphabet" in cv:  # the pool's medians read the plain agents
            out["alphabet"] = "agent"
    out["forward"] = {"workflows": int(weights.sum()),
                      "served": "cv" if served == chosen else "forward",
                      "mae": {"position_median": round(mae[BASE_REMAINING] / calls, 5),
                              "cv_choice": round(mae[chosen] / calls, 5),
                              "served": round(mae[served] / calls, 5)}}
    return out


def _forward_counts(forward: Sequence[int] | None, keep: np.ndarray, counts: Sequence[int],
                    sub: np.ndarray) -> np.ndarray | None:
    """The time-ordered slice's counts per kept path, scaled like the sample (``sub``); None
    when there is none or it holds fewer than :data:`FORWARD_MIN` workflows or leaves fewer
    than that to train on."""
    if forward is None:
        return None
    full = np.asarray(counts, dtype=float)[keep]
    late = np.minimum(sub, np.rint(np.asarray(forward, dtype=float)[keep] * sub
                                   / np.maximum(full, 1.0))).astype(np.int64)
    if late.sum() < FORWARD_MIN or (sub - late).sum() < FORWARD_MIN:
        return None
    return late


def _forward_next(cv: dict, fwd: tuple, late: np.ndarray, grid: Sequence[tuple],
                  cv_wf_loss: np.ndarray,
                  weights: np.ndarray, groups: Sequence[Mapping[str, int]] | None,
                  with_pfa: bool) -> dict:
    """The served next-symbol choice, checked forward in time.

    The candidates are the models alone within one paired standard error of the best in the
    shuffled folds (what the folds cannot tell apart: Markov-1 among them wherever it is
    close). The cross-validated choice ``cv`` stays unless, on the time-ordered slice
    (``fwd``: :func:`select_models`' ``score`` on it, ``late[j]`` workflows of path j), one of them is ahead of it by more than
    one paired standard error; then the one with the smallest slice log-loss, with the mixture
    weight best on the slice. Both figures are recorded under ``forward``. A candidate that
    only wins on the slice (where a release or new agents made every model poor) is not taken:
    the folds must agree it is as good."""
    loss, hits, wf_loss, events, agent_events = fwd
    w = weights.astype(float)
    cv_total = cv_wf_loss.sum(axis=0)
    cv_best = int(np.argmin(cv_total))
    clusters = _clusters(groups)

    def close_in_cv(c: int) -> bool:
        if c == cv_best:
            return True
        mean, se = paired_se((cv_wf_loss[:, c] - cv_wf_loss[:, cv_best]) / np.maximum(w, 1e-12),
                             w, clusters)
        return mean <= se
    c = grid.index((cv["context"], cv["max_order"], cv["escape"], cv["min_context"]))
    pool = [k for k in range(len(grid)) if k == c or close_in_cv(k)]
    f_total = loss[:, 0] / max(events, 1e-12)
    best = min(pool, key=lambda k: (f_total[k], k))
    rows = late > 0
    diff = (wf_loss[rows, c] - wf_loss[rows, best]) / late[rows]
    mean, se = paired_se(diff, late[rows].astype(float))
    held = bool(best == c or mean <= se)
    info = {"workflows": int(late.sum()), "share": FORWARD_SHARE,
            "candidates": len(pool),
            "cv_choice_log_loss": round(float(f_total[c]), 5),
            "best_log_loss": round(float(f_total[best]), 5),
            "served": "cv" if held else "forward",
            "cv_choice": {k: cv[k] for k in ("context", "max_order", "escape", "min_context",
                                             "mixture")}}
    out = dict(cv)
    if not held:
        fam, order, escape, floor = grid[best]
        mixtures = MIXTURES if with_pfa else MIXTURES[:1]
        m = min(range(len(mixtures)), key=lambda i: loss[best, i])
        out.update(context=fam, max_order=order, escape=escape, min_context=floor,
                   mixture=mixtures[m], cv_validation_log_loss=cv.get("validation_log_loss"),
                   validation_log_loss=round(float(loss[best, m] / max(events, 1e-12)), 5),
                   validation_top1=round(float(hits[best, m] / max(agent_events, 1e-12)), 5))
    out["forward"] = info
    return out


def _vomm_vectors(models: Mapping[str, VariableOrderMarkov], histories: Mapping[str, Sequence[str]],
                  families: Sequence[str]) -> np.ndarray:
    """One probability vector per candidate of the grid (family, min_context, escape, order),
    in grid order (rows): one pass of :meth:`VariableOrderMarkov.level_grid` per family gives
    every min_context × escape × order (the level-k vector is the order-k model's prediction)."""
    return np.concatenate([
        models[fam].level_grid(histories[fam], max(ORDERS), ESCAPES, MIN_CONTEXTS)[:, :, list(ORDERS)]
        .reshape(-1, len(models[fam].vocab_)) for fam in families])


def _choose_next(loss: np.ndarray, hits: np.ndarray, events: float, agent_events: float,
                 with_pfa: bool, grid: Sequence[tuple], wf_loss: np.ndarray,
                 weights: np.ndarray, groups: Sequence[Mapping[str, int]] | None = None) -> dict:
    """The next-symbol model by the one-standard-error rule: among the models alone (mixture
    1, what a session off the automaton gets) within one standard error (paired by held-out
    workflow, or by group with ``groups``: :func:`store.folds.paired_se`) of the smallest
    validation log-loss, the simplest (plain agents before tool context, then the shortest
    order, then the smallest loss); then its mixture weight."""
    mixtures = MIXTURES if with_pfa else MIXTURES[:1]
    cands = []
    for c, (fam, order, escape, floor) in enumerate(grid):
        for m, lam in enumerate(mixtures):
            cands.append({"context": fam, "max_order": order, "escape": escape,
                          "min_context": floor, "mixture": lam, "index": c,
                          "log_loss": round(float(loss[c, m] / events), 5),
                          "top1": round(float(hits[c, m] / max(agent_events, 1e-12)), 5)})
    alone = [d for d in cands if d["mixture"] == 1.0]
    best = min(alone, key=lambda d: d["log_loss"])
    w = weights.astype(float)
    n = float(w.sum())
    per_event = events / max(n, 1e-12)  # scored events per workflow (the loss unit below)

    clusters = _clusters(groups)

    def within_one_se(d: dict) -> bool:
        if d["index"] == best["index"] or n < 2:
            return d["index"] == best["index"]
        diff = (wf_loss[:, d["index"]] - wf_loss[:, best["index"]]) / np.maximum(w, 1e-12)
        mean, se = paired_se(diff, w, clusters)
        return mean <= se
    first = min((d for d in alone if within_one_se(d)),
                key=lambda d: (family_rank(d["context"]), d["max_order"], d["log_loss"]))
    chosen = min((d for d in cands if d["index"] == first["index"]),
                 key=lambda d: d["log_loss"])
    top = sorted(cands, key=lambda d: d["log_loss"])[:5]
    return {**{k: chosen[k] for k in ("max_order", "escape", "min_context", "context",
                                      "mixture")},
            "validation_log_loss": chosen["log_loss"], "validation_top1": chosen["top1"],
            "best_log_loss": best["log_loss"], "events_per_workflow": round(per_event, 3),
            "rule": "one standard error (paired by held-out workflow) of the best log-loss: "
                    "the simplest (plain agents, then shortest order)",
            "best_candidates": [{k: v for k, v in d.items() if k != "index"} for d in top],
            "pfa_only_log_loss": (min(d["log_loss"] for d in cands if d["mixture"] == 0.0)
                                  if with_pfa else None)}


def _choose_remaining(cands: Sequence[tuple], errors: np.ndarray, weights: np.ndarray,
                      calls: float, repeats: int, clusters: np.ndarray | None = None) -> dict:
    """The remaining-work candidate, honestly chosen on small logs.

    1. *Beats the position median beyond noise*: a candidate is eligible when its paired
       per-workflow difference to the position median is below zero by more than z standard
       errors, z = Φ⁻¹(1 − α / 2F) (at least :data:`SE_FACTOR`) with F the number of candidate
       *families* compared (context order × position: the point and ``min_n`` variants of one
       family are near-copies, so counting them as independent tests, as a Bonferroni bar over
       every candidate did, asked a 29 % validation gain for z = 3.4 and threw it away).
    2. *One standard error*: among the eligible, the simplest (shortest context, no position,
       median, largest ``min_n``) whose MAE is within one paired standard error of the best
       eligible one. No eligible candidate: the position median itself.

    The standard errors are over held-out workflows, or, with ``clusters`` (groups × rows:
    how many of row r's workflows belong to group g; ``profiler fit --group-by``), over groups
    (:func:`store.folds.paired_se`): many trials of one task are one piece of evidence.
    """
    # ``errors[r, c]``: abs errors summed over held-out row r's calls (one workflow standing
    # for ``weights[r]`` identical ones); a workflow is held out once per repeat
    workflows = float(weights.sum()) / repeats
    total = weights @ errors
    err = {c: float(total[i]) for i, c in enumerate(cands)}
    index = {c: i for i, c in enumerate(cands)}
    scores = sorted((e / calls, key) for key, e in err.items())
    base_key = BASE_REMAINING
    families = {(k[0], k[1], *k[4:]) for k in err} - {(base_key[0], base_key[1])}
    z = max(SE_FACTOR, NormalDist().inv_cdf(1 - FAMILY_ALPHA / (2 * max(len(families), 1))))

    def paired(key: tuple, ref: tuple) -> tuple[float, float]:
        """Mean and standard error of the per-workflow difference key − ref."""
        d = errors[:, index[key]] - errors[:, index[ref]]
        return paired_se(d, weights / repeats, None if clusters is None else clusters / repeats)

    def eligible(key: tuple) -> bool:
        if key == base_key or workflows < 2:
            return False
        mean, se = paired(key, base_key)
        return mean + z * se < 0.0
    winners = [(m, k) for m, k in scores if eligible(k)]
    if not winners:
        mae, chosen = err[base_key] / calls, base_key
    else:
        best_mae, best = winners[0]
        close = [(m, k) for m, k in winners
                 if k == best or paired(k, best)[0] <= paired(k, best)[1]]
        mae, chosen = min(close, key=lambda mk: (len(mk[1]) > 4, mk[1][0], mk[1][1] != "none",
                                                 mk[1][3] != "p50", -mk[1][2], mk[0]))
    order, pos, min_n, point = chosen[:4]
    baseline = err[base_key] / calls
    out = {"order": order, "position": pos, "min_n": min_n, "point": point,
           "validation_mae": round(mae, 5), "position_median_mae": round(baseline, 5),
           "z": round(z, 3), "families": len(families),
           "rule": "candidates better than the position median by more than "
                   f"{z:.2f} paired standard errors (Bonferroni over {len(families)} "
                   "context families); the simplest within one standard error of the best",
           "best_candidates": [{"order": k[0], "position": k[1], "min_n": k[2],
                                "point": k[3], **({"alphabet": k[4]} if len(k) > 4 else {}),
                                "mae": round(s, 5)} for s, k in scores[:5]]}
    if any(len(k) > 4 for k in cands):  # stage candidates were offered: say which alphabet won
        out["alphabet"] = chosen[4] if len(chosen) > 4 else "agent"
    return out
