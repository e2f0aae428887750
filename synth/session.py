"""Serving-time view of one workflow type's paths: O(1) session tracking and estimates.

Everything is precomputed at fit time (:mod:`synth.chain`) and stored in
``profile.json["workflows"][wt]``; loading turns the stored tables into Python lists and dicts
so that :meth:`WorkflowPaths.advance` and :meth:`WorkflowPaths.estimates` are one list index
and one dict lookup each. A session state is a small int (0 = before the first call).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
from scipy import sparse

#: A session's position: an index into the precomputed session table.
PathState = int


class WorkflowPaths:
    """Dominant paths of one workflow type, as loaded from its profile section.

    Attributes: ``regex`` (bounded regex over agent names, fan-out groups written with their
    width), ``prompt_templates`` (agent → template with ``${req_k:request|response:[a,b]}``
    placeholders), ``train_acceptance`` (share of training workflows the pruned automaton
    accepts), ``agents``.
    """

    def __init__(self, section: dict):
        self.section = section
        self.regex: str = section.get("regex", "")
        self.train_acceptance: float = float(section.get("train_acceptance", 0.0))
        prompts = section.get("prompt_composition") or {}
        self.prompt_templates: dict[str, str] = dict(prompts.get("templates", {}))
        session = section["session"]
        self._next: list[dict[str, int]] = [dict(d) for d in session["next"]]
        self._estimates: list[dict] = list(session["estimates"])
        self._chain_state: list[int] = list(session["chain_state"])
        self._accepting: list[bool] = list(session.get("accepting", []))
        chain = section["chain"]
        self.agents: list[str] = list(chain["agents"])
        self._chain_rows = chain["rows"]
        self._projection_cache: dict[int, np.ndarray] = {}
        self._matcher = None

    @classmethod
    def from_section(cls, section: dict) -> "WorkflowPaths":
        """Load from ``profile.json["workflows"][wt]``."""
        return cls(section)

    # -- per call (hot path) ----------------------------------------------------------------
    def start(self) -> PathState:
        """The state before any call of a session."""
        return 0

    def advance(self, state: PathState | None, agent_id: str) -> PathState | None:
        """State after one more call by ``agent_id`` (calls in arrival order, fan-out siblings
        included); None once the session has left the pruned automaton."""
        if state is None:
            return None
        try:
            return self._next[state].get(agent_id)
        except (IndexError, TypeError):
            return None

    def estimates(self, state: PathState) -> dict:
        """Precomputed estimates at ``state`` (shared object: read, do not modify).

        ``next_agents`` (agent and probability that the next call is theirs, descending),
        ``p_end`` (probability that no call follows), ``expected_remaining_calls`` (calls after
        the ones seen), ``expected_remaining_s`` (seconds from the arrival of the last seen
        call to the end of the workflow: its own latency and tool time plus everything after;
        from the start state, the whole workflow), ``expected_distance`` (agent → expected
        number of calls until that agent's next call, for agents reached with p >= 0.01).
        """
        return self._estimates[state]

    # -- fleet view -------------------------------------------------------------------------
    def _projection(self, horizon: int) -> np.ndarray:
        """``Σ_{t<H} Q^t R``: expected calls per agent within H calls, per chain state."""
        if horizon not in self._projection_cache:
            n, k = len(self._chain_rows), len(self.agents)
            entries = [(c, target, agent_index, p) for c, row in enumerate(self._chain_rows)
                       for agent_index, target, p in row]
            cs, ts, ais, ps = zip(*entries) if entries else ((), (), (), ())
            q = sparse.csr_matrix((ps, (cs, ts)), shape=(n, n))
            r = sparse.csr_matrix((ps, (cs, ais)), shape=(n, k)).toarray()
            acc, power = np.zeros((n, k)), r
            for _ in range(horizon):
                acc += power
                power = q @ power
            self._projection_cache[horizon] = acc
        return self._projection_cache[horizon]

    def project_calls(self, states: Iterable[PathState | None], horizon: int) -> dict[str, float]:
        """Expected calls per agent over the next ``horizon`` calls of each live session,
        summed over sessions (None states — sessions off the automaton — are skipped)."""
        if horizon <= 0:
            return {a: 0.0 for a in self.agents}
        counts = np.zeros(len(self._chain_rows))
        for state in states:
            if state is not None and 0 <= state < len(self._chain_state):
                counts[self._chain_state[state]] += 1
        total = counts @ self._projection(int(horizon))
        return {a: float(v) for a, v in zip(self.agents, total)}

    # -- offline helpers --------------------------------------------------------------------
    def is_accepting(self, state: PathState | None) -> bool:
        """May the workflow end at ``state`` (a complete path of the pruned automaton)?"""
        if state is None or not 0 <= state < len(self._accepting):
            return False
        return self._accepting[state]

    def track(self, agents: Sequence[str]) -> list[PathState | None]:
        """States after each call of a whole call sequence."""
        state, out = self.start(), []
        for agent in agents:
            state = self.advance(state, agent)
            out.append(state)
        return out

    def regex_accepts(self, agents: Sequence[str]) -> bool:
        """Does :attr:`regex`, parsed back into an automata-lib NFA, accept this sequence?"""
        if self._matcher is None:
            from synth.regex_synth import RegexMatcher
            self._matcher = RegexMatcher(self.regex)
        return self._matcher.accepts(agents)
