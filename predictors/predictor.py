"""``Predictor``: the in-process facade that turns a profile into per-call ``sys_annotations``.

One object serves every request of a process (sidecar, gateway, or an app that imports it):

* **Profile, compiled once.** :meth:`Predictor.load` turns ``profile.json`` into estimator objects
  (output-length bands, tool-latency fits, one workflow automaton per workflow type) and the
  per-(workflow type, agent) parts of an annotation that never change between calls. A new
  profile is compiled aside and swapped in with one reference assignment, so a request in flight
  finishes on the profile it started with and none ever sees half of each.
* **Session state.** Per ``(workflow_type_id, workflow_id)``: the agents seen so far (in arrival
  order), the automaton state they lead to, each agent's last output length (a feature of the
  conditional output-length model) and the last few responses (what prompt templates reference).
  Sessions live in an LRU table bounded by ``max_sessions`` *and* by ``max_session_bytes`` (an
  O(1) per-session estimate, see :func:`_session_bytes`), and are forgotten after
  ``session_idle_s`` without a call. Over the byte budget the least recently written response
  texts are dropped first (they only serve ``GET /v1/sessions``), then whole sessions. One
  lock guards the table; every per-call operation under it is O(1) (after a profile swap a
  session's first call replays its agents on the new automaton, once).
* **Calls advance the session.** :meth:`annotate` (at call arrival) advances the automaton by the
  call's agent — once per ``request_id``, so a retried annotate does not count twice — and
  :meth:`observe` (at completion) records the output length and response; a completion whose
  arrival was never annotated advances the session itself.
* **Never fails a request.** An unknown workflow type or agent, an agent served only by the global
  band (too little data), a workflow type held in shadow mode, or a session that left the pruned
  automaton give ``{"known": false, "reason": ...}`` without any prediction, never an exception.

Annotation (``known: true``), a superset of DESIGN.md's listing::

    {"profile_version", "known": true, "workflow_type_id", "workflow_id", "agent_id",
     "predicted_output_len": [lo, hi], "output_len_coverage", "output_len_level",
     "output_len_mean",       # the agent's mean output length (tokens)
     "output_len_upper",      # [[α, U(α)], …]: one-sided (1 − α) upper bounds, largest α first
     "session_age_s",         # seconds since the session's first call (workflow-level aging)
     "tool_latency": {tool: {"mu", "sigma", "p50_s", "p95_s", "ttl_s"}},   # by frequency
     "retain_s",              # keep-alive TTL (SAGA) of the most frequent tool, when it has one
     "keep_alive_ttl_s",      # keep-alive TTL from the idle gap (finish -> session's next call),
                              # scaled by the session's own gaps so far (predictors/idle_gap.py)
     "keep_alive_ttl_by_tool",  # {tool: TTL} when the tool level validated (tool known at finish)
     "next_agents", "predicted_path_regex", "expected_remaining_calls", "expected_remaining_s",
     "expected_distance", "p_end", "prompt_composition",  # when the profile has the automaton
     "priority"}                                   # when a priority policy is configured
"""
from __future__ import annotations

import logging
import sys
import math
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

from predictors.contract import ID_KEYS, TOOL_FIELDS, Annotation, NextAgent, ToolLatency
from predictors.idle_gap import MAX_FACTOR, MIN_GAP_S, IdleGapModel
from predictors.output_length import OutputLengthIntervals
from predictors.tool_latency import ToolLatencyModel

log = logging.getLogger(__name__)

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
PENDING_BYTES = 320
AGENT_ENTRY_BYTES = 160
#: Extra bytes per kept response (its dict and deque slot) on top of the text itself.
RECENT_ENTRY_BYTES = 360
#: Last agents of a session kept for the variable-order sequence model (its contexts are <= 8).
PATH_CONTEXT = 16

def _workflow_paths_class():
    """``synth.session.WorkflowPaths`` when the synth package provides it, else None."""
    try:
        from synth.session import WorkflowPaths
    except ImportError:
        return None
    return WorkflowPaths


@dataclass
class _AgentEntry:
    """What never changes between calls of one (workflow type, agent)."""

    calls: int
    tool_latency: dict[str, ToolLatency]
    static_band: tuple[int, int, str] | None   # None: the conditional model needs features
    retain_s: float | None = None              # keep-alive TTL of the agent's most frequent tool
    upper_bounds: tuple = ()                   # ((α, U(α)), …) one-sided output bounds
    mean_output: float | None = None           # mean output tokens of the agent
    keep_alive: tuple | None = None            # (idle-gap TTL z-quantile, median gap, prior weight, by tool)


class CompiledProfile:
    """A profile turned into lookup structures; immutable once built (safe to share across threads)."""

    def __init__(self, data: Mapping[str, Any], version: str, *, max_tools: int = 3,
                 paths_class: Any = None) -> None:
        self.version = version
        self.data = data
        self.manifest: dict = {}
        self.path: Path | None = None
        ol = data.get("output_length")
        self.bands = OutputLengthIntervals.from_dict(ol) if ol else None
        self.coverage = float(ol["coverage"]) if ol else None
        tl = data.get("tool_latency")
        self.tools = ToolLatencyModel.from_dict(tl) if tl else None
        ig = data.get("idle_gap")
        self.idle_gap = IdleGapModel.from_dict(ig) if ig else None
        wts = data.get("workflow_types") or {}
        self.workflow_type_calls: dict[str, int] = {wt: int((v or {}).get("calls", 0)) for wt, v in wts.items()}
        if self.bands is not None:
            for wt, band in self.bands.workflow_types_.items():
                self.workflow_type_calls.setdefault(wt, int(band.get("n", 0)))
        self.agents: dict[tuple[str, str], _AgentEntry] = {}
        agent_stats = data.get("agents") or {}
        band_agents = self.bands.agents_ if self.bands is not None else {}
        for wt in set(agent_stats) | set(band_agents):
            for agent in set(agent_stats.get(wt, {})) | set(band_agents.get(wt, {})):
                self.agents[(wt, agent)] = self._agent_entry(wt, agent, agent_stats.get(wt, {}).get(agent) or {},
                                                             max_tools)
        self.paths: dict[str, Any] = {}
        self.path_errors: dict[str, str] = {}
        if paths_class is not None:
            for wt, section in (data.get("workflows") or {}).items():
                try:
                    self.paths[wt] = paths_class.from_section(section)
                except Exception as exc:  # a bad section costs that type its path fields only
                    self.path_errors[wt] = f"{type(exc).__name__}: {exc}"
                    log.warning("profile %s: workflow automaton of %r not usable: %s", version, wt, exc)

    def _agent_entry(self, wt: str, agent: str, stats: Mapping, max_tools: int) -> _AgentEntry:
        tools: dict[str, dict] = {}
        counts = stats.get("tools") or {}
        if self.tools is not None:
            for name in sorted(counts, key=lambda t: (-counts[t], t))[:max_tools]:
                entry = self.tools.lookup(wt, name)
                if entry:
                    tools[name] = ToolLatency(*(entry.get(k) for k in TOOL_FIELDS))
        static = None
        if self.bands is not None:
            band, level = self.bands.lookup(wt, agent)
            if not band.get("conditional"):
                static = (int(band["lo"]), int(band["hi"]), level)
        calls = int(stats.get("calls") or (self.bands.agents_.get(wt, {}).get(agent, {}).get("n", 0)
                                           if self.bands is not None else 0))
        first = next(iter(tools.values()), ToolLatency())
        upper: tuple = ()
        mean_out = None
        if self.bands is not None:
            upper = tuple((float(a), int(u)) for a, u in self.bands.upper_bounds(wt, agent))
            mean_out = (self.bands.agents_.get(wt, {}).get(agent) or {}).get("mean")
        return _AgentEntry(calls=calls, tool_latency=tools, static_band=static,
                           retain_s=first.ttl_s if first.ttl_s is not None else first.p95_s,
                           upper_bounds=upper, mean_output=mean_out,
                           keep_alive=self._keep_alive(wt, agent, tools))

    def _keep_alive(self, wt: str, agent: str, tools: Mapping[str, dict]) -> tuple | None:
        """``(ttl_z, median_s, prior_weight, {tool: ttl_z})`` of the agent's idle-gap entry."""
        if self.idle_gap is None:
            return None
        e, _ = self.idle_gap.entry(wt, agent)
        if e is None:
            return None
        by_tool = {}
        if (self.idle_gap.workflow_types_.get(wt) or {}).get("tool_level"):
            for name in tools:
                te, lv = self.idle_gap.entry(wt, agent, name)
                if te is not None and lv == "tool":
                    by_tool[name] = float(te["ttl_z"])
        return (float(e["ttl_z"]), self.idle_gap.median(wt, agent), self.idle_gap.prior_weight(wt), by_tool)

    def keep_alive_ttl(self, entry: _AgentEntry, log_sum: float, n: int) -> tuple[float | None, dict]:
        """Served idle-gap TTL and by-tool TTLs for a session with ``n`` earlier gaps whose
        ``Σ ln(gap/median)`` is ``log_sum``: ``c · Q_q(z)``, ``c = exp(clip(log_sum / (n + w), ±ln 8))``."""
        if entry.keep_alive is None or self.idle_gap is None:
            return None, {}
        ttl_z, _, w, by_tool = entry.keep_alive
        c = 1.0 if w is None else math.exp(max(-math.log(MAX_FACTOR),
                                                min(math.log(MAX_FACTOR), log_sum / (n + w))))
        cap = self.idle_gap.max_ttl_s
        serve = (lambda z: min(c * z, cap)) if cap is not None else (lambda z: c * z)
        return (serve(ttl_z) if math.isfinite(ttl_z) or cap is not None else None,
                {k: serve(v) for k, v in by_tool.items()})

    def global_for_lack_of_data(self, wt: str, agent: str) -> bool:
        """True when the agent is served the global band because it has too little data (a
        degenerate agent, or a profile written before bands were chosen by validation), False
        when held-out validation chose the global band as the narrowest that holds coverage."""
        if self.bands is None:
            return True
        band, level = self.bands.lookup(wt, agent)
        return level == "global" and ("selection" not in band or bool(band.get("fallback_reason")))

    def band(self, wt: str, agent: str, entry: _AgentEntry, features: Mapping) -> tuple[int, int, str] | None:
        if entry.static_band is not None:
            return entry.static_band
        if self.bands is None:
            return None
        return self.bands.predict_band(wt, agent, features)


@dataclass(slots=True)
class _Session:
    workflow_type_id: str
    workflow_id: str
    last_seen: float
    agents: list[str] = field(default_factory=list)
    path_state: Any = None
    path_version: str | None = None
    calls: int = 0                          # calls so far (the sequence model's position)
    tail: deque = field(default_factory=lambda: deque(maxlen=PATH_CONTEXT))  # last agents
    agent_calls: dict[str, int] = field(default_factory=dict)
    last_output: dict[str, int] = field(default_factory=dict)
    pending: OrderedDict = field(default_factory=OrderedDict)   # request_id -> (agent, band | None, issued_at)
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


def _session_bytes(s: _Session) -> int:
    """Estimated memory of one session, O(1):

    ``B = base + 16·agents + 320·pending + 160·(agent dict entries) + Σ_recent (|text| + 360)``.
    """
    return (SESSION_BASE_BYTES + AGENT_BYTES * len(s.agents) + PENDING_BYTES * len(s.pending)
            + AGENT_ENTRY_BYTES * (len(s.agent_calls) + len(s.last_output)) + s.text_bytes)


def _text_size(entry: dict) -> int:
    text = entry.get("response_text")
    return RECENT_ENTRY_BYTES + (sys.getsizeof(text) if isinstance(text, str) else 0)


class Predictor:
    """Per-call predictions from a workflow profile, with bounded per-session state.

    Parameters
    ----------
    profile : a ``profiler.profile_artifact.Profile``, a profile folder (root or version), or None
        (load later with :meth:`load`).
    max_sessions : sessions kept in memory (least recently used beyond it are forgotten).
    max_session_bytes : estimated bytes the session table may hold; beyond it the least recently
        written response texts are dropped, then the least recently used sessions.
    session_idle_s : a session without a call for this long is forgotten.
    max_tools : tools listed in ``tool_latency`` per agent (the most frequent ones).
    recent_outputs : responses kept per session for prompt composition.
    gate : an object deciding shadow mode (``serving_hooks.shadow.ShadowGate``) or None.
    priority_policy : callable ``(annotation: Annotation, app_metadata) -> int`` giving a known
        call its SGLang priority, or None (no ``priority`` field). The serving layer injects
        ``serving_hooks.policies.AnnotationPriority`` (``PredictionService`` does by default):
        the facade depends on no policy.
    prompt_composition_agents : next agents (most likely first) whose prompt template is included.
    """

    def __init__(self, profile: Any = None, *, max_sessions: int = 100_000,
                 session_idle_s: float = 3600.0, max_tools: int = 3, recent_outputs: int = 8,
                 gate: Any = None, priority_policy: Any = None,
                 prompt_composition_agents: int = 1, clock=time.monotonic,
                 max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES) -> None:
        self.max_sessions = int(max_sessions)
        self.max_session_bytes = int(max_session_bytes)
        self.session_bytes = 0                # estimated bytes held by the session table
        self.session_text_bytes = 0
        self.sessions_evicted = {"count": 0, "bytes": 0, "idle": 0}
        self.texts_dropped = 0                # responses dropped for the byte budget
        self._text_lru: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.session_idle_s = float(session_idle_s)
        self.max_tools = int(max_tools)
        self.recent_outputs = int(recent_outputs)
        self.gate = gate
        self.priority_policy = priority_policy
        self.prompt_composition_agents = int(prompt_composition_agents)
        self.clock = clock
        self._paths_class = _workflow_paths_class()
        self._model: CompiledProfile | None = None
        self._sessions: OrderedDict[tuple[str, str], _Session] = OrderedDict()
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._ops = 0
        self.annotations_total = 0
        self.annotations_unknown = 0
        self.loaded_at: float | None = None
        if profile is not None:
            self.load(profile)

    # ------------------------------------------------------------------ profile
    @classmethod
    def from_dict(cls, data: Mapping[str, Any], version: str = "inline", **kwargs: Any) -> "Predictor":
        """A predictor over a profile.json dict (tests, notebooks)."""
        return cls(SimpleNamespace(data=data, version=version, manifest={}, path=None), **kwargs)

    def load(self, profile: Any) -> CompiledProfile:
        """Compile ``profile`` (a Profile, or a folder to load) and swap it in atomically."""
        if isinstance(profile, (str, Path)):
            from profiler.profile_artifact import load_profile
            profile = load_profile(profile)
        compiled = CompiledProfile(profile.data, profile.version, max_tools=self.max_tools,
                                   paths_class=self._paths_class)
        compiled.manifest = getattr(profile, "manifest", {}) or {}
        compiled.path = getattr(profile, "path", None)
        if self.gate is not None:
            self.gate.on_profile(compiled.workflow_type_calls, compiled.coverage,
                                 first=self._model is None)
        self._model = compiled            # the atomic swap: one reference assignment
        self.loaded_at = time.time()
        return compiled

    @property
    def profile(self) -> CompiledProfile | None:
        return self._model

    @property
    def version(self) -> str | None:
        m = self._model
        return m.version if m is not None else None

    # ----------------------------------------------------------------- sessions
    def session_count(self) -> int:
        return len(self._sessions)

    def _session(self, wt: str, wf: str, now: float) -> _Session:
        """Get or create a session (caller holds the lock); also evicts idle/LRU sessions."""
        key = (wt, wf)
        s = self._sessions.get(key)
        if s is not None and now - s.last_seen > self.session_idle_s:
            self._drop(key, "idle")  # idle too long: a new execution under a reused id starts fresh
            s = None
        if s is None:
            s = _Session(wt, wf, now, recent=deque(maxlen=self.recent_outputs), started_at=now)
            self._sessions[key] = s
            self._account(s)
        else:
            self._sessions.move_to_end(key)
        s.last_seen = now
        self._ops += 1
        while len(self._sessions) > self.max_sessions:
            self._drop(next(iter(self._sessions)), "count")
        if self._ops % 256 == 0:
            self._expire(now)
        return s

    def _drop(self, key: tuple[str, str], reason: str) -> None:
        """Forget one session (caller holds the lock) and give its bytes back."""
        s = self._sessions.pop(key, None)
        if s is None:
            return
        self.session_bytes -= s.nbytes
        self.session_text_bytes -= s.text_bytes
        self._text_lru.pop(key, None)
        self.sessions_evicted[reason] += 1

    def _account(self, s: _Session) -> None:
        """Re-estimate ``s`` after a change (O(1)) and enforce the byte budget (caller holds the lock)."""
        new = _session_bytes(s)
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
            new = _session_bytes(s)
            self.session_bytes += new - s.nbytes
            s.nbytes = new
        while self.session_bytes > self.max_session_bytes and len(self._sessions) > 1:
            key = next(iter(self._sessions))
            if key == keep:
                self._sessions.move_to_end(key)
                key = next(iter(self._sessions))
            self._drop(key, "bytes")

    def _remember_text(self, s: _Session, entry: dict) -> None:
        """Append a response to ``s.recent`` keeping the byte counts right (caller holds the lock)."""
        if s.recent.maxlen == 0:
            return
        if s.recent.maxlen is not None and len(s.recent) == s.recent.maxlen:
            gone = _text_size(s.recent[0])
            s.text_bytes -= gone
            self.session_text_bytes -= gone
        s.recent.append(entry)
        size = _text_size(entry)
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

    def _expire(self, now: float) -> None:
        """Drop sessions idle longer than ``session_idle_s`` (oldest first; stops at the first live)."""
        limit = now - self.session_idle_s
        while self._sessions:
            key, s = next(iter(self._sessions.items()))
            if s.last_seen >= limit:
                break
            self._drop(key, "idle")

    def expire_idle(self) -> int:
        """Forget idle sessions now; returns how many are left."""
        with self._lock:
            self._expire(self.clock())
            return len(self._sessions)

    def _path_state(self, m: CompiledProfile, s: _Session) -> Any:
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

    def _advance(self, m: CompiledProfile | None, s: _Session, agent: str) -> None:
        if m is not None:
            self._path_state(m, s)  # bring the state up to this profile before stepping
        if len(s.agents) < MAX_SESSION_AGENTS:
            s.agents.append(sys.intern(agent))  # one copy of each agent name, not one per call
        else:
            s.truncated = True
        s.agent_calls[agent] = s.agent_calls.get(agent, 0) + 1
        s.calls += 1
        s.tail.append(agent)
        if m is not None and s.path_version == m.version and s.path_state is not None:
            s.path_state = m.paths[s.workflow_type_id].advance(s.path_state, agent)

    @staticmethod
    def _band(m: CompiledProfile, s: _Session, agent: str, entry: _AgentEntry, input_tokens: Any,
              agent_call_index: int) -> tuple[int, int, str] | None:
        """The band of a call by ``agent`` in session ``s`` (its history feeds the conditional
        model); None, logged, when the estimator entry fails: never an exception."""
        features = {"prev_agent_output_tokens": s.last_output.get(agent), "input_tokens": input_tokens,
                    "agent_call_index": agent_call_index}
        try:
            return m.band(s.workflow_type_id, agent, entry, features)
        except Exception as exc:  # a broken estimator entry must not fail the request
            log.warning("output band for %s/%s failed: %s", s.workflow_type_id, agent, exc)
            return None

    # ----------------------------------------------------------------- annotate
    def annotate(self, app_metadata: Mapping[str, Any] | None, *, request_id: str | None = None,
                 input_tokens: int | None = None, advance: bool = True) -> dict:
        """sys_annotations JSON for one call (:meth:`annotate_call` rendered with
        ``Annotation.to_dict``); never raises on bad input."""
        return self.annotate_call(app_metadata, request_id=request_id, input_tokens=input_tokens,
                                  advance=advance).to_dict()

    def annotate_call(self, app_metadata: Mapping[str, Any] | None, *, request_id: str | None = None,
                      input_tokens: int | None = None, advance: bool = True) -> Annotation:
        """The annotation contract for one call (see module doc); never raises on bad input.

        ``request_id`` makes the session advance idempotent (and lets :meth:`observe` score the
        band this call was given); ``input_tokens`` feeds the conditional output-length model;
        ``advance=False`` asks "what would you say" without changing the session.
        """
        ann = self._annotate(app_metadata, request_id, input_tokens, advance)
        with self._count_lock:
            self.annotations_total += 1
            self.annotations_unknown += not ann.known
        return ann

    def _annotate(self, app_metadata: Any, request_id: str | None, input_tokens: int | None,
                  advance: bool) -> Annotation:
        m = self._model
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        ids = [meta.get(k) for k in ID_KEYS]
        base = Annotation(m.version if m is not None else None, False,
                          *(str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) and v != ""
                            else None for v in ids))

        def unknown(reason: str, detail: str | None = None) -> Annotation:
            return replace(base, reason=reason, detail=detail or None)

        missing = [k for k, v in zip(ID_KEYS, ids) if v is None or v == "" or not isinstance(v, (str, int))]
        if missing:
            return unknown("missing_app_metadata", "app_metadata lacks " + ", ".join(missing))
        wt, wf, agent = (str(v) for v in ids)
        now = self.clock()
        with self._lock:
            s = self._session(wt, wf, now)
            first_time = request_id is None or request_id not in s.pending
            if advance and first_time:
                self._advance(m, s, agent)
                if s.idle_since is not None and s.idle_median and now >= s.idle_since:
                    s.gap_log_sum += math.log(max(now - s.idle_since, MIN_GAP_S) / max(s.idle_median, MIN_GAP_S))
                    s.gap_n += 1
                s.idle_since = None
            gap_stats = (s.gap_log_sum, s.gap_n)
            issued_at = now if first_time else s.pending[request_id][2]
            session_age = max(0.0, issued_at - (s.started_at if s.started_at is not None else issued_at))
            if m is None:
                self._account(s)
                return unknown("no_profile")
            state = self._path_state(m, s)
            context = (tuple(s.tail), s.calls)
            entry = m.agents.get((wt, agent))
            band = None
            if entry is not None:
                band = self._band(m, s, agent, entry, input_tokens,
                                  max(s.agent_calls.get(agent, 0) - (1 if advance else 0), 0))
            if request_id is not None and advance and first_time:
                s.pending[request_id] = (agent, band, issued_at)
                if len(s.pending) > 64:
                    s.pending.popitem(last=False)
            self._account(s)
        if wt not in m.workflow_type_calls:
            if self.gate is not None:
                self.gate.note_unknown(wt)
            return unknown("unknown_workflow_type")
        if self.gate is not None and self.gate.is_shadowed(wt):
            return unknown("shadow", self.gate.reason(wt))
        if entry is None:
            return unknown("unknown_agent")
        if band is None or (band[2] == "global" and m.global_for_lack_of_data(wt, agent)):
            return unknown("too_little_data", f"agent {agent!r} has {entry.calls} calls: only the global band applies")
        paths = m.paths.get(wt)
        if paths is not None and state is None and not getattr(paths, "has_sequence_model", False):
            return unknown("off_path", "the session left the dominant paths of the automaton")
        ttl, by_tool = m.keep_alive_ttl(entry, *gap_stats)
        fields: dict[str, Any] = dict(
            known=True, predicted_output_len=(band[0], band[1]), output_len_coverage=m.coverage,
            output_len_level=band[2], output_len_mean=entry.mean_output,
            output_len_upper=entry.upper_bounds, session_age_s=session_age,
            tool_latency=entry.tool_latency, retain_s=entry.retain_s, keep_alive_ttl_s=ttl,
            keep_alive_ttl_by_tool=by_tool if ttl is not None else {})
        if paths is not None:
            fields.update(self._path_fields(paths, state, context))
        ann = replace(base, **fields)
        if self.priority_policy is not None:
            try:
                ann = replace(ann, priority=int(self.priority_policy(ann, meta)))
            except Exception as exc:
                log.warning("priority policy failed: %s", exc)
        return ann

    def _path_fields(self, paths: Any, state: Any,
                     context: tuple[tuple[str, ...], int] | None = None) -> dict[str, Any]:
        """Path fields of the contract: from the sequence model (``paths.predict_at``: next
        agents, p_end and remaining work after the session's last agents, on the automaton or
        off it) when the profile has one, else from the automaton state."""
        out: dict[str, Any] = {}
        if context is not None and getattr(paths, "has_sequence_model", False):
            est = paths.predict_at(state, context[0], context[1])
            out["on_path"] = state is not None
            out["remaining_calls_p50"] = est.get("remaining_calls_p50")
            out["remaining_calls_p90"] = est.get("remaining_calls_p90")
        else:
            est = paths.estimates(state)
        next_agents = tuple(NextAgent(item["agent_id"], float(item["p"]))
                            for item in est.get("next_agents") or ())
        out["next_agents"] = next_agents
        out["predicted_path_regex"] = paths.regex
        out["expected_remaining_calls"] = est.get("expected_remaining_calls")
        out["expected_remaining_s"] = est.get("expected_remaining_s")
        out["expected_distance"] = dict(est.get("expected_distance") or {})
        out["p_end"] = est.get("p_end")
        templates = getattr(paths, "prompt_templates", None) or {}
        if templates and self.prompt_composition_agents > 0:
            chosen = {n.agent_id: templates[n.agent_id]
                      for n in next_agents[: self.prompt_composition_agents] if n.agent_id in templates}
            out["prompt_composition"] = chosen
        return out

    # ------------------------------------------------------------------ observe
    def observe(self, completion: Mapping[str, Any]) -> bool | None:
        """Record a finished call: ``{"app_metadata" | workflow_type_id/workflow_id/agent_id,
        "request_id", "output_tokens", "input_tokens"?, "t_finish"?, "response_text"?,
        "status"?}``.

        Returns whether the output length fell in the band this call was given (None when it had
        none); that outcome also feeds the shadow gate's live coverage. Never raises on bad input.
        """
        meta = completion.get("app_metadata")
        if not isinstance(meta, Mapping):
            meta = completion
        wt, wf, agent = (meta.get(k) for k in ID_KEYS)
        if wt is None or wf is None or agent is None:
            return None
        wt, wf, agent = str(wt), str(wf), str(agent)
        out = completion.get("output_tokens")
        request_id = completion.get("request_id")
        m = self._model
        now = self.clock()
        with self._lock:
            s = self._session(wt, wf, now)
            pending = s.pending.pop(request_id, None) if request_id is not None else None
            if pending is None:
                band = None
                if m is not None and (wt, agent) in m.agents:
                    band = self._band(m, s, agent, m.agents[(wt, agent)], completion.get("input_tokens"),
                                      s.agent_calls.get(agent, 0))
                self._advance(m, s, agent)
            else:
                band = pending[1]
            if isinstance(out, (int, float)) and not isinstance(out, bool) and completion.get("status", "ok") == "ok":
                s.last_output[agent] = int(out)
            if completion.get("t_finish") is not None:
                s.last_finish = completion.get("t_finish")
            ka = m.agents.get((wt, agent)) if m is not None else None
            s.idle_since = now                     # the session's KV is idle from here
            s.idle_median = ka.keep_alive[1] if ka is not None and ka.keep_alive is not None else None
            if completion.get("response_text") is not None:
                self._remember_text(s, {"request_id": request_id, "agent_id": agent,
                                        "response_text": completion.get("response_text")})
            self._account(s)
        if band is None or not isinstance(out, (int, float)) or isinstance(out, bool):
            return None
        hit = band[0] <= out <= band[1]
        if self.gate is not None:
            self.gate.record(wt, hit)
        return hit

    def session_view(self, workflow_type_id: str, workflow_id: str) -> dict | None:
        """A copy of one session's state (agents so far, last outputs, recent responses)."""
        with self._lock:
            s = self._sessions.get((workflow_type_id, workflow_id))
            if s is None:
                return None
            m = self._model
            state = self._path_state(m, s) if m is not None else None
            return {"agents": list(s.agents), "agent_calls": dict(s.agent_calls),
                    "last_output": dict(s.last_output), "recent": list(s.recent),
                    "on_path": state is not None if m is not None and workflow_type_id in m.paths else None,
                    "path_state": state, "last_finish": s.last_finish}

    def live_states(self, workflow_type_id: str) -> list:
        """Automaton states of the live sessions of one workflow type (for ``project_calls``)."""
        with self._lock:
            m = self._model
            if m is None:
                return []
            return [st for s in self._sessions.values() if s.workflow_type_id == workflow_type_id
                    for st in [self._path_state(m, s)] if st is not None]

    def stats(self) -> dict:
        return {"annotations": self.annotations_total, "unknown": self.annotations_unknown,
                "sessions": len(self._sessions), "profile_version": self.version}
