"""``Predictor``: the thin in-process facade that turns a profile into per-call annotations.

One object serves every request of a process (sidecar, gateway, simulator, or an app that
imports it). It holds three things, each in its own module: the compiled profile
(:class:`predictors.compiled.CompiledProfile`, swapped in by one reference assignment so a
request in flight finishes on the profile it started with), the session table
(:class:`predictors.sessions.SessionTable`, bounded, guarded by ``_lock``), and the annotation
contract it emits (:class:`predictors.contract.Annotation`; :meth:`annotate_call`, and
:meth:`annotate` for its JSON form).

Why it is shaped so: calls advance the session once per ``request_id`` (a retry does not count
twice); it never fails a request (an unknown type or session gives ``{"known": false,
"reason": ...}``); an unseen agent of a known type is served its type's entry
(``agent_fallback``); and it holds no policy — ``priority`` is set by the serving layer — so this
package imports nothing from the layers above it, nor pandas, scipy or scikit-learn.
The behaviour in full and the annotation's JSON fields: docs/serving.md ("The Predictor facade").
"""
from __future__ import annotations

import logging
import math
import threading
import time
from array import array
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Mapping

import numpy as np

from predictors.compiled import UNSEEN_AGENT, AgentEntry, CompiledProfile, latency_class
from predictors.coverage_monitor import CoverageMonitor
from predictors.contract import ID_KEYS, Annotation, NextAgent
from predictors.keep_alive_compare import fitted_holds_forward
from predictors.keep_alive_selection import KeepAliveSelector
from predictors.online_calibration import BandArms, OnlineCalibrator, keep_alive_calibrator, keep_alive_slope
from predictors.online_selection import RemainingSelector
from predictors.served import HELD_TTL_DEFAULT_S, MIN_GAP_S, Band, RemainingWork, held_ttl_s
from predictors.sessions import (DEFAULT_MAX_SESSION_BYTES, MAX_SCORED_CALLS, RW_STRIDE, SESSION_BASE_BYTES, KeepAliveServed,
                                 PathContext, PendingCall, Session, SessionTable)
from store.profile_artifact import load_profile
from synth.session import WorkflowPaths

__all__ = ["CompiledProfile", "DEFAULT_MAX_SESSION_BYTES", "Predictor", "SESSION_BASE_BYTES"]

log = logging.getLogger(__name__)

#: Workflow id of the warm-up probes (:meth:`Predictor.warm_up`).
WARMUP_SESSION = "__warmup__"


@dataclass(frozen=True, slots=True)
class _CallFigures:
    """What :meth:`Predictor._figures` computed for one call, read after the session lock."""

    entry: AgentEntry | None
    band: Band | None
    ttl: float | None
    by_tool: dict
    remaining: RemainingWork | None
    state: Any
    context: PathContext
    session_age: float


class Predictor:
    """Per-call predictions from a workflow profile, with bounded per-session state.

    Parameters
    ----------
    profile : a ``store.profile_artifact.Profile``, a profile folder (root or version), or None
        (load later with :meth:`load`).
    max_sessions : sessions kept in memory (least recently used beyond it are forgotten).
    max_session_bytes : estimated bytes the session table may hold; beyond it the least recently
        written response texts are dropped, then the least recently used sessions.
    session_idle_s : a session without a call for this long is forgotten.
    max_tools : tools listed in ``tool_latency`` per agent (the most frequent ones).
    recent_outputs : responses kept per session for prompt composition.
    gate : an object deciding shadow mode (``serving_hooks.shadow.ShadowGate``) or None.
    prompt_composition_agents : next agents (most likely first) whose prompt template is included.
    agent_fallback : predict calls of agents the profile has no or too little data for from their
        workflow type's entry (docs/serving.md); False answers them ``known: false``.
    online_calibration : adapt each (workflow type, agent)'s band level from the observed outcomes
        (:class:`predictors.online_calibration.OnlineCalibrator`; True: one with the defaults, an
        instance: that one, False: serve the fitted bands as they are).
    keep_alive_calibration : adapt each (workflow type, agent)'s keep-alive TTL level the same way
        (:func:`predictors.online_calibration.keep_alive_calibrator`; an outcome per idle gap: the
        session's next arrival within the TTL held (``predictors.served.held_ttl_s`` of the TTL
        served) for the call whose finish began it). None
        (default): on exactly when ``online_calibration`` is; True / an instance / False as there.
    remaining_selection : follow drift of the remaining-work figure
        (:class:`predictors.online_selection.RemainingSelector`): per workflow type, serve as
        ``expected_remaining_output_tokens`` the candidate (the fitted table, the position median,
        ``mrl``) that ranked the sessions that ended recently better than the served one beyond a
        margin (scored when a session ends: :meth:`end_session`, or its idle expiry). True
        (default: on no real set or messy seed did the served order get worse beyond one se,
        docs/workflow-paths.md): a selector with the defaults; an instance: that one; False: the
        fit's figure.
    keep_alive_selection : serve, per workflow type, the keep-alive candidate ahead on the idle
        gaps seen (:class:`predictors.keep_alive_selection.KeepAliveSelector`: the fitted TTL, the
        plain per-type p95, the tool's p95, the TTL that gives up on gaps past the cap), its
        evidence seeded on :meth:`load` from the profile's forward replay of the training side
        (``idle_gap.workflow_types.<type>.selection_warm_start``). False (default: on mini-SWE's
        random split it covers less beyond one se, and mini-SWE's time split stays behind the
        plain p95; docs/keep-alive.md), True: a selector with the defaults, an instance: that one.
    """

    def __init__(self, profile: Any = None, *, max_sessions: int = 100_000,
                 session_idle_s: float = 3600.0, max_tools: int = 3, recent_outputs: int = 8,
                 gate: Any = None,
                 prompt_composition_agents: int = 1, clock=time.monotonic,
                 max_session_bytes: int = DEFAULT_MAX_SESSION_BYTES, agent_fallback: bool = True,
                 online_calibration: bool | OnlineCalibrator = True,
                 keep_alive_calibration: bool | OnlineCalibrator | None = None,
                 remaining_selection: bool | RemainingSelector = True,
                 keep_alive_selection: bool | KeepAliveSelector = False) -> None:
        self.agent_fallback = bool(agent_fallback)
        self.sessions = SessionTable(max_sessions=max_sessions, max_session_bytes=max_session_bytes,
                                     session_idle_s=session_idle_s, recent_outputs=recent_outputs)
        self.remaining_selector: RemainingSelector | None = (
            remaining_selection if isinstance(remaining_selection, RemainingSelector)
            else RemainingSelector() if remaining_selection else None)
        if self.remaining_selector is not None:     # an idle expiry ends a workflow: score it
            self.sessions.on_idle_end = lambda s: self._score_ended(s, s.last_seen)
        self.max_tools = int(max_tools)
        self.gate = gate
        self.coverage_monitor = CoverageMonitor()  # drift alarm over the fitted bands' outcomes
        self.calibrator: OnlineCalibrator | None = (
            online_calibration if isinstance(online_calibration, OnlineCalibrator)
            else OnlineCalibrator() if online_calibration else None)
        if keep_alive_calibration is None:
            keep_alive_calibration = bool(online_calibration)
        self.keep_alive_calibrator: OnlineCalibrator | None = (
            keep_alive_calibration if isinstance(keep_alive_calibration, OnlineCalibrator)
            else keep_alive_calibrator() if keep_alive_calibration else None)
        self.keep_alive_selector: KeepAliveSelector | None = (
            keep_alive_selection if isinstance(keep_alive_selection, KeepAliveSelector)
            else KeepAliveSelector() if keep_alive_selection else None)
        # (profile, its idle-gap quantile, {calibration key: tail slope}): per profile, bounded by it
        #: per compiled profile: its idle-gap quantile, the slope per key, the types served through
        #: the level's dead band (their fitted TTL held nominal on the training side's future)
        self._ka_slopes: tuple[CompiledProfile | None, float | None, dict, dict] = (None, None, {}, {})
        self.prompt_composition_agents = int(prompt_composition_agents)
        self.clock = clock
        self._model: CompiledProfile | None = None
        self._lock = threading.Lock()
        self._count_lock = threading.Lock()
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
            profile = load_profile(profile)
        compiled = CompiledProfile(profile.data, profile.version, max_tools=self.max_tools,
                                   paths_class=WorkflowPaths)
        compiled.manifest = getattr(profile, "manifest", {}) or {}
        compiled.path = getattr(profile, "path", None)
        if self.gate is not None:
            self.gate.on_profile(compiled.workflow_type_calls, compiled.coverage,
                                 first=self._model is None)
        self._model = compiled            # the atomic swap: one reference assignment
        if self.remaining_selector is not None:   # the evidence was about the old fitted candidates
            self.remaining_selector.reset()
        if self.keep_alive_selector is not None:   # its evidence starts from the fit's forward replay
            self.keep_alive_selector.reset()
            if compiled.idle_gap is not None:
                self.keep_alive_selector.warm_start({wt: info.get("selection_warm_start") for wt, info
                                                     in compiled.idle_gap.workflow_types_.items()})
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
        return len(self.sessions)

    @property
    def max_sessions(self) -> int:
        return self.sessions.max_sessions

    @property
    def max_session_bytes(self) -> int:
        return self.sessions.max_session_bytes

    @property
    def session_idle_s(self) -> float:
        return self.sessions.session_idle_s

    def expire_idle(self) -> int:
        """Forget idle sessions now; returns how many are left."""
        with self._lock:
            self.sessions.expire(self.clock())
            return len(self.sessions)

    def memory_stats(self) -> dict:
        """Session-table memory: estimated bytes, limits and evictions by reason."""
        return self.sessions.memory_stats()

    def session_table_free(self, timeout_s: float) -> bool:
        """Whether the session table becomes free within ``timeout_s`` (another thread may hold
        it: a profile swap's replay, the autoscale scan). A caller with a time budget asks this
        first, so the budget is a bound and not a hope; the table is not held afterwards."""
        if not self._lock.acquire(timeout=timeout_s):
            return False
        self._lock.release()
        return True

    def warm_up(self, limit: int = 5000) -> int:
        """Annotate once per (workflow type, agent) of the profile (at most ``limit``) without
        advancing anything, then forget the probe sessions, so that the first real call of each
        finds every lazy structure built. Returns the number of probes."""
        m = self._model
        if m is None:
            return 0
        pairs = list(m.agents)[:limit]
        for wt, agent in pairs:
            self.annotate_call({"workflow_type_id": wt, "workflow_id": WARMUP_SESSION,
                                "agent_id": agent}, advance=False)
        with self._lock:
            for wt, _ in pairs:
                self.sessions.forget((wt, WARMUP_SESSION))
        return len(pairs)

    @staticmethod
    def _band(m: CompiledProfile, s: Session, agent: str, entry: AgentEntry, input_tokens: Any,
              agent_call_index: int) -> Band | None:
        """The band of a call by ``agent`` in session ``s`` (its history feeds the conditional
        model); None, logged, when the estimator entry fails: never an exception."""
        features = {"prev_agent_output_tokens": s.last_output.get(agent), "input_tokens": input_tokens,
                    "agent_call_index": agent_call_index}
        try:
            return m.band(s.workflow_type_id, agent, entry, features)
        except Exception as exc:  # a broken estimator entry must not fail the request
            log.warning("output band for %s/%s failed: %s", s.workflow_type_id, agent, exc)
            return None

    def _calibrated(self, m: CompiledProfile, wt: str, agent: str, entry: AgentEntry,
                    band: Band | None) -> tuple[Band | None, BandArms | None]:
        """``(served band, arms)``: ``band`` at the (type, agent)'s adapted level, or the global
        band at its own level where that arm is ahead, and both arms to score the outcome on
        (:mod:`predictors.online_calibration`; arms None without calibration)."""
        if band is None or self.calibrator is None:
            return band, None
        self.calibrator.set_nominal(m.coverage)
        key = self._calibration_key(m, wt, agent)
        arms = self.calibrator.arms(key, band, entry.upper_bounds, m.global_band)
        return self.calibrator.serve(key, arms), arms

    def _keep_alive(self, m: CompiledProfile, wt: str, agent: str, entry: AgentEntry,
                    gap_stats: tuple[float, int]) -> tuple[float | None, dict, KeepAliveServed | None]:
        """``(TTL, by-tool TTLs, what to score it as)`` served for a call by ``agent``:
        the idle-gap TTL (session-corrected, capped: ``CompiledProfile.keep_alive_ttl``) at the
        (type, agent)'s adapted keep-alive level, i.e. its quantile stretched by ``r_t`` along the
        entry's ``(median, quantile)`` tail (:func:`predictors.online_calibration.keep_alive_slope`,
        :meth:`~predictors.online_calibration.OnlineCalibrator.power_stretch`; the slope is
        computed once per profile and key), through the level's dead band for a type whose
        training-side future showed its fitted TTL above nominal
        (:meth:`~predictors.online_calibration.OnlineCalibrator.gated_stretch`,
        :func:`~predictors.keep_alive_compare.fitted_holds_forward`), elsewhere never shorter than the
        fitted TTL (:meth:`~predictors.online_calibration.OnlineCalibrator.served_stretch`); the
        fitted TTL without a calibrator. With the
        keep-alive selection, the type's candidate ahead on the gaps seen serves instead
        (:meth:`_keep_alive_candidates`; by-tool TTLs only with the fitted one)."""
        cal, key, fitted_ttl = self.keep_alive_calibrator, None, None
        if cal is None or entry.keep_alive is None or m.idle_gap is None:
            ttl, by_tool = m.keep_alive_ttl(entry, *gap_stats)
        else:
            if self._ka_slopes[0] is not m:
                q = m.sections.idle_gap_quantile
                self._ka_slopes = (m, q, {}, {t: fitted_holds_forward(info.get("selection_warm_start"),
                                                                       float(q or cal.nominal), cal.dead_band_forward_z)
                                              for t, info in m.idle_gap.workflow_types_.items()})
            _, quantile, slopes, banded = self._ka_slopes
            cal.set_nominal(quantile)
            key = self._calibration_key(m, wt, agent)
            if key not in slopes:          # agents the profile never saw share their type's entry
                e, _ = m.idle_gap.entry(wt, agent)
                slopes[key] = keep_alive_slope(e.get("p50_s") if e else None, entry.keep_alive.ttl_z, cal.alpha)
            r = cal.power_stretch(key, slopes[key])
            level_ttl, by_tool = m.keep_alive_ttl(entry, *gap_stats, scale=r)
            band = cal.dead_band_z > 0 and bool(banded.get(wt))   # the level's dead band
            g = cal.served_stretch(key, r, band)
            if band and level_ttl is not None:
                fitted_ttl = m.keep_alive_ttl(entry, *gap_stats)[0]
            ttl, by_tool = (level_ttl, by_tool) if g == r else m.keep_alive_ttl(entry, *gap_stats, scale=g)
        if ttl is None:
            return None, by_tool, None
        served = (KeepAliveServed(key, level_ttl, None, fitted_ttl) if key is not None else None)
        sel = self.keep_alive_selector
        if sel is None or m.idle_gap is None:
            return ttl, by_tool, served
        if m.sections.idle_gap_quantile:
            sel.nominal = float(m.sections.idle_gap_quantile)
        cands = (ttl, *self._keep_alive_candidates(m, wt, entry))
        i = sel.choose(wt, cands)
        return cands[i], by_tool if i == 0 else {}, KeepAliveServed(key, level_ttl if key is not None else ttl,
                                                                     cands, fitted_ttl)

    def _keep_alive_candidates(self, m: CompiledProfile, wt: str, entry: AgentEntry) -> tuple[float | None, ...]:
        """The TTLs of the keep-alive candidates after the fitted one
        (:data:`predictors.keep_alive_selection.CANDIDATES`): the type's plain training p95
        (``baseline_quantile_s``), the tool's p95 (``retain_s``; the keep/drop policy's default
        without one) and the give-up TTL (``coverable_quantile_s``: None where no training gap
        runs past the cap, or in a profile fitted before it)."""
        info = m.idle_gap.workflow_types_.get(wt) or {}
        give_up = info.get("coverable_quantile_s") if info.get("past_cap_share") else None
        return (info.get("baseline_quantile_s"),
                entry.retain_s if entry.retain_s is not None else HELD_TTL_DEFAULT_S,
                give_up)

    @staticmethod
    def _calibration_key(m: CompiledProfile | None, wt: str, agent: str) -> tuple[str, str]:
        """Agents the profile never saw share their type's key (the table stays bounded)."""
        return (wt, agent) if m is None or (wt, agent) in m.agents else (wt, UNSEEN_AGENT)

    # ----------------------------------------------------------------- annotate
    def annotate(self, app_metadata: Mapping[str, Any] | None, *, request_id: str | None = None,
                 input_tokens: int | None = None, advance: bool = True) -> dict:
        """sys_annotations JSON for one call (:meth:`annotate_call` rendered with
        ``Annotation.to_dict``); never raises on bad input."""
        return self.annotate_call(app_metadata, request_id=request_id, input_tokens=input_tokens,
                                  advance=advance).to_dict()

    def annotate_call(self, app_metadata: Mapping[str, Any] | None, *, request_id: str | None = None,
                      input_tokens: int | None = None, advance: bool = True) -> Annotation:
        """The annotation contract for one call (docs/serving.md); never raises on bad input.

        ``request_id`` makes the session advance idempotent (and lets :meth:`observe` score the
        band this call was given); ``input_tokens`` feeds the conditional output-length model;
        ``advance=False`` asks "what would you say" without changing the session. ``priority``
        is left empty (docs/serving.md: the serving layer sets it).
        """
        ann = self._annotate(app_metadata, request_id, input_tokens, advance)
        with self._count_lock:
            self.annotations_total += 1
            self.annotations_unknown += not ann.known
        return ann

    def _annotate(self, app_metadata: Any, request_id: str | None, input_tokens: int | None,
                  advance: bool) -> Annotation:
        """One call's annotation: step its session and compute its figures under the lock, then
        say why it is unknown, or fill in the figures."""
        m = self._model
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        ids = [meta.get(k) for k in ID_KEYS]
        base = Annotation(m.version if m is not None else None, False,
                          *(str(v) if isinstance(v, (str, int)) and not isinstance(v, bool) and v != ""
                            else None for v in ids))
        base = replace(base, latency_class=latency_class(meta.get("latency_class"), base.workflow_type_id, m))
        missing = [k for k, v in zip(ID_KEYS, ids) if v is None or v == "" or not isinstance(v, (str, int))]
        if missing:
            return replace(base, reason="missing_app_metadata", detail="app_metadata lacks " + ", ".join(missing))
        wt, wf, agent = (str(v) for v in ids)
        now = self.clock()
        with self._lock:
            s = self.sessions.get(wt, wf, now)
            first_time = request_id is None or request_id not in s.pending
            if advance and first_time:
                self._step_session(m, s, agent, meta, now)
            issued_at = now if first_time else s.pending[request_id].issued_at
            session_age = max(0.0, issued_at - (s.started_at if s.started_at is not None else issued_at))
            if m is None:
                self.sessions.account(s)
                return replace(base, reason="no_profile")
            figures = self._figures(m, s, agent, request_id, input_tokens, advance, first_time, issued_at,
                                    session_age)
            self.sessions.account(s)
        why = self._unknown_reason(m, wt, agent, figures)
        if why is not None:
            return replace(base, reason=why[0], detail=why[1])
        return replace(base, **self._known_fields(m, wt, figures))

    def _step_session(self, m: CompiledProfile | None, s: Session, agent: str, meta: Mapping[str, Any],
                      now: float) -> None:
        """Advance ``s`` by a new call: its reported tools and stage, and the idle gap it ends."""
        # the caller may say what the previous response called (app_metadata tool_names)
        self.sessions.mark_tools(m, s, None, meta.get("tool_names"))
        # and the step this call runs in (app_metadata stage): a context input
        self.sessions.advance(m, s, agent, meta.get("stage"))
        if s.idle_since is not None and s.idle_median and now >= s.idle_since:
            s.gap_log_sum += math.log(max(now - s.idle_since, MIN_GAP_S) / max(s.idle_median, MIN_GAP_S))
            s.gap_n += 1
        served = s.keep_alive_served
        if served is not None and s.idle_since is not None and now >= s.idle_since:
            # the idle gap just ended: an outcome of the TTL served for the call before,
            # judged against the TTL the keep/drop policy holds (bounded), as eval scores it;
            # the level learns on the fitted TTL's hit whichever candidate served
            if self.keep_alive_calibrator is not None and served.key is not None:
                self.keep_alive_calibrator.update(served.key, now - s.idle_since <= held_ttl_s(served.ttl_s))
                if served.fitted_ttl_s is not None:   # the dead band's evidence: the TTL unstretched
                    self.keep_alive_calibrator.record_fitted(
                        served.key, now - s.idle_since <= held_ttl_s(served.fitted_ttl_s))
            if self.keep_alive_selector is not None and served.candidates is not None:
                self.keep_alive_selector.record(s.workflow_type_id, now - s.idle_since, served.candidates)
        s.idle_since = None
        s.keep_alive_served = None

    def _figures(self, m: CompiledProfile, s: Session, agent: str, request_id: str | None,
                 input_tokens: Any, advance: bool, first_time: bool, issued_at: float,
                 session_age: float) -> _CallFigures:
        """The call's figures (path state, remaining work, band, keep-alive), kept as pending."""
        wt = s.workflow_type_id
        gap_stats = (s.gap_log_sum, s.gap_n)
        state = self.sessions.path_state(m, s)
        context = PathContext(tuple(s.tail), s.calls, *self.sessions.served_context(s))
        remaining, rw_index = self._remaining(m, s, agent, advance and first_time, 1 if advance else 0,
                                              issued_at, session_age)
        entry = m.agents.get((wt, agent))
        if entry is None and self.agent_fallback:
            entry = m.unseen_agent.get(wt)     # an agent the profile never saw: its type's
        band = fitted = arms = None
        ttl, by_tool, ka_served = None, {}, None
        if entry is not None:
            fitted = self._band(m, s, agent, entry, input_tokens,
                                max(s.agent_calls.get(agent, 0) - (1 if advance else 0), 0))
            band, arms = self._calibrated(m, wt, agent, entry, fitted)
            ttl, by_tool, ka_served = self._keep_alive(m, wt, agent, entry, gap_stats)
        if request_id is not None and advance and first_time:
            s.pending[request_id] = PendingCall(agent, band, issued_at, fitted, ka_served, rw_index, arms)
        elif not first_time:
            band = s.pending[request_id].band    # a retried annotate is served the same band
            if len(s.pending) > 64:
                s.pending.popitem(last=False)
        return _CallFigures(entry, band, ttl, by_tool, remaining, state, context, session_age)

    def _remaining(self, m: CompiledProfile, s: Session, agent: str, log: bool, done: int,
                   issued_at: float, session_age: float) -> tuple[RemainingWork | None, int]:
        """``(remaining work served, its slot in the session's log)``: the fit's served figure,
        or the candidate the online selection serves now (``done``: 1 when this call is already
        counted in the session; ``log``: keep every candidate's figure, scored when it ends)."""
        args = (s.workflow_type_id, s.calls - done, agent, s.out_sum, s.out_expected,
                s.agent_calls.get(agent, 0) - done, session_age)
        sel = self.remaining_selector
        if sel is None or m.remaining is None or s.workflow_type_id not in m.remaining.workflow_types_:
            return m.remaining_output(*args), -1
        figures = {c: m.remaining_output(*args, candidate=c) for c in sel.candidates}
        rw_index = self._log_remaining(s, [f.expected for f in figures.values()], issued_at) if log else -1
        served = sel.served(s.workflow_type_id) or m.remaining.served_candidate(s.workflow_type_id)
        return figures[served], rw_index

    def _unknown_reason(self, m: CompiledProfile, wt: str, agent: str,
                        f: _CallFigures) -> tuple[str, str | None] | None:
        """``(reason, detail)`` the call gets no prediction for, or None when it gets one."""
        if wt not in m.workflow_type_calls:
            if self.gate is not None:
                self.gate.note_unknown(wt)
            return "unknown_workflow_type", None
        if self.gate is not None and self.gate.is_shadowed(wt):
            return "shadow", self.gate.reason(wt) or None
        if f.entry is None:
            return "unknown_agent", None
        if f.band is None or (f.band.level == "global" and not self.agent_fallback
                              and m.global_for_lack_of_data(wt, agent)):
            return "too_little_data", f"agent {agent!r} has {f.entry.calls} calls: only the global band applies"
        paths = m.paths.get(wt)
        if paths is not None and f.state is None and not getattr(paths, "has_sequence_model", False):
            return "off_path", "the session left the dominant paths of the automaton"
        return None

    def _known_fields(self, m: CompiledProfile, wt: str, f: _CallFigures) -> dict[str, Any]:
        """The contract's fields of a predicted call: band, tools, keep-alive, paths, remaining work."""
        entry, band, ttl = f.entry, f.band, f.ttl
        fields: dict[str, Any] = dict(
            known=True, predicted_output_len=(band.lo, band.hi), output_len_coverage=m.coverage,
            output_len_level=band.level, output_len_mean=entry.mean_output,
            output_len_upper=entry.upper_bounds, session_age_s=f.session_age,
            tool_latency=entry.tool_latency, retain_s=entry.retain_s, keep_alive_ttl_s=ttl,
            keep_alive_ttl_by_tool=f.by_tool if ttl is not None else {})
        paths = m.paths.get(wt)
        if paths is not None:
            fields.update(self._path_fields(paths, f.state, f.context))
        remaining = f.remaining
        if remaining is not None:
            speed = m.decode_tok_s(wt)
            fields.update(expected_remaining_output_tokens=remaining.expected,
                          remaining_output_tokens_p50=remaining.p50,
                          remaining_output_tokens_p90=remaining.p90,
                          expected_remaining_decode_s=remaining.expected / speed if speed else None)
        return fields

    def _path_fields(self, paths: Any, state: Any,
                     context: PathContext | None = None) -> dict[str, Any]:
        """Path fields of the contract: from the sequence model (``paths.predict_at``: next
        agents, p_end and remaining work after the session's last agents, on the automaton or
        off it) when the profile has one, else from the automaton state."""
        out: dict[str, Any] = {}
        if context is not None and getattr(paths, "has_sequence_model", False):
            est = paths.predict_at(state, context.history, context.calls, context.tools, context.marks)
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

    # --- retry-safe sessions: undo the advance of a call that failed upstream -------------------
    def cancel(self, app_metadata: Mapping[str, Any] | None, request_id: str) -> bool:
        """Roll back the session advance of an annotated call that failed upstream (its pending
        entry is dropped and the agent step undone); a retry with the same ``request_id`` then
        advances afresh. False when ``request_id`` was not pending."""
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        wt, wf = meta.get("workflow_type_id"), meta.get("workflow_id")
        if wt is None or wf is None:
            return False
        with self._lock:
            s = self.sessions.find(str(wt), str(wf))
            pending = s.pending.pop(request_id, None) if s is not None else None
            if pending is None:
                return False
            done = self.sessions.retract(s, pending.agent)
            if pending.remaining_slot >= 0 and s.rw_log is not None:
                s.rw_log[RW_STRIDE * pending.remaining_slot] = math.nan   # a call that never happened: not scored
            self.sessions.account(s)
            return done
    # --- end of `dialects` addition ------------------------------------------------------------

    # ------------------------------------------------------------------ observe
    def observe(self, completion: Mapping[str, Any]) -> bool | None:
        """Record a finished call: ``{"app_metadata" | workflow_type_id/workflow_id/agent_id,
        "request_id", "output_tokens", "input_tokens"?, "t_finish"?, "response_text"?,
        "tool_names"?, "status"?}``. ``tool_names`` (the tools the response called; [] for none)
        marks the call in the session's context (the sequence model's tool-marked context and
        a remaining-work model over tool names read it); the caller may instead pass the
        previous response's ``tool_names`` in the next call's ``app_metadata``.

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
            s = self.sessions.get(wt, wf, now)
            pending = s.pending.pop(request_id, None) if request_id is not None else None
            if pending is None:
                band = fitted = ka_served = arms = None
                if m is not None and (wt, agent) in m.agents:
                    entry = m.agents[(wt, agent)]
                    fitted = self._band(m, s, agent, entry, completion.get("input_tokens"),
                                        s.agent_calls.get(agent, 0))
                    band, arms = self._calibrated(m, wt, agent, entry, fitted)
                    ka_served = self._keep_alive(m, wt, agent, entry, (s.gap_log_sum, s.gap_n))[2]
                self.sessions.advance(m, s, agent, meta.get("stage"))
            else:
                band, fitted, ka_served, arms = pending.band, pending.fitted, pending.keep_alive, pending.arms
            self.sessions.mark_tools(m, s, agent, completion.get("tool_names"))
            if isinstance(out, (int, float)) and not isinstance(out, bool) and completion.get("status", "ok") == "ok":
                s.last_output[agent] = int(out)
                expected = m.remaining.agent_mean(wt, agent) if m is not None and m.remaining is not None else None
                if expected is not None:      # the session factor of the remaining-tokens model
                    s.out_sum += max(0.0, float(out))
                    s.out_expected += expected
                if s.rw_log is not None:      # this call's output, for the session's true remaining work
                    self._log_output(s, pending.remaining_slot if pending is not None else None, max(0.0, float(out)))
            if completion.get("t_finish") is not None:
                s.last_finish = completion.get("t_finish")
            ka = m.agents.get((wt, agent)) if m is not None else None
            s.idle_since = now                     # the session's KV is idle from here
            s.keep_alive_served = ka_served        # and is kept this long (scored at the next arrival)
            s.idle_median = ka.keep_alive.median_s if ka is not None and ka.keep_alive is not None else None
            if completion.get("response_text") is not None:
                self.sessions.remember_text(s, {"request_id": request_id, "agent_id": agent,
                                        "response_text": completion.get("response_text")})
            self.sessions.account(s)
            if meta.get("last_call") is True and self.remaining_selector is not None:
                # the client says this call was the session's last: its true remaining work is known
                if self.sessions.end((wt, wf)) is not None:
                    self._score_ended(s, now)
        if band is None or not isinstance(out, (int, float)) or isinstance(out, bool):
            return None
        hit = band.lo <= out <= band.hi
        if self.calibrator is not None:
            key = self._calibration_key(m, wt, agent)
            if arms is not None:           # each arm's level and the switch between them
                self.calibrator.record(key, float(out), arms)
            else:
                self.calibrator.update(key, hit)
        if m is not None:
            self.coverage_monitor.set_nominal(m.coverage)
        # the drift alarm judges the fitted profile (is a refit due?), not the calibrated band
        self.coverage_monitor.record(wt, fitted is not None and fitted.lo <= out <= fitted.hi)
        if self.gate is not None:
            self.gate.record(wt, hit)
        return hit

    # ---------------------------------------------- remaining work: online selection
    @staticmethod
    def _log_remaining(s: Session, figures: list[float], issued_at: float) -> int:
        """Keep a call's remaining-work figures (one per candidate); its slot (-1: past
        MAX_SCORED_CALLS)."""
        if s.rw_log is None:
            s.rw_log = array("d")
        index = len(s.rw_log) // RW_STRIDE
        if index >= MAX_SCORED_CALLS:
            return -1
        s.rw_log.extend((*figures, issued_at, math.nan))
        return index

    @staticmethod
    def _log_output(s: Session, index: int | None, out: float) -> None:
        """A finished call's output: into its slot (a call observed without an annotation: the
        first slot still waiting), else into every kept call's remaining work (``rw_extra``)."""
        log_ = s.rw_log
        if index is None:
            index = next((j // RW_STRIDE for j in range(RW_STRIDE - 1, len(log_), RW_STRIDE)
                          if math.isnan(log_[j])), -1)
        if 0 <= index < len(log_) // RW_STRIDE and math.isnan(log_[RW_STRIDE * index + RW_STRIDE - 1]):
            log_[RW_STRIDE * index + RW_STRIDE - 1] = out
        else:
            s.rw_extra += out

    def _score_ended(self, s: Session, ended_at: float) -> None:
        """A session's workflow ended: each kept call's true remaining work is now known; feed
        its candidates' figures to the selector (:mod:`predictors.online_selection`)."""
        if self.remaining_selector is None or s.rw_log is None or not len(s.rw_log):
            return
        rows = np.frombuffer(s.rw_log, dtype=float).reshape(-1, RW_STRIDE)  # figures…, arrival, output
        truth = np.cumsum(np.nan_to_num(rows[::-1, -1]))[::-1] + s.rw_extra   # R_i = Σ_{j ≥ i} o_j
        m = self._model
        start = (m.remaining.served_candidate(s.workflow_type_id)
                 if m is not None and m.remaining is not None else "fitted")
        self.remaining_selector.record(s.workflow_type_id, rows[:, :-2], truth, rows[:, -2], ended_at, start)
        s.rw_log = None

    def end_session(self, app_metadata: Mapping[str, Any] | None) -> bool:
        """The session of ``app_metadata`` (``workflow_type_id``, ``workflow_id``) ended: score its
        remaining-work figures (online selection) and forget it. False when not held."""
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        wt, wf = meta.get("workflow_type_id"), meta.get("workflow_id")
        if wt is None or wf is None:
            return False
        with self._lock:
            s = self.sessions.end((str(wt), str(wf)))
            if s is None:
                return False
            self._score_ended(s, self.clock())
            return True

    def session_view(self, workflow_type_id: str, workflow_id: str) -> dict | None:
        """A copy of one session's state (agents so far, last outputs, recent responses)."""
        with self._lock:
            s = self.sessions.find(workflow_type_id, workflow_id)
            if s is None:
                return None
            m = self._model
            state = self.sessions.path_state(m, s) if m is not None else None
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
            return [st for s in self.sessions.values() if s.workflow_type_id == workflow_type_id
                    for st in [self.sessions.path_state(m, s)] if st is not None]

    def in_flight(self, workflow_type_id: str) -> dict[str, int]:
        """Calls annotated but not yet observed, per agent, over the live sessions of one
        workflow type (work the automaton state has already stepped past)."""
        with self._lock:
            out: dict[str, int] = {}
            for s in self.sessions.values():
                if s.workflow_type_id == workflow_type_id:
                    for call in s.pending.values():
                        out[call.agent] = out.get(call.agent, 0) + 1
            return out

    def stats(self) -> dict:
        return {"annotations": self.annotations_total, "unknown": self.annotations_unknown,
                "sessions": len(self.sessions), "profile_version": self.version}
