"""The session table: per-workflow state of the calls so far, bounded in count, bytes and age.

Per ``(workflow_type_id, workflow_id)``: the agents seen so far (in arrival order), the automaton
state they lead to, each agent's last output length (a feature of the conditional output-length
model), the last few responses (what prompt templates reference), the pending requests (so a
retried annotate does not advance twice), the session's idle gaps so far (they scale its
keep-alive TTL) and, with the online remaining-work selection on, the two remaining-work figures
served at each call (scored when the session ends: :mod:`predictors.online_selection`). Sessions live in an LRU table bounded by ``max_sessions`` *and* by
``max_session_bytes`` (an O(1) per-session estimate, :func:`session_bytes`), and are forgotten
after ``session_idle_s`` without a call. Over the byte budget the least recently written response
texts are dropped first (they only serve ``GET /v1/sessions``), then whole sessions.

Not thread-safe by itself: :class:`predictors.Predictor` holds one lock around every call; every
operation here is O(1) (after a profile swap a session's first call replays its agents on the
new automaton, once).
"""
from __future__ import annotations

import sys
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from predictors.compiled import CompiledProfile
from predictors.online_calibration import BandArms
from predictors.served import RW_CANDIDATES, Band
from synth.vomm import NO_TOOL, START, stage_symbol, tool_mark, unmark

#: Agents kept per session for replaying the automaton after a profile swap.
MAX_SESSION_AGENTS = 4096
#: Default byte budget of the session table (``--max-session-mb``).
DEFAULT_MAX_SESSION_BYTES = 512 << 20
#: Estimated bytes of one session without texts (object, key, table slot), per agent in its
#: history, per pending request and per per-agent dict entry; measured with tracemalloc and
#: rounded up (the base includes the deque block a session keeps once it has held a response;
#: docs/serving-security.md).
SESSION_BASE_BYTES = 2900
AGENT_BYTES = 16
PENDING_BYTES = 384          # + 64 for the band arms (issue 37), measured the same way
AGENT_ENTRY_BYTES = 160
#: Extra bytes of a session whose caller reports tool names (its two context deques).
MARKS_BYTES = 1700
#: Extra bytes per kept response (its dict and deque slot) on top of the text itself.
RECENT_ENTRY_BYTES = 360
#: Last agents of a session kept for the variable-order sequence model (its contexts are <= 8).
PATH_CONTEXT = 16
#: Calls per session whose remaining-work figures are kept for the online selection (later
#: calls' outputs still count in the earlier calls' true remaining work).
MAX_SCORED_CALLS = 1024
#: Numbers kept per call in ``Session.rw_log``: each remaining-work candidate's figure
#: (:data:`predictors.served.RW_CANDIDATES`), the arrival and the output.
RW_STRIDE = len(RW_CANDIDATES) + 2


class KeepAliveServed(NamedTuple):
    """The keep-alive TTL served for a call, kept until the session's next arrival scores it."""

    key: tuple[str, str] | None  # the online keep-alive level's (workflow type, agent) key (None: no level)
    ttl_s: float               # the fitted TTL at that level (the level learns on its hits)
    candidates: tuple[float | None, ...] | None = None  # every candidate's TTL (keep_alive_selection)
    fitted_ttl_s: float | None = None  # the fitted TTL unstretched (the level's dead band learns on its hits)


class PendingCall(NamedTuple):
    """A call annotated and not yet observed (``Session.pending``): what it was served, so a
    retry is served the same and :meth:`predictors.Predictor.observe` scores what was served."""

    agent: str
    band: Band | None                  # the band served (after online calibration)
    issued_at: float                   # clock of its first annotation
    fitted: Band | None                # the fitted band (the drift alarm judges this one)
    keep_alive: KeepAliveServed | None
    remaining_slot: int                # its slot in ``Session.rw_log`` (-1: none)
    arms: BandArms | None              # the calibrator's two arms (None without calibration)


class PathContext(NamedTuple):
    """What the sequence model reads at a call (``WorkflowPaths.predict_at``): the session's last
    agents, its calls so far, and the served context of :meth:`SessionTable.served_context`."""

    history: tuple[str, ...]               # the last agents (``Session.tail``)
    calls: int                             # calls so far (the position)
    marks: tuple[str, ...]                 # context symbols of the last calls
    tools: tuple[str, ...] | None          # tool context (None: not every tool was reported)


@dataclass(slots=True)
class Session:
    workflow_type_id: str
    workflow_id: str
    last_seen: float
    agents: list[str] = field(default_factory=list)
    path_state: Any = None
    path_version: str | None = None
    calls: int = 0                          # calls so far (the sequence model's position)
    tail: deque = field(default_factory=lambda: deque(maxlen=PATH_CONTEXT))  # last agents
    # per call of ``tail``: its context symbol (the agent with its stage when the request
    # carried one, synth.vomm.stage_symbol; marked once its response reported whether it called
    # a tool: synth.vomm.tool_mark) and its first tool name (None until reported, NO_TOOL when
    # it called none); created at the first report of either (None before: the marks are then
    # the plain agents of ``tail``)
    marks: deque | None = None
    tools: deque | None = None
    agent_calls: dict[str, int] = field(default_factory=dict)
    last_output: dict[str, int] = field(default_factory=dict)
    pending: OrderedDict[str, PendingCall] = field(default_factory=OrderedDict)   # by request_id
    recent: deque = field(default_factory=lambda: deque(maxlen=8))
    last_finish: float | None = None
    truncated: bool = False
    started_at: float | None = None        # clock of the session's first call
    nbytes: int = 0                        # estimated bytes (see _session_bytes)
    text_bytes: int = 0                    # bytes of the response texts in ``recent``
    idle_since: float | None = None        # clock of the last completion (idle-gap start)
    idle_median: float | None = None       # predicted median idle gap after that completion
    gap_log_sum: float = 0.0               # Σ ln(observed gap / predicted median)
    gap_n: int = 0                         # idle gaps observed in this session
    keep_alive_served: KeepAliveServed | None = None  # served for the call whose finish began the idle gap
    out_sum: float = 0.0                   # output tokens its finished calls wrote
    out_expected: float = 0.0              # what their agents write on average (training mean)
    # the remaining-work figures served, for scoring when the session ends (online selection,
    # predictors/online_selection.py): per call (every candidate's figure, arrival, output or NaN)
    rw_log: Any = None                     # array('d') of RW_STRIDE per call, or None (selection off)
    rw_extra: float = 0.0                  # output of calls past MAX_SCORED_CALLS (in every R)


def session_bytes(s: Session) -> int:
    """Estimated memory of one session, O(1):

    ``B = base + 16·agents + 384·pending + 160·(agent dict entries) + Σ_recent (|text| + 360)``
    ``+ 1700`` once the caller reported tool names (the context deques), ``+ 8`` per value of the
    remaining-work figures kept for the online selection (4 per call).
    """
    return (SESSION_BASE_BYTES + AGENT_BYTES * len(s.agents) + PENDING_BYTES * len(s.pending)
            + AGENT_ENTRY_BYTES * (len(s.agent_calls) + len(s.last_output)) + s.text_bytes
            + (MARKS_BYTES if s.marks is not None else 0) + (8 * len(s.rw_log) if s.rw_log is not None else 0))


def text_size(entry: dict) -> int:
    text = entry.get("response_text")
    return RECENT_ENTRY_BYTES + (sys.getsizeof(text) if isinstance(text, str) else 0)


class SessionTable:
    """The LRU table of :class:`Session` objects with its count, byte and idle bounds (module doc)."""

    def __init__(self, *, max_sessions: int = 100_000, max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES,
                 session_idle_s: float = 3600.0, recent_outputs: int = 8) -> None:
        self.max_sessions = int(max_sessions)
        self.max_session_bytes = int(max_session_bytes)
        self.session_idle_s = float(session_idle_s)
        self.recent_outputs = int(recent_outputs)
        self.session_bytes = 0                # estimated bytes held by the session table
        self.session_text_bytes = 0
        self.sessions_evicted = {"count": 0, "bytes": 0, "idle": 0}
        self.texts_dropped = 0                # responses dropped for the byte budget
        self._text_lru: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._sessions: OrderedDict[tuple[str, str], Session] = OrderedDict()
        self._ops = 0
        #: called with a session that went idle for good (its workflow is taken to have ended):
        #: the Predictor scores its remaining-work figures there (None: nothing to do)
        self.on_idle_end: Any = None

    def __len__(self) -> int:
        return len(self._sessions)

    def find(self, wt: str, wf: str) -> Session | None:
        """The session if held (no LRU move, no creation)."""
        return self._sessions.get((wt, wf))

    def values(self) -> list[Session]:
        return list(self._sessions.values())

    def get(self, wt: str, wf: str, now: float) -> Session:
        """Get or create a session; also evicts idle/LRU sessions."""
        key = (wt, wf)
        s = self._sessions.get(key)
        if s is not None and now - s.last_seen > self.session_idle_s:
            self.drop(key, "idle")  # idle too long: a new execution under a reused id starts fresh
            s = None
        if s is None:
            s = Session(wt, wf, now, recent=deque(maxlen=self.recent_outputs), started_at=now)
            self._sessions[key] = s
            self.account(s)
        else:
            self._sessions.move_to_end(key)
        s.last_seen = now
        self._ops += 1
        while len(self._sessions) > self.max_sessions:
            self.drop(next(iter(self._sessions)), "count")
        if self._ops % 256 == 0:
            self.expire(now)
        return s

    def _remove(self, key: tuple[str, str]) -> Session | None:
        """Take one session out of the table and give its bytes back (None if not held)."""
        s = self._sessions.pop(key, None)
        if s is not None:
            self.session_bytes -= s.nbytes
            self.session_text_bytes -= s.text_bytes
            self._text_lru.pop(key, None)
        return s

    def drop(self, key: tuple[str, str], reason: str) -> None:
        """Evict one session (``reason``: idle, count or bytes; counted in ``sessions_evicted``)."""
        s = self._remove(key)
        if s is None:
            return
        if reason == "idle" and self.on_idle_end is not None:
            self.on_idle_end(s)
        self.sessions_evicted[reason] += 1

    def account(self, s: Session) -> None:
        """Re-estimate ``s`` after a change (O(1)) and enforce the byte budget."""
        new = session_bytes(s)
        self.session_bytes += new - s.nbytes
        s.nbytes = new
        if self.session_bytes > self.max_session_bytes:
            self._shrink((s.workflow_type_id, s.workflow_id))

    def _shrink(self, keep: tuple[str, str]) -> None:
        """Over the byte budget: drop the least recently written texts, then LRU sessions
        (never ``keep``, the session being served)."""
        while self.session_bytes > self.max_session_bytes and self._text_lru:
            key = next(iter(self._text_lru))
            del self._text_lru[key]
            s = self._sessions.get(key)
            if s is None or not s.recent:
                continue
            self.texts_dropped += len(s.recent)
            s.recent.clear()
            self.session_text_bytes -= s.text_bytes
            s.text_bytes = 0
            new = session_bytes(s)
            self.session_bytes += new - s.nbytes
            s.nbytes = new
        while self.session_bytes > self.max_session_bytes and len(self._sessions) > 1:
            key = next(iter(self._sessions))
            if key == keep:
                self._sessions.move_to_end(key)
                key = next(iter(self._sessions))
            self.drop(key, "bytes")

    def remember_text(self, s: Session, entry: dict) -> None:
        """Append a response to ``s.recent`` keeping the byte counts right."""
        if s.recent.maxlen == 0:
            return
        if s.recent.maxlen is not None and len(s.recent) == s.recent.maxlen:
            gone = text_size(s.recent[0])
            s.text_bytes -= gone
            self.session_text_bytes -= gone
        s.recent.append(entry)
        size = text_size(entry)
        s.text_bytes += size
        self.session_text_bytes += size
        key = (s.workflow_type_id, s.workflow_id)
        self._text_lru[key] = None
        self._text_lru.move_to_end(key)

    def memory_stats(self) -> dict:
        """Session-table memory: estimated bytes, limits and evictions by reason."""
        return {"sessions": len(self._sessions), "max_sessions": self.max_sessions,
                "session_bytes": self.session_bytes, "session_text_bytes": self.session_text_bytes,
                "max_session_bytes": self.max_session_bytes,
                "evicted": dict(self.sessions_evicted), "texts_dropped": self.texts_dropped}

    def expire(self, now: float) -> None:
        """Drop sessions idle longer than ``session_idle_s`` (oldest first; stops at the first live)."""
        limit = now - self.session_idle_s
        while self._sessions:
            key, s = next(iter(self._sessions.items()))
            if s.last_seen >= limit:
                break
            self.drop(key, "idle")

    def path_state(self, m: CompiledProfile, s: Session) -> Any:
        """The session's automaton state under profile ``m`` (replayed after a profile swap)."""
        paths = m.paths.get(s.workflow_type_id)
        if paths is None:
            return None
        if s.path_version != m.version:
            state = None if s.truncated else paths.start()
            for agent in s.agents:
                if state is None:
                    break
                state = paths.advance(state, agent)
            s.path_state, s.path_version = state, m.version
        return s.path_state

    @staticmethod
    def mark_tools(m: CompiledProfile | None, s: Session, agent: str | None,
                   tool_names: Any) -> None:
        """Record what the response of ``agent``'s latest unmarked call (any agent's when
        ``agent`` is None) called: ``tool_names`` a list of names (empty: no tool); anything
        else leaves the call unmarked. Feeds the tool-marked context of the sequence model and
        the tool context of a remaining-work model over tool names; a session whose workflow
        type reads neither (profile ``m``) keeps no marks (no memory spent)."""
        if not isinstance(tool_names, (list, tuple)):
            return
        if s.marks is None:
            paths = m.paths.get(s.workflow_type_id) if m is not None else None
            if not getattr(paths, "reads_tools", False):
                return
            SessionTable._open_marks(s)
        names = [t for t in tool_names if isinstance(t, str) and t]
        for j in range(len(s.marks) - 1, -1, -1):
            if s.tools[j] is None and (agent is None or unmark(s.marks[j]) == agent):
                s.marks[j] = sys.intern(tool_mark(s.marks[j], names))
                s.tools[j] = sys.intern(names[0]) if names else NO_TOOL
                return

    @staticmethod
    def _open_marks(s: Session) -> None:
        """Start keeping context symbols: the calls so far, plain (none was reported)."""
        s.marks = deque(s.tail, maxlen=PATH_CONTEXT)
        s.tools = deque([None] * len(s.tail), maxlen=PATH_CONTEXT)

    @staticmethod
    def served_context(s: Session) -> tuple[tuple[str, ...], tuple[str, ...] | None]:
        """(context symbols of the session's last calls, tool context of a remaining-work model
        over tool names: :data:`synth.vomm.START` then the first tool of every call before
        the last, None when one of them was not reported), as ``profiler eval`` scores them
        (:func:`synth.evaluation.served_contexts`)."""
        if s.marks is None:
            return tuple(s.tail), None
        before = list(s.tools)[:-1]
        if any(t is None for t in before):
            return tuple(s.marks), None
        return tuple(s.marks), ((START,) if s.calls == len(s.tools) else ()) + tuple(before)

    # --- retry-safe sessions: undo the advance of a call that failed upstream -------------------
    def retract(self, s: Session, agent: str) -> bool:
        """Undo one :meth:`advance` by ``agent`` (its latest occurrence): a call whose upstream
        attempt failed never happened for the session. The automaton state is replayed from the
        remaining agents on next use. False when there is nothing to undo."""
        if agent not in s.agents or s.calls <= 0:
            return False
        i = len(s.agents) - 1 - s.agents[::-1].index(agent)
        del s.agents[i]
        s.calls -= 1
        n = s.agent_calls.get(agent, 0) - 1
        if n > 0:
            s.agent_calls[agent] = n
        else:
            s.agent_calls.pop(agent, None)
        s.tail.clear()
        s.tail.extend(s.agents[-PATH_CONTEXT:])
        for j in range(len(s.marks) - 1 if s.marks is not None else -1, -1, -1):
            if s.tools[j] is None and unmark(s.marks[j]) == agent:  # still unmarked
                del s.marks[j]
                del s.tools[j]
                break
        s.path_state, s.path_version = None, None   # replayed by path_state()
        return True

    def end(self, key: tuple[str, str]) -> Session | None:
        """Remove a session whose workflow ended (the client said so): not an eviction. Returns
        it (None if not held)."""
        return self._remove(key)

    def forget(self, key: tuple[str, str]) -> None:
        """Drop a session that never was one (the gateway's warm-up probe): not an eviction, and
        not an ended workflow (nothing is scored)."""
        self._remove(key)
    # --- end of `dialects` addition ------------------------------------------------------------

    def advance(self, m: CompiledProfile | None, s: Session, agent: str,
                stage: Any = None) -> None:
        """One more call by ``agent``; ``stage`` (the request's ``app_metadata.stage``) joins
        its context symbol when the profile's model for this type reads stages."""
        if s.marks is None and isinstance(stage, str) and stage and m is not None:
            paths = m.paths.get(s.workflow_type_id)
            if getattr(paths, "reads_stage", False):
                self._open_marks(s)
        if m is not None:
            self.path_state(m, s)  # bring the state up to this profile before stepping
        if len(s.agents) < MAX_SESSION_AGENTS:
            s.agents.append(sys.intern(agent))  # one copy of each agent name, not one per call
        else:
            s.truncated = True
        s.agent_calls[agent] = s.agent_calls.get(agent, 0) + 1
        s.calls += 1
        s.tail.append(agent)
        if s.marks is not None:
            s.marks.append(sys.intern(stage_symbol(s.tail[-1], stage)))
            s.tools.append(None)
        if m is not None and s.path_version == m.version and s.path_state is not None:
            s.path_state = m.paths[s.workflow_type_id].advance(s.path_state, agent)
