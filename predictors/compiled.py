"""``CompiledProfile``: a profile turned into per-call lookup structures, once.

:meth:`predictors.Predictor.load` compiles ``profile.json`` into this object and swaps it in with
one reference assignment; it is immutable once built, so every request thread shares it.
What never changes between calls of one (workflow type, agent) — its tools, static band, bound
table, mean output, keep-alive entry — is precomputed into an :class:`AgentEntry`.

The estimator sections are read with the serving-time readers of :mod:`predictors.served`
(numpy and the standard library), and the workflow automata with the ``paths_class`` the caller
passes (``synth.session.WorkflowPaths``, numpy only), so compiling a profile imports neither
pandas, scipy nor scikit-learn.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, NamedTuple

from predictors.contract import TOOL_FIELDS, ToolLatency
from predictors.served import (MAX_FACTOR, Band, IdleGapTable, OutputBands, RemainingTokensTable,
                              RemainingWork, ToolLatencyTable)
from synth.remaining import position_bucket

log = logging.getLogger(__name__)


#: The agent name the unseen-agent entries are looked up with (no real agent is called that).
UNSEEN_AGENT = "\x00unseen-agent"


class KeepAliveEntry(NamedTuple):
    """An agent's fitted idle-gap entry, read once at compile time: what its keep-alive TTL is
    served from (:meth:`CompiledProfile.keep_alive_ttl`)."""

    ttl_z: float                   # the idle-gap TTL (the entry's z-quantile of the gap, seconds)
    median_s: float | None         # the entry's median gap (the session correction's unit)
    prior_weight: float | None     # pseudo-gaps of the session correction's prior (None: no correction)
    by_tool: dict[str, float]      # {tool: ttl_z} where the type is fitted at the tool level


@dataclass(frozen=True)
class AgentStats:
    """One agent's entry of the profile's ``agents`` section (per workflow type), typed."""

    calls: int                         # its calls in the training logs (0: not written)
    tools: dict[str, int]              # calls per tool it called
    decode_tok_s: float | None         # its decode speed (None in an order-only profile)

    @classmethod
    def from_dict(cls, d: Any) -> "AgentStats":
        d = d if isinstance(d, Mapping) else {}
        speed = d.get("decode_tok_s")
        return cls(int(d.get("calls") or 0), dict(d.get("tools") or {}), float(speed) if speed else None)


@dataclass(frozen=True)
class ProfileSections:
    """The plain (non-estimator) sections of ``profile.json`` the Predictor reads, typed and read
    once at compile time; the estimator sections have their readers in :mod:`predictors.served`.
    The file's format is unchanged: this is a view of it."""

    workflow_type_calls: dict[str, int]            # ``workflow_types``: calls per type
    interactive_types: frozenset[str]              # ``human_wait``: types where a person took a turn
    agents: dict[str, dict[str, AgentStats]]       # ``agents``: per type, per agent
    idle_gap_quantile: float | None                # ``idle_gap.params.quantile``: the TTL's nominal level

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ProfileSections":
        wts = data.get("workflow_types") or {}
        return cls(
            workflow_type_calls={wt: int((v or {}).get("calls", 0)) for wt, v in wts.items()},
            interactive_types=frozenset(wt for wt, v in (data.get("human_wait") or {}).items()
                                        if int((v or {}).get("waits", 0)) > 0),
            agents={wt: {a: AgentStats.from_dict(v) for a, v in (agents or {}).items()}
                    for wt, agents in (data.get("agents") or {}).items()},
            idle_gap_quantile=((data.get("idle_gap") or {}).get("params") or {}).get("quantile"))


@dataclass
class AgentEntry:
    """What never changes between calls of one (workflow type, agent)."""

    calls: int
    tool_latency: dict[str, ToolLatency]
    static_band: Band | None                   # None: the conditional model needs features
    retain_s: float | None = None              # keep-alive TTL of the agent's most frequent tool
    upper_bounds: tuple = ()                   # ((α, U(α)), …) one-sided output bounds
    mean_output: float | None = None           # mean output tokens of the agent
    keep_alive: KeepAliveEntry | None = None   # the idle-gap entry (None: no idle-gap section)


class CompiledProfile:
    """A profile turned into lookup structures; immutable once built (safe to share across threads).

    ``paths_class`` compiles each workflow type's automaton (``synth.session.WorkflowPaths``, what
    the ``Predictor`` passes); None skips them (callers that need only the per-agent entries)."""

    def __init__(self, data: Mapping[str, Any], version: str, *, max_tools: int = 3,
                 paths_class: Any = None) -> None:
        self.version = version
        self.data = data
        #: the plain sections, typed (the estimator sections follow, each with its reader)
        self.sections = sections = ProfileSections.from_dict(data)
        self.manifest: dict = {}
        self.path: Path | None = None
        ol = data.get("output_length")
        self.bands = OutputBands.from_dict(ol) if ol else None
        self.coverage = float(ol["coverage"]) if ol else None
        #: the global band ``(lo, hi, "global")``: every agent's second arm online
        #: (:meth:`predictors.online_calibration.OnlineCalibrator.arms`, ``alternative``)
        self.global_band: Band | None = None
        if self.bands is not None and self.bands.global_:
            g = self.bands.global_
            self.global_band = Band(int(g["lo"]), int(g["hi"]), "global")
        tl = data.get("tool_latency")
        self.tools = ToolLatencyTable.from_dict(tl) if tl else None
        ig = data.get("idle_gap")
        self.idle_gap = IdleGapTable.from_dict(ig) if ig else None
        rt = data.get("remaining_tokens")
        self.remaining = RemainingTokensTable.from_dict(rt) if rt else None
        self.workflow_type_calls: dict[str, int] = dict(sections.workflow_type_calls)
        #: Workflow types in which the profile saw a person take a turn (``human_wait``): their
        #: sessions are latency class ``interactive`` (:func:`latency_class`).
        self.interactive_types: frozenset[str] = sections.interactive_types
        if self.bands is not None:
            for wt, band in self.bands.workflow_types_.items():
                self.workflow_type_calls.setdefault(wt, int(band.get("n", 0)))
        self.agents: dict[tuple[str, str], AgentEntry] = {}
        agent_stats = sections.agents
        band_agents = self.bands.agents_ if self.bands is not None else {}
        for wt in set(agent_stats) | set(band_agents):
            for agent in set(agent_stats.get(wt, {})) | set(band_agents.get(wt, {})):
                self.agents[(wt, agent)] = self._agent_entry(wt, agent, agent_stats.get(wt, {}).get(agent),
                                                             max_tools)
        self._decode_speed = self._decode_speeds(agent_stats)
        #: per workflow type, the entry an agent the profile never saw is served (its band, upper
        #: bounds and idle-gap TTL backed off to the workflow type's level; no tools of its own)
        self.unseen_agent: dict[str, AgentEntry] = {
            wt: self._agent_entry(wt, UNSEEN_AGENT, None, max_tools) for wt in self.workflow_type_calls}
        self.paths: dict[str, Any] = {}
        self.path_errors: dict[str, str] = {}
        if paths_class is not None:
            for wt, section in (data.get("workflows") or {}).items():
                try:
                    self.paths[wt] = paths_class.from_section(section)
                except Exception as exc:  # a bad section costs that type its path fields only
                    self.path_errors[wt] = f"{type(exc).__name__}: {exc}"
                    log.warning("profile %s: workflow automaton of %r not usable: %s", version, wt, exc)

    def _agent_entry(self, wt: str, agent: str, stats: AgentStats | None, max_tools: int) -> AgentEntry:
        tools: dict[str, dict] = {}
        counts = stats.tools if stats is not None else {}
        if self.tools is not None:
            for name in sorted(counts, key=lambda t: (-counts[t], t))[:max_tools]:
                entry = self.tools.lookup(wt, name)
                if entry:
                    tools[name] = ToolLatency(*(entry.get(k) for k in TOOL_FIELDS))
        static = None
        if self.bands is not None:
            band, level = self.bands.lookup(wt, agent)
            if not band.get("conditional"):
                static = Band(int(band["lo"]), int(band["hi"]), level)
        calls = int((stats.calls if stats is not None else 0)
                    or (self.bands.agents_.get(wt, {}).get(agent, {}).get("n", 0) if self.bands is not None else 0))
        upper: tuple = ()
        mean_out = None
        if self.bands is not None:
            upper = tuple((float(a), int(u)) for a, u in self.bands.upper_bounds(wt, agent))
            mean_out = (self.bands.agents_.get(wt, {}).get(agent) or {}).get("mean")
        return AgentEntry(calls=calls, tool_latency=tools, static_band=static,
                           retain_s=self.tools.retain_s(wt, counts, max_tools) if self.tools is not None else None,
                           upper_bounds=upper, mean_output=mean_out,
                           keep_alive=self._keep_alive(wt, agent, tools))

    def _keep_alive(self, wt: str, agent: str, tools: Mapping[str, dict]) -> KeepAliveEntry | None:
        """The agent's idle-gap entry (None without one)."""
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
        return KeepAliveEntry(float(e["ttl_z"]), self.idle_gap.median(wt, agent),
                              self.idle_gap.prior_weight(wt), by_tool)

    def keep_alive_ttl(self, entry: AgentEntry, log_sum: float, n: int,
                       scale: float = 1.0) -> tuple[float | None, dict]:
        """Served idle-gap TTL and by-tool TTLs for a session with ``n`` earlier gaps whose
        ``Σ ln(gap/median)`` is ``log_sum``: ``c · Q_q(z)``, ``c = exp(clip(log_sum / (n + w), ±ln 8))``;
        ``scale`` stretches the quantiles before the cap (the online keep-alive level's ``r_t``)."""
        if entry.keep_alive is None or self.idle_gap is None:
            return None, {}
        ttl_z, w, by_tool = entry.keep_alive.ttl_z, entry.keep_alive.prior_weight, entry.keep_alive.by_tool
        c = 1.0 if w is None else math.exp(max(-math.log(MAX_FACTOR),
                                                min(math.log(MAX_FACTOR), log_sum / (n + w))))
        cap = self.idle_gap.max_ttl_s
        c *= scale
        serve = (lambda z: min(c * z, cap)) if cap is not None else (lambda z: c * z)
        return (serve(ttl_z) if math.isfinite(ttl_z) or cap is not None else None,
                {k: serve(v) for k, v in by_tool.items()})

    def decode_tok_s(self, wt: str) -> float | None:
        """The workflow type's decode speed (tokens/s): its agents' ``decode_tok_s`` weighted by
        calls; None in an order-only profile."""
        return self._decode_speed.get(wt)

    @staticmethod
    def _decode_speeds(agent_stats: Mapping[str, Mapping[str, AgentStats]]) -> dict[str, float]:
        out = {}
        for wt, agents in agent_stats.items():
            speeds = [(v.decode_tok_s, v.calls or 1) for v in agents.values() if v.decode_tok_s]
            if speeds:
                out[wt] = sum(x * n for x, n in speeds) / sum(n for _, n in speeds)
        return out

    def remaining_output(self, wt: str, calls_done: int, agent: str, out_so_far: float,
                         expected_so_far: float, agent_calls: int = 0,
                         elapsed_s: float | None = None,
                         candidate: str | None = None) -> RemainingWork | None:
        """The :class:`~predictors.served.RemainingWork` ``(R̂, p50, p90)``: remaining output tokens of a session at a call by ``agent`` after
        ``calls_done`` calls, ``agent_calls`` of them by ``agent``
        (:class:`predictors.served.RemainingTokensTable`); None without the section or the type.
        ``candidate``: one of :data:`predictors.served.RW_CANDIDATES` in place of the type's
        served one (the online selection's other candidates)."""
        if self.remaining is None:
            return None
        params = self.remaining.candidate_params(wt, candidate) if candidate is not None else None
        return self.remaining.predict(wt, position_bucket(max(0, calls_done)), agent, out_so_far,
                                      expected_so_far, max(0, agent_calls), elapsed_s, max(0, calls_done),
                                      params=params)

    def global_for_lack_of_data(self, wt: str, agent: str) -> bool:
        """True when the agent is served the global band because it has too little data (a
        degenerate agent, or a profile written before bands were chosen by validation), False
        when held-out validation chose the global band as the narrowest that holds coverage."""
        if self.bands is None:
            return True
        band, level = self.bands.lookup(wt, agent)
        return level == "global" and ("selection" not in band or bool(band.get("fallback_reason")))

    def band(self, wt: str, agent: str, entry: AgentEntry, features: Mapping) -> Band | None:
        if entry.static_band is not None:
            return entry.static_band
        if self.bands is None:
            return None
        return self.bands.predict_band(wt, agent, features)


#: Latency classes of ``Annotation.latency_class``.
LATENCY_CLASSES = ("interactive", "batch")


def latency_class(declared: Any, workflow_type: str | None, profile: "CompiledProfile | None") -> str | None:
    """A session's latency class: what the client declared (``app_metadata.latency_class``,
    ``"interactive"`` or ``"batch"``) wins; else ``"interactive"`` when the profile saw a person
    take a turn in the workflow type (its ``human_wait`` section: calls marked
    ``wait_after = human``), ``"batch"`` for another type the profile knows, None otherwise."""
    if isinstance(declared, str) and declared.strip().lower() in LATENCY_CLASSES:
        return declared.strip().lower()
    if profile is None or workflow_type is None:
        return None
    if workflow_type in profile.interactive_types:
        return "interactive"
    return "batch" if workflow_type in profile.workflow_type_calls else None
