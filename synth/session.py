"""Serving-time view of one workflow type's paths: O(1) session tracking and estimates.

Everything is precomputed at fit time (:mod:`synth.chain`) and stored in
``profile.json["workflows"][wt]``; loading turns the stored tables into Python lists and dicts
so that :meth:`WorkflowPaths.advance` and :meth:`WorkflowPaths.estimates` are one list index
and one dict lookup each. A session state is a small int (0 = before the first call).
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from synth.markov_baselines import VO_ORDER, BaselinePredictor
from synth.next_served import baseline_of, candidate_vector, mix_automaton, ranked
from synth.remaining import RemainingWork
from synth.vomm import END, FAMILY_PARTS, VariableOrderMarkov, project

#: A session's position: an index into the precomputed session table.
PathState = int
#: Context predictions cached per workflow type (cleared when full).
PREDICT_CACHE = 8192
#: Next agents listed in a prediction (most probable first; the smallest probability listed
#: is :data:`synth.next_served.MIN_NEXT_P`).
MAX_NEXT_AGENTS = 10


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
        model = section.get("sequence_model")
        self.vomm: VariableOrderMarkov | None = (
            VariableOrderMarkov.from_dict(model["vomm"]) if model else None)
        self.mixture: float = float(model.get("mixture", 1.0)) if model else 0.0
        #: What the sequence model's context reads: "agent" (the session's agents),
        #: "agent_tool" (each finished call's agent marked with whether its response called a
        #: tool, :func:`synth.sequences.tool_mark`; the call in flight plain), "agent_stage"
        #: (each call's agent with its stage, :func:`synth.vomm.stage_symbol`) or
        #: "agent_stage_tool" (both).
        self.context_alphabet: str = (model or {}).get("context", "agent")
        #: The next-agent candidate served (:mod:`synth.next_served`): "ours" (the model
        #: above), a Markov baseline ("markov1", "markov_vo", "markov_wb") or a blend of ours
        #: with "markov_wb" ("blend_<weight of ours>"); chosen forward in time at fit time.
        self.served_next: str = ((model or {}).get("served") or {}).get("candidate", "ours")
        self._base: BaselinePredictor | None = None
        if self.served_next != "ours":
            if section.get("baselines"):
                self._base = BaselinePredictor(section["baselines"])
            else:
                self.served_next = "ours"
        remaining = section.get("remaining_model")
        self.remaining: RemainingWork | None = (
            RemainingWork.from_dict(remaining) if remaining else None)
        #: Symbols the remaining-work model reads: "agent" (the session's agents), "tool"
        #: (the first tool of each call, for single-agent types; see synth.profile_section)
        #: or "agent_stage" (each call's agent with its stage).
        self.remaining_alphabet: str = (remaining or {}).get("alphabet", "agent")
        #: A tool-alphabet model fit before issue 26 read each call's *own* tool, which no
        #: session knows when the call is annotated: it is served (and scored) without tools,
        #: i.e. as the position median, as it always was served.
        self._tools_servable: bool = (remaining or {}).get("tool_context") == "previous"
        self._predict_cache: dict[tuple, dict] = {}

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

    @property
    def reads_tools(self) -> bool:
        """Does a model read what the calls' responses called (tool marks, tool names)?"""
        return (FAMILY_PARTS.get(self.context_alphabet, (False, False))[1]
                or self.remaining_alphabet == "tool")

    @property
    def reads_stage(self) -> bool:
        """Does a model read the calls' stages (``app_metadata.stage``)?"""
        return (FAMILY_PARTS.get(self.context_alphabet, (False, False))[0]
                or self.remaining_alphabet == "agent_stage")

    @property
    def reads_context(self) -> bool:
        """Does a model read context symbols (stages or tool marks) beyond the agents?"""
        return self.context_alphabet != "agent" or self.remaining_alphabet == "agent_stage"

    def _read(self, context: Sequence[str], family: str, order: int) -> tuple[str, ...]:
        """The last ``order`` context symbols, read in ``family`` (parts it does not use
        dropped: a stage the model was fit without, a tool mark it cannot read)."""
        tail = context[len(context) - order:] if len(context) > order else context
        return tuple(project(c, family) for c in tail)

    @property
    def has_sequence_model(self) -> bool:
        """Does this section predict off the automaton too (variable-order model)?"""
        return self.vomm is not None

    def context_order(self) -> int:
        """How many of the last symbols :meth:`predict` reads."""
        orders = [0]
        if self.vomm is not None:
            orders.append(self.vomm.max_order)
            base = baseline_of(self.served_next)
            if base is not None:   # the baseline served reads the last agents too
                orders.append(1 if base == "markov1" else VO_ORDER)
        if self.remaining is not None:
            orders.append(self.remaining.order)
        return max(orders)

    def predict(self, state: PathState | None, history: Sequence[str],
                tools: Sequence[str] | None = None) -> dict | None:
        """:meth:`predict_at` with the whole history of the session's calls."""
        return self.predict_at(state, history, len(history), tools)

    def predict_at(self, state: PathState | None, tail: Sequence[str],
                   n_calls: int, tools: Sequence[str] | None = None,
                   context: Sequence[str] | None = None) -> dict | None:
        """Estimates after ``n_calls`` calls whose last ones are ``tail`` (the whole history
        when shorter than :meth:`context_order`, else at least that many); ``state`` is the
        automaton state (None off the automaton).

        With a sequence model (sections fitted with selection): ``next_agents`` and ``p_end``
        from the variable-order model, mixed with the automaton's while on it
        (``p = λ·p_vomm + (1 − λ)·p_pfa``, λ chosen by validation) — ``next_agents`` as the
        served candidate (:attr:`served_next`: ours, a Markov baseline or a blend) gives them,
        ``p_end`` always ours (the session-end rule and keep/drop read it); remaining calls from the
        context model: ``expected_remaining_calls`` (mean), ``remaining_calls_p50`` /
        ``remaining_calls_p90``; ``expected_remaining_s`` and ``expected_distance`` from the
        automaton while on it, else the context model's mean seconds and ``{}``. Without a
        sequence model: the automaton's estimates, None off it.

        ``tools``: the first tool name of each call so far (same length as the history), read by
        a remaining-work model over tool names (:attr:`remaining_alphabet` ``"tool"``); without
        it such a model backs off to the call index alone (the position median).

        ``context``: the session's context symbols (as long as ``tail``'s history, last ones
        at least: each call's agent with its stage when reported and its tool mark once its
        response reported one), read by a sequence model over marked agents
        (:attr:`context_alphabet` other than ``"agent"``; each symbol read in that family, see
        :func:`synth.vomm.project`) and by a remaining-work model over agents with stages
        (:attr:`remaining_alphabet` ``"agent_stage"``); without it the plain agents are read
        (the sequence model and a stage remaining-work model back off to their plain-agent
        contexts).
        """
        if self.vomm is None:
            return None if state is None else self.estimates(state)
        order = self.context_order()
        tail = tuple(tail[len(tail) - order:]) if len(tail) > order else tuple(tail)
        ctx = tail
        if context is not None and self.context_alphabet != "agent":
            ctx = self._read(context, self.context_alphabet, order)
        rem_tail = tail
        if self.remaining is not None and self.remaining_alphabet == "agent_stage":
            rem_tail = self._read(context if context is not None else tail, "agent_stage", order)
        if self.remaining is not None and self.remaining_alphabet == "tool":
            k = self.remaining.order
            rem_tail = (tuple(tools[len(tools) - k:]) if tools and k and self._tools_servable
                        else ())
        key = (state, tail, n_calls, rem_tail, ctx)
        out = self._predict_cache.get(key)
        if out is not None:
            return out
        p, _ = self._next_vector(state, ctx)
        # the agents as the served candidate ranks them (our part of the novel slot unused);
        # p_end stays ours: the session-end rule and keep/drop read it
        vec = candidate_vector(self.served_next, p, 0.0, self.vomm.vocab_, self._base, tail)
        auto = self.estimates(state) if state is not None else None
        listed = ranked(self.served_next, vec, self.vomm.vocab_, self._base, tail)
        out = {"next_agents": [{"agent_id": a, "p": round(q, 6)}
                               for a, q in listed[:MAX_NEXT_AGENTS]],
               "p_end": round(float(p[-1]), 6), "on_path": state is not None}
        if self.remaining is not None and n_calls > 0:
            rem = self.remaining.predict(rem_tail, n_calls - 1)
            out["expected_remaining_calls"] = rem["mean"]
            out["remaining_calls_p50"] = rem["p50"]
            out["remaining_calls_p90"] = rem["p90"]
            out["remaining_calls_point"] = rem["point"]
            out["expected_remaining_s"] = rem["mean_s"]
        elif auto is not None:
            out["expected_remaining_calls"] = auto["expected_remaining_calls"]
        if auto is not None:
            out["expected_remaining_s"] = auto["expected_remaining_s"]
            out["expected_distance"] = auto["expected_distance"]
        else:
            out.setdefault("expected_remaining_s", None)
            out["expected_distance"] = {}
        if len(self._predict_cache) >= PREDICT_CACHE:
            self._predict_cache.clear()
        self._predict_cache[key] = out
        return out

    def _served_vector(self, state: PathState | None, ctx: Sequence[str],
                       history: Sequence[str]) -> np.ndarray:
        """The served candidate's probabilities over ``vomm.vocab_`` (END last) and, last, of
        an agent never seen (:func:`synth.next_served.candidate_vector`): ``ctx`` is what our
        model reads, ``history`` the plain agents the baselines read."""
        reads_ours = self.served_next == "ours" or self.served_next.startswith("blend_")
        p, novel = self._next_vector(state, ctx, self.vomm.novel_probability(ctx) if reads_ours else 0.0)
        return candidate_vector(self.served_next, p, novel, self.vomm.vocab_, self._base, history)

    def _next_vector(self, state: PathState | None, tail: Sequence[str],
                     novel: float = 0.0) -> tuple[np.ndarray, float]:
        """Next-symbol probabilities over ``vomm.vocab_`` (END last) and the novel-agent mass
        ``novel``, mixed with the automaton's while the session is on it
        (:func:`synth.next_served.mix_automaton`)."""
        auto = None
        if state is not None and self.mixture < 1.0:
            est = self.estimates(state)
            auto = {a["agent_id"]: a["p"] for a in est["next_agents"]}
            auto[END] = est["p_end"]
        return mix_automaton(self.vomm.predict_proba(tail), novel, auto, self.mixture, self.vomm.index_of)

    def vomm_probability(self, state: PathState | None, history: Sequence[str],
                         symbol: str, context: Sequence[str] | None = None) -> float:
        """Probability that ``symbol`` (an agent, or :data:`synth.vomm.END`) comes next
        after ``history`` (the whole session so far, or its last :meth:`context_order`;
        ``context``: its context symbols, as in :meth:`predict_at`)."""
        order = self.context_order()
        plain = tuple(history[len(history) - order:]) if len(history) > order else tuple(history)
        tail = plain
        if context is not None and self.context_alphabet != "agent":
            tail = self._read(context, self.context_alphabet, order)
        vec = self._served_vector(state, tail, plain)
        i = self.vomm.index_of(symbol)
        return float(vec[-1] if i is None else vec[i])

    # -- fleet view -------------------------------------------------------------------------
    def _projection(self, horizon: int) -> np.ndarray:
        """``Σ_{t<H} Q^t R``: expected calls per agent within H calls, per chain state."""
        if horizon not in self._projection_cache:
            n, k = len(self._chain_rows), len(self.agents)
            entries = [(c, target, agent_index, p) for c, row in enumerate(self._chain_rows)
                       for agent_index, target, p in row]
            cs, ts, ais, ps = zip(*entries) if entries else ((), (), (), ())
            q, r = np.zeros((n, n)), np.zeros((n, k))
            np.add.at(q, (list(cs), list(ts)), list(ps))     # duplicates summed, as a sparse build
            np.add.at(r, (list(cs), list(ais)), list(ps))
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
            from synth.regex_synth import RegexMatcher  # lazy: automata-lib (+networkx) off the serving path
            self._matcher = RegexMatcher(self.regex)
        return self._matcher.accepts(agents)
