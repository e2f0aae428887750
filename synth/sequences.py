"""Agent sequences per workflow, with fan-out groups kept as groups.

A workflow is a list of LLM calls ordered by arrival. Calls that run in parallel form one
*step* of the workflow, a fan-out group: two calls are in the same group when their lifetimes
overlap (one arrives before the other finished) or when they are siblings, i.e. they name the
same non-empty ``parent_request_ids``. Groups are the connected components of those two
relations. A group keeps its members as a sorted tuple of agents — the order in which parallel
calls happen to arrive carries no meaning, so none is invented — and its *width* (number of
calls). The automaton in :mod:`synth.pfa` reads one symbol per step: the sorted set of agents
in the group (``"explorer"``, or ``"reader|searcher"`` for a mixed group); the widths ride
along as counts on the transitions.

The call-level sequence (agents in arrival order) is kept as well: it is what a serving
session sees, one call at a time.

Two implementations of the grouping, with the same result: :func:`group_calls` (a sweep and a
union-find over one workflow's calls, in Python: tests, generators, small inputs) and the
set-based one behind :func:`load_sequences` / :func:`load_sequence_counts`, which forms the
groups in DuckDB with window functions so that reading a store of a million calls costs
about a second instead of twenty (see :func:`load_sequences`).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Iterable, Sequence

import duckdb

from synth.vomm import (MARK_SEP, NO_TOOL, NO_TOOL_MARK, STAGE_SEP, TOOL_MARK,  # noqa: F401
                        tool_mark, unmark)

#: Alphabets a call can be read in (:func:`symbol_expression`).
ALPHABETS = ("agent", "tool", "agent_tool", "agent_stage", "agent_stage_tool")

#: Two calls overlap when one arrives more than this many seconds before the other finished
#: (absorbs clock jitter between the gateway's finish stamp and the client's next request).
OVERLAP_TOLERANCE_S = 1e-3


@dataclass(frozen=True)
class Step:
    """One step of a workflow: a single call, or a fan-out group of parallel calls.

    ``symbol`` is what the automaton reads: the sorted distinct agents joined by ``|``.
    """

    agents: tuple[str, ...]  # sorted; one entry per call
    symbol: str = field(init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "symbol", "|".join(sorted(set(self.agents))))

    @property
    def width(self) -> int:
        return len(self.agents)


@dataclass(frozen=True)
class WorkflowSequence:
    """The calls of one workflow, as steps (for the automaton) and as arrivals (for sessions)."""

    workflow_type_id: str
    workflow_id: str
    steps: tuple[Step, ...]
    calls: tuple[str, ...]  # agent (or tool symbol) of every call, in arrival order
    request_ids: tuple[str, ...] = ()

    @property
    def step_symbols(self) -> tuple[str, ...]:
        return tuple(step.symbol for step in self.steps)

    @property
    def step_widths(self) -> tuple[int, ...]:
        return tuple(step.width for step in self.steps)


@dataclass(frozen=True)
class CallRow:
    """The fields of a ``calls`` row that sequence building needs."""

    request_id: str
    symbol: str
    t_arrival: float
    t_finish: float
    parent_request_ids: tuple[str, ...] | None = None


def group_calls(calls: Sequence[CallRow]) -> list[list[int]]:
    """Fan-out groups of one workflow's calls, as lists of indices into ``calls``.

    ``calls`` must be sorted by (t_arrival, request_id). A sweep over arrival times joins a call
    to the running group while it arrives before the group's latest finish (interval overlap);
    a union-find then also joins calls naming the same parents. Groups are returned ordered by
    their first arrival, members in arrival order.
    """
    parent = list(range(len(calls)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(i: int, j: int) -> None:
        ri, rj = find(i), find(j)
        if ri != rj:
            parent[max(ri, rj)] = min(ri, rj)

    group_start, group_end = 0, float("-inf")
    by_parents: dict[tuple[str, ...], int] = {}
    for i, call in enumerate(calls):
        if call.t_arrival < group_end - OVERLAP_TOLERANCE_S:
            union(group_start, i)
            group_end = max(group_end, call.t_finish)
        else:
            group_start, group_end = i, call.t_finish
        if call.parent_request_ids:
            key = tuple(sorted(call.parent_request_ids))
            if key in by_parents:
                union(by_parents[key], i)
            else:
                by_parents[key] = i
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(calls)):
        groups[find(i)].append(i)
    return sorted(groups.values(), key=lambda members: members[0])


def build_sequence(workflow_type_id: str, workflow_id: str, calls: Sequence[CallRow],
                   presorted: bool = False) -> WorkflowSequence:
    """Steps and call sequence of one workflow (``calls`` in any order, unless ``presorted``
    says they already are by (t_arrival, request_id))."""
    ordered = calls if presorted else sorted(calls, key=lambda c: (c.t_arrival, c.request_id))
    steps = tuple(Step(tuple(sorted(ordered[i].symbol for i in members)))
                  for members in group_calls(ordered))
    return WorkflowSequence(workflow_type_id, workflow_id, steps,
                            tuple(c.symbol for c in ordered),
                            tuple(c.request_id for c in ordered))


def sequences_from_symbols(symbol_lists: Iterable[Sequence[str | Sequence[str]]],
                           workflow_type_id: str = "wt") -> list[WorkflowSequence]:
    """Build sequences from plain Python lists (tests, benches).

    Each element of a list is an agent name (a single call) or a list/tuple of agent names (a
    fan-out group, listed in the order its calls arrived).
    """
    out = []
    for n, items in enumerate(symbol_lists):
        steps, calls = [], []
        for item in items:
            members = (item,) if isinstance(item, str) else tuple(item)
            steps.append(Step(tuple(sorted(members))))
            calls.extend(members)
        out.append(WorkflowSequence(workflow_type_id, f"w{n}", tuple(steps), tuple(calls)))
    return out


# -- store access (set-based) ----------------------------------------------------------------

#: Seeded sample of at most ``$max_workflows`` workflows per type: workflows ordered by
#: ``md5(workflow_id || salt)`` (a pseudo-random permutation fixed by the seed).
_SAMPLE_CTE = """
picked AS (
  SELECT workflow_type_id, workflow_id FROM (
    SELECT workflow_type_id, workflow_id,
           row_number() OVER (PARTITION BY workflow_type_id
                              ORDER BY md5(workflow_id || $salt), workflow_id) AS pick
    FROM (SELECT DISTINCT workflow_type_id, workflow_id FROM calls {where}))
  WHERE pick <= $max_workflows),
"""

#: Fan-out groups in SQL (see :func:`load_sequences`). ``starts`` = 1 when a call opens a new
#: overlap island: it arrives no earlier than (latest finish of the workflow's earlier calls
#: − tolerance); the running sum of ``starts`` numbers the islands. ``split`` lists the
#: workflows where siblings (same sorted non-empty parents, compared by hash: a collision can
#: only add a workflow to ``split``, never hide one) fall into different islands; those go to
#: Python's union-find with their raw calls (``split_calls``). ``per_wf`` holds every other
#: workflow as its calls in arrival order and its ``starts`` as a string of 0/1: the steps
#: are the runs that begin at each 1.
_STEPS_CTES = """
WITH {sample}
base AS (
  SELECT workflow_type_id AS wt, workflow_id AS wf, request_id AS rid, {symbol} AS symbol,
         t_arrival, t_finish, {group} AS grp,
         CASE WHEN len(parent_request_ids) > 0 THEN hash(list_sort(parent_request_ids))
         END AS pkey
  FROM calls {sample_join} {where}),
ordered AS (
  SELECT wt, wf, rid, symbol, pkey, grp, row_number() OVER w AS idx,
         CASE WHEN t_arrival < max(t_finish) OVER (w ROWS BETWEEN UNBOUNDED PRECEDING
                                                       AND 1 PRECEDING) - $tolerance
              THEN 0 ELSE 1 END AS starts
  FROM base WINDOW w AS (PARTITION BY wt, wf ORDER BY t_arrival, rid)),
islands AS MATERIALIZED (
  SELECT *, sum(starts) OVER (PARTITION BY wt, wf ORDER BY idx
                              ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS island
  FROM ordered),
split AS MATERIALIZED (
  SELECT DISTINCT wt, wf FROM islands WHERE pkey IS NOT NULL
  GROUP BY wt, wf, pkey HAVING min(island) < max(island)),
per_wf AS (
  SELECT wt, wf, list(symbol ORDER BY idx) AS calls,
         string_agg(starts::VARCHAR, '' ORDER BY idx) AS starts{rids},
         arg_min(grp, idx) AS grp
  FROM islands ANTI JOIN split USING (wt, wf)
  GROUP BY wt, wf),
split_calls AS (
  SELECT workflow_type_id AS wt, workflow_id AS wf,
         list({symbol} ORDER BY t_arrival, request_id) AS calls,
         list(request_id ORDER BY t_arrival, request_id) AS rids,
         list(t_arrival ORDER BY t_arrival, request_id) AS t_arr,
         list(t_finish ORDER BY t_arrival, request_id) AS t_fin,
         list(parent_request_ids ORDER BY t_arrival, request_id) AS parents,
         (list({group} ORDER BY t_arrival, request_id))[1] AS grp
  FROM calls JOIN split ON workflow_type_id = wt AND workflow_id = wf
  GROUP BY ALL)
"""

#: One row per workflow: wt, wf, workflows (1), calls, starts, rids, and for ``split``
#: workflows t_arr, t_fin, parents instead of starts.
_PER_WORKFLOW = """
SELECT wt, wf, 1, calls, starts, rids, NULL, NULL, NULL FROM per_wf
UNION ALL
SELECT wt, wf, 1, calls, NULL, rids, t_arr, t_fin, parents FROM split_calls
ORDER BY wt, wf
"""

#: One row per distinct workflow (same calls, same steps) with its first workflow id and its
#: multiplicity; ``split`` workflows one row each.
_DISTINCT = """
SELECT wt, min(wf), count(*), calls, starts, NULL, NULL, NULL, NULL
FROM per_wf GROUP BY wt, calls, starts
UNION ALL
SELECT wt, wf, 1, calls, NULL, rids, t_arr, t_fin, parents FROM split_calls
ORDER BY wt, 2
"""

#: :data:`_DISTINCT` with, last, the groups of the workflows each row stands for.
_DISTINCT_GROUPS = """
SELECT wt, min(wf), count(*), calls, starts, NULL, NULL, NULL, NULL, list(grp)
FROM per_wf GROUP BY wt, calls, starts
UNION ALL
SELECT wt, wf, 1, calls, NULL, rids, t_arr, t_fin, parents, [grp] FROM split_calls
ORDER BY wt, 2
"""


@lru_cache(maxsize=1 << 16)
def step_of(agents: tuple[str, ...]) -> Step:
    """The (shared, immutable) :class:`Step` of a sorted agent tuple: workflows repeat the same
    few steps, so each is built once."""
    return Step(agents)


def unmarked(seq: WorkflowSequence) -> WorkflowSequence:
    """``seq`` read in an ``agent_tool`` / ``agent_stage…`` alphabet, back in agents (steps
    re-sorted)."""
    steps = tuple(step_of(tuple(sorted(unmark(a) for a in st.agents))) for st in seq.steps)
    return WorkflowSequence(seq.workflow_type_id, seq.workflow_id, steps,
                            tuple(unmark(a) for a in seq.calls), seq.request_ids)


def has_tool_variation(con: duckdb.DuckDBPyConnection, workflow_type_id: str) -> bool:
    """Do some calls of this type call a tool and others not (the mark can say something)?"""
    columns = {row[0] for row in con.execute("DESCRIBE calls").fetchall()}
    if "tool_names" not in columns:
        return False
    row = con.execute("SELECT count(DISTINCT coalesce(len(list_filter(tool_names, "
                      "lambda x: coalesce(x, '') <> '')), 0) > 0) FROM calls "
                      "WHERE workflow_type_id = $wt", {"wt": workflow_type_id}).fetchone()
    return bool(row and row[0] > 1)


#: SQL over a ``calls`` row with an ``extra`` column: the call's ``stage`` (the flat record's
#: optional extension, kept in ``extra``; NULL when absent, empty or not a string, as
#: :func:`synth.vomm.stage_symbol` reads ``app_metadata.stage`` at serving).
STAGE_SQL = ("CASE WHEN json_type(extra, '$.stage') = 'VARCHAR' "
             "THEN nullif(json_extract_string(extra, '$.stage'), '') END")


def stage_expression(con: duckdb.DuckDBPyConnection) -> str:
    """:data:`STAGE_SQL`, or NULL where the store's ``calls`` has no ``extra`` column."""
    columns = {row[0] for row in con.execute("DESCRIBE calls").fetchall()}
    return STAGE_SQL if "extra" in columns else "NULL::VARCHAR"


def has_stage_variation(con: duckdb.DuckDBPyConnection, workflow_type_id: str) -> bool:
    """Can a call's stage say more than its agent: does some agent of this type run in two
    stages (a missing stage counts as one)? A stage that is a function of the agent adds
    nothing to an agent context, so it is not offered."""
    stage = stage_expression(con)
    if stage.startswith("NULL"):
        return False
    row = con.execute(f"SELECT count(*) FROM (SELECT agent_id FROM calls "
                      f"WHERE workflow_type_id = $wt GROUP BY agent_id "
                      f"HAVING count(DISTINCT coalesce({stage}, '')) > 1)",
                      {"wt": workflow_type_id}).fetchone()
    return bool(row and row[0] > 0)


def symbol_expression(con: duckdb.DuckDBPyConnection, alphabet: str) -> str:
    """SQL for the symbol of a call: ``agent_id``, the first tool run after it, or the agent
    with its stage (``agent_stage``: :func:`synth.vomm.stage_symbol`) and/or the mark of
    :func:`tool_mark` (``agent_tool``, ``agent_stage_tool``)."""
    if alphabet not in ALPHABETS:
        raise ValueError(f"alphabet must be one of {', '.join(ALPHABETS)}, got {alphabet!r}")
    columns = {row[0] for row in con.execute("DESCRIBE calls").fetchall()}
    if "parent_request_ids" not in columns:
        raise ValueError("table calls has no column parent_request_ids (see CONTRACTS §1)")
    if alphabet == "agent":
        return "agent_id"
    if alphabet.startswith("agent"):
        out = "agent_id"
        if "stage" in alphabet:
            stage = stage_expression(con)
            out = f"({out} || coalesce('{STAGE_SEP}' || {stage}, ''))"
        if not alphabet.endswith("_tool"):
            return out
        called = ("coalesce(len(list_filter(tool_names, lambda x: coalesce(x, '') <> '')), 0) > 0"
                  if "tool_names" in columns else "false")
        return (f"{out} || '{MARK_SEP}' || CASE WHEN {called} THEN '{TOOL_MARK}' "
                f"ELSE '{NO_TOOL_MARK}' END")
    tool = "tool_names[1]" if "tool_names" in columns else "NULL::VARCHAR"
    return f"coalesce(nullif({tool}, ''), '{NO_TOOL}')"


def workflow_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Number of workflows per workflow type in ``calls``."""
    return {wt: int(n) for wt, n in con.execute(
        "SELECT workflow_type_id, count(DISTINCT workflow_id) FROM calls GROUP BY 1").fetchall()}


def sampled_agent_counts(con: duckdb.DuckDBPyConnection, max_workflows: int | None = None,
                         seed: int = 0) -> dict[str, int]:
    """Per workflow type: how many distinct agents (NULL one of them) the calls of its sampled
    workflows hold, the sample :func:`load_sequence_counts` reads with the same
    ``max_workflows`` and ``seed``: the number of symbols its agent sequences would show, for
    the price of one grouping instead of the sequences' windows."""
    sample, join, params = "", "", {}
    if max_workflows is not None and max_workflows > 0:
        sample = "WITH " + _SAMPLE_CTE.format(where="").strip().rstrip(",")
        join = "SEMI JOIN picked USING (workflow_type_id, workflow_id)"
        params = {"salt": f"#{int(seed)}", "max_workflows": int(max_workflows)}
    rows = con.execute(f"{sample}\nSELECT workflow_type_id, count(DISTINCT agent_id) "
                       f"+ bool_or(agent_id IS NULL)::INTEGER FROM calls {join} GROUP BY 1",
                       params).fetchall()
    return {wt: int(n) for wt, n in rows}


def _query_rows(con: duckdb.DuckDBPyConnection, final: str, workflow_type_id: str | None,
                alphabet: str, max_workflows: int | None, seed: int,
                request_ids: bool, group: str = "NULL::VARCHAR") -> list[tuple]:
    symbol = symbol_expression(con, alphabet)
    where, sample, sample_join = "", "", ""
    params: dict = {"tolerance": OVERLAP_TOLERANCE_S}
    if workflow_type_id is not None:
        where, params["wt"] = "WHERE workflow_type_id = $wt", workflow_type_id
    if max_workflows is not None and max_workflows > 0:
        sample = _SAMPLE_CTE.format(where=where)
        sample_join = "SEMI JOIN picked USING (workflow_type_id, workflow_id)"
        params.update(salt=f"#{int(seed)}", max_workflows=int(max_workflows))
    ctes = _STEPS_CTES.format(
        sample=sample, sample_join=sample_join, where=where, symbol=symbol, group=group,
        rids=",\n         list(rid ORDER BY idx) AS rids" if request_ids else "")
    return con.execute(ctes + final, params).fetchall()


def _steps(calls: tuple[str, ...], starts: str) -> tuple[Step, ...]:
    """Steps of a workflow whose calls (arrival order) open a new step where ``starts`` has
    a ``1``: each run of calls, sorted, is one step."""
    cuts = [i for i, flag in enumerate(starts) if flag == "1"] + [len(calls)]
    return tuple(step_of(tuple(sorted(calls[a:b]))) for a, b in zip(cuts, cuts[1:]))


class _SequenceBuilder:
    """Turns result rows into :class:`WorkflowSequence` s; the steps of a (calls, starts)
    pair are cut once and reused (workflows repeat a few paths)."""

    def __init__(self) -> None:
        self._steps: dict[tuple[tuple[str, ...], str], tuple[Step, ...]] = {}

    def __call__(self, wt: str, wf: str, calls: list, starts: str | None, rids: list | None,
                 t_arr: list | None, t_fin: list | None, parents: list | None
                 ) -> WorkflowSequence:
        if starts is None:  # a ``split`` workflow: union-find
            rows = [CallRow(r, s, float(a), float(f), tuple(p) if p else None)
                    for r, s, a, f, p in zip(rids, calls, t_arr, t_fin, parents)]
            return build_sequence(wt, wf, rows, presorted=True)
        calls_t = tuple(calls)
        key = (calls_t, starts)
        steps = self._steps.get(key)
        if steps is None:
            steps = self._steps[key] = _steps(calls_t, starts)
        return WorkflowSequence(wt, wf, steps, calls_t, tuple(rids) if rids else ())


def load_sequences(con: duckdb.DuckDBPyConnection, workflow_type_id: str | None = None,
                   alphabet: str = "agent", max_workflows: int | None = None,
                   seed: int = 0) -> dict[str, list[WorkflowSequence]]:
    """Read the ``calls`` table into sequences, per workflow type (workflows by id).

    ``alphabet="agent"`` reads ``agent_id`` (what a serving session sees);
    ``alphabet="tool"`` reads the first tool run after each call (``tool_names[1]``, or
    :data:`NO_TOOL`) — useful when a single agent makes the agent sequence trivial.
    ``max_workflows`` (when > 0) keeps a seeded random sample of at most that many workflows
    per type, chosen in SQL (``md5(workflow_id || seed)`` order) before any row is read.

    Set-based: the fan-out groups of :func:`group_calls` are computed in DuckDB, so Python
    receives one row per workflow with its steps already formed. A sweep by arrival with a
    running maximum of ``t_finish`` gives the *overlap islands* (window functions: a call
    opens a new island when ``t_arrival >= max(t_finish of earlier calls) - tolerance``, the
    same test as the sweep in :func:`group_calls`; the running sum of those openings numbers
    the islands). Islands are intervals of the arrival order, so when every sibling set (same
    sorted non-empty ``parent_request_ids``) lies inside one island, the islands *are* the
    connected components of overlap ∪ siblings, and each aggregates to its sorted agents and
    width. Workflows where some sibling set spans several islands (siblings that do not
    overlap in time) are detected in SQL, and only their calls go to Python's union-find
    (:func:`build_sequence`): connected components have no set-based form in SQL. Both paths
    give the sequences :func:`build_sequence` gives.
    """
    out: dict[str, list[WorkflowSequence]] = defaultdict(list)
    build = _SequenceBuilder()
    for wt, wf, _, *rest in _query_rows(con, _PER_WORKFLOW, workflow_type_id, alphabet,
                                        max_workflows, seed, request_ids=True):
        out[wt].append(build(wt, wf, *rest))
    return dict(out)


def load_sequence_counts(con: duckdb.DuckDBPyConnection, workflow_type_id: str | None = None,
                         alphabet: str = "agent", max_workflows: int | None = None,
                         seed: int = 0) -> dict[str, tuple[list[WorkflowSequence], list[int]]]:
    """Like :func:`load_sequences`, but identical workflows (same steps, same calls) are
    collapsed in SQL: per type, (distinct sequences, how many workflows each stands for).

    Sequences come in the order of their first workflow id, the order in which
    :func:`load_sequences` first meets them; each carries that workflow's id and no request
    ids. This is what fitting needs (:func:`synth.fit.fit_sequences` with ``counts``): Python
    touches one row per distinct path instead of one per workflow.
    """
    return {wt: (seqs, counts) for wt, (seqs, counts, _) in _distinct_rows(
        con, workflow_type_id, alphabet, max_workflows, seed, None).items()}


def load_sequence_groups(con: duckdb.DuckDBPyConnection, group: str | None,
                         workflow_type_id: str | None = None, alphabet: str = "agent",
                         max_workflows: int | None = None, seed: int = 0
                         ) -> dict[str, tuple[list[WorkflowSequence], list[int],
                                              list[dict[str, int]] | None]]:
    """:func:`load_sequence_counts` with, per distinct sequence, how many of its workflows
    belong to each group: ``group`` is SQL over a ``calls`` row
    (:func:`store.split.call_group_sql`, ``profiler fit --group-by``) and a workflow's group is
    its first call's. The selection folds of :func:`synth.sequence_select.select_models` deal
    these groups whole. ``group`` None (no ``--group-by``): the groups are None, every workflow
    its own unit."""
    rows = _distinct_rows(con, workflow_type_id, alphabet, max_workflows, seed, group)
    if group is None:
        return {wt: (seqs, counts, None) for wt, (seqs, counts, _) in rows.items()}
    return rows


def _distinct_rows(con: duckdb.DuckDBPyConnection, workflow_type_id: str | None, alphabet: str,
                   max_workflows: int | None, seed: int, group: str | None
                   ) -> dict[str, tuple[list[WorkflowSequence], list[int], list[dict[str, int]]]]:
    """Distinct sequences per type, their counts and (with ``group``) their groups' counts."""
    if group is None:
        rows = [(*r, ()) for r in _query_rows(con, _DISTINCT, workflow_type_id, alphabet,
                                              max_workflows, seed, request_ids=False)]
    else:
        rows = _query_rows(con, _DISTINCT_GROUPS, workflow_type_id, alphabet, max_workflows,
                           seed, request_ids=False, group=group)
    merged: dict[str, dict[tuple, list]] = defaultdict(dict)
    build = _SequenceBuilder()
    for wt, wf, n, *rest, grps in rows:
        seq = build(wt, wf, *rest)
        if rest[1] is None:  # a union-find workflow: drop its request ids, merge duplicates
            seq = WorkflowSequence(wt, wf, seq.steps, seq.calls)
        entry = merged[wt].setdefault((seq.steps, seq.calls), [wf, seq, 0, Counter()])
        if wf < entry[0]:
            entry[0], entry[1] = wf, seq
        entry[2] += int(n)
        entry[3].update(grps)
    out = {}
    for wt, entries in merged.items():
        ordered = sorted(entries.values(), key=lambda e: e[0])
        out[wt] = ([e[1] for e in ordered], [e[2] for e in ordered],
                   [dict(sorted(e[3].items())) for e in ordered])
    return out
