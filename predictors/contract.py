"""The annotation contract: one typed model of the per-call prediction message.

The predictor's answer for one LLM call travels in several shapes — the nested JSON
``sys_annotations`` (what the sidecar returns and the gateway splices into a request), SGLang's
flat ``custom_params`` dict of scalars plus its integer ``priority``, the policies' typed
:class:`~serving_hooks.policies.annotations_view.CallView`, and engine dialects rendered from
:meth:`Annotation.flat`. All of them are derived from :class:`Annotation` by the functions of this
module, so **a field is added in one place**: declare it here, fill it in
``predictors.predictor.Predictor``, and every rendering, the sidecar's OpenAPI schema and the
parsers follow.

=====================================  ==============================================================
function                               does
=====================================  ==============================================================
:meth:`Annotation.from_dict`           today's ``sys_annotations`` JSON (lenient: malformed → None)
:meth:`Annotation.to_dict`             → that JSON (absent values omitted; same keys as before)
:meth:`Annotation.flat`                → flat dict of scalars (``None`` = unknown), the engine-neutral
                                       form a dialect renders (SGLang ``custom_params`` keys)
:func:`to_sglang_custom_params`        → SGLang's ``custom_params`` (= :meth:`Annotation.flat`)
:func:`from_custom_params`             SGLang's ``custom_params`` → :class:`Annotation` (the plugin)
:meth:`Annotation.sglang_priority`     → SGLang's integer ``priority`` (or None)
=====================================  ==============================================================

Definitions every consumer shares
---------------------------------
* ``tool_p95_s`` (:attr:`Annotation.tool_p95_s`) is the p95 of the agent's **most frequent** tool:
  the first entry of ``tool_latency``, which the predictor orders by frequency — the same tool
  whose keep-alive TTL is ``retain_s``. A consumer that knows which tool the call runs (the
  simulator, once the response names it) asks :meth:`Annotation.tool_p95_of` that tool instead.
  (Before this contract the flat form used the first tool and ``CallView`` the largest p95.)
* ``next_agent``/``next_agent_p`` are the most likely next agent and its probability.
* ``certified_alpha`` of ``output_len_upper``: bounds below the band's ``certified_alpha`` are its
  ceiling (``predictors.output_length``); the table is served as the profile wrote it.

Only the standard library is imported here: the serving path (sidecar, gateway, SGLang plugin)
loads this module without pandas, scipy, scikit-learn, SGLang or an HTTP stack. It sits next to
the ``Predictor`` facade that emits it (the lowest layer that produces the message), so the
facade needs nothing from the layers above it; ``serving_hooks.policies`` re-exports it
(docs/architecture.md, "Annotation contract and policy bookkeeping").
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

#: Keys every annotation echoes from app_metadata.
ID_KEYS = ("workflow_type_id", "workflow_id", "agent_id")


def num(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` (bools, strings and NaN are not numbers here)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def text(value: Any) -> str | None:
    """A non-empty string, else None."""
    return value if isinstance(value, str) and value else None


def _ident(value: Any) -> str | None:
    """An id as the flat form carries it (ints become strings)."""
    if isinstance(value, bool) or value is None or value == "":
        return None
    return str(value) if isinstance(value, (str, int)) else None


def _upper_table(value: Any) -> tuple[tuple[float, int], ...]:
    """``[[α, U], …]`` → ``((α, U), …)`` sorted by α descending; malformed entries are skipped."""
    out = []
    for item in value or ():
        if isinstance(item, (list, tuple)) and len(item) == 2:
            a, u = num(item[0]), num(item[1])
            if a is not None and u is not None and 0.0 < a < 1.0:
                out.append((a, int(u)))
    return tuple(sorted(out, reverse=True))


@dataclass(frozen=True, slots=True)
class ToolLatency:
    """Lognormal latency of one tool (``ln t ~ N(mu, sigma²)``) and its served quantiles (s)."""

    mu: float | None = None
    sigma: float | None = None
    p50_s: float | None = None
    p95_s: float | None = None
    ttl_s: float | None = None

    @classmethod
    def from_dict(cls, value: Any) -> "ToolLatency | None":
        if not isinstance(value, Mapping):
            return None
        return cls(*(num(value.get(f)) for f in TOOL_FIELDS))

    def to_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in TOOL_FIELDS if getattr(self, f) is not None}


#: Fields of a tool-latency entry, in order.
TOOL_FIELDS = ("mu", "sigma", "p50_s", "p95_s", "ttl_s")


@dataclass(frozen=True, slots=True)
class NextAgent:
    """One possible next agent of the session and its probability."""

    agent_id: str
    p: float


@dataclass(frozen=True, slots=True)
class Annotation:
    """What the profile predicts for one LLM call (``sys_annotations``).

    ``known: false`` (unknown workflow type or agent, too little data, shadow mode, off path, no
    profile) carries only the ids, a ``reason`` and its ``detail``: serve the call reactively.
    """

    #: OpenAPI descriptions from the attribute docstrings (pydantic reads this dict, no import)
    __pydantic_config__ = {"use_attribute_docstrings": True}

    profile_version: str | None = None
    """version of the profile that made the prediction"""
    known: bool = False
    """true: the fields below are a prediction; false: serve the call reactively"""
    workflow_type_id: str | None = None
    """echoed from app_metadata"""
    workflow_id: str | None = None
    """echoed from app_metadata (the session)"""
    agent_id: str | None = None
    """echoed from app_metadata"""
    reason: str | None = None
    """why ``known`` is false: missing_app_metadata, no_profile, unknown_workflow_type, shadow, unknown_agent, too_little_data, off_path"""
    detail: str | None = None
    """human-readable detail of ``reason``"""
    predicted_output_len: tuple[int, int] | None = None
    """``(lo, hi)`` output-length band (tokens) at ``output_len_coverage``"""
    output_len_coverage: float | None = None
    """probability the output length falls in the band"""
    output_len_level: str | None = None
    """level the band was fit at: agent, workflow_type, global, conditional…"""
    output_len_mean: float | None = None
    """the agent's mean output length (tokens)"""
    output_len_upper: tuple[tuple[float, int], ...] = ()
    """``((α, U(α)), …)``, largest α first: one-sided (1 − α) upper bounds of the output length"""
    session_age_s: float | None = None
    """seconds since the session's first call (workflow-level aging)"""
    tool_latency: Mapping[str, ToolLatency] = field(default_factory=dict)
    """the agent's most frequent tools (most frequent first)"""
    retain_s: float | None = None
    """keep-alive TTL (SAGA) of the most frequent tool, when it has one"""
    keep_alive_ttl_s: float | None = None
    """keep-alive TTL from the idle gap (finish → the session's next call), session-scaled"""
    keep_alive_ttl_by_tool: Mapping[str, float] = field(default_factory=dict)
    """``{tool: TTL}`` when the idle-gap tool level validated"""
    next_agents: tuple[NextAgent, ...] = ()
    """possible next agents, most likely first"""
    predicted_path_regex: str | None = None
    """the workflow type's dominant paths as a regex over agents"""
    expected_remaining_calls: float | None = None
    """expected calls after this one"""
    expected_remaining_s: float | None = None
    """expected seconds of LLM and tool time left in the workflow"""
    remaining_calls_p50: float | None = None
    """median of the calls left (sequence model)"""
    remaining_calls_p90: float | None = None
    """0.9 quantile of the calls left (sequence model)"""
    expected_remaining_output_tokens: float | None = None
    """expected output tokens the session still has to generate, this call's included (the work
    an SRPT scheduler ranks by; ``predictors.remaining_tokens``)"""
    remaining_output_tokens_p50: float | None = None
    """median of the session's remaining output tokens"""
    remaining_output_tokens_p90: float | None = None
    """0.9 quantile of the session's remaining output tokens"""
    expected_remaining_decode_s: float | None = None
    """the remaining output tokens at the workflow type's measured decode speed (seconds)"""
    expected_distance: Mapping[str, float] = field(default_factory=dict)
    """expected distance in calls to each agent"""
    p_end: float | None = None
    """probability that no call follows this one"""
    on_path: bool | None = None
    """whether the session is on the automaton's dominant paths (sequence-model profiles)"""
    prompt_composition: Mapping[str, str] = field(default_factory=dict)
    """prompt templates of the likely next agents"""
    priority: int | None = None
    """SGLang integer priority (bigger runs first), when a priority policy is configured"""

    # ------------------------------------------------------------------ derived
    @property
    def output_lo(self) -> int | None:
        return self.predicted_output_len[0] if self.predicted_output_len else None

    @property
    def output_hi(self) -> int | None:
        return self.predicted_output_len[1] if self.predicted_output_len else None

    @property
    def next_agent(self) -> NextAgent | None:
        """The most likely next agent."""
        return self.next_agents[0] if self.next_agents else None

    @property
    def tool_p95_s(self) -> float | None:
        """p95 of the agent's most frequent tool (the first ``tool_latency`` entry; module doc)."""
        for entry in self.tool_latency.values():
            return entry.p95_s
        return None

    def tool_p95_of(self, tool: str | None) -> float | None:
        """p95 of ``tool`` (None: :attr:`tool_p95_s`)."""
        if tool is None:
            return self.tool_p95_s
        entry = self.tool_latency.get(tool)
        return entry.p95_s if entry is not None else None

    @property
    def upper_tail_alpha(self) -> float | None:
        """Risk of the band's ``hi`` alone: the upper tail ``(1 − coverage)/2`` of a 2-sided band."""
        return (1.0 - self.output_len_coverage) / 2 if self.output_len_coverage is not None else None

    def sglang_priority(self) -> int | None:
        """SGLang's top-level integer ``priority`` (None: let the engine decide)."""
        return self.priority

    # ------------------------------------------------------------------ parsing
    @classmethod
    def from_dict(cls, ann: Mapping[str, Any] | None,
                  app_metadata: Mapping[str, Any] | None = None) -> "Annotation":
        """Read the ``sys_annotations`` JSON (today's keys; malformed values become None).

        Ids missing from ``ann`` are taken from ``app_metadata``."""
        if isinstance(ann, Annotation):
            return ann
        a = ann if isinstance(ann, Mapping) else {}
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        band = a.get("predicted_output_len")
        lo_hi = None
        if isinstance(band, (list, tuple)) and len(band) == 2:
            lo, hi = num(band[0]), num(band[1])
            if lo is not None and hi is not None:
                lo_hi = (int(lo), int(hi))
        nexts = []
        for item in a.get("next_agents") or ():
            if isinstance(item, Mapping) and text(item.get("agent_id")) and num(item.get("p")) is not None:
                nexts.append(NextAgent(item["agent_id"], float(item["p"])))
        nexts.sort(key=lambda n: -n.p)
        tools = a.get("tool_latency")
        tool_map = {}
        if isinstance(tools, Mapping):
            for name, entry in tools.items():
                parsed = ToolLatency.from_dict(entry)
                if parsed is not None:
                    tool_map[str(name)] = parsed
        prio = num(a.get("priority"))
        on_path = a.get("on_path")

        def floats(value: Any) -> dict[str, float]:
            if not isinstance(value, Mapping):
                return {}
            return {str(k): float(v) for k, v in value.items() if num(v) is not None}

        comp = a.get("prompt_composition")
        ids = {k: _ident(a.get(k)) if a.get(k) is not None else _ident(meta.get(k)) for k in ID_KEYS}
        return cls(
            profile_version=text(a.get("profile_version")),
            known=a.get("known") is True,
            **ids,
            reason=text(a.get("reason")),
            detail=text(a.get("detail")),
            predicted_output_len=lo_hi,
            output_len_coverage=num(a.get("output_len_coverage")),
            output_len_level=text(a.get("output_len_level")),
            output_len_mean=num(a.get("output_len_mean")),
            output_len_upper=_upper_table(a.get("output_len_upper")),
            session_age_s=num(a.get("session_age_s")),
            tool_latency=tool_map,
            retain_s=num(a.get("retain_s")),
            keep_alive_ttl_s=num(a.get("keep_alive_ttl_s")),
            keep_alive_ttl_by_tool=floats(a.get("keep_alive_ttl_by_tool")),
            next_agents=tuple(nexts),
            predicted_path_regex=text(a.get("predicted_path_regex")),
            expected_remaining_calls=num(a.get("expected_remaining_calls")),
            expected_remaining_s=num(a.get("expected_remaining_s")),
            remaining_calls_p50=num(a.get("remaining_calls_p50")),
            remaining_calls_p90=num(a.get("remaining_calls_p90")),
            expected_remaining_output_tokens=num(a.get("expected_remaining_output_tokens")),
            remaining_output_tokens_p50=num(a.get("remaining_output_tokens_p50")),
            remaining_output_tokens_p90=num(a.get("remaining_output_tokens_p90")),
            expected_remaining_decode_s=num(a.get("expected_remaining_decode_s")),
            expected_distance=floats(a.get("expected_distance")),
            p_end=num(a.get("p_end")),
            on_path=on_path if isinstance(on_path, bool) else None,
            prompt_composition={str(k): v for k, v in comp.items() if isinstance(v, str)}
            if isinstance(comp, Mapping) else {},
            priority=int(prio) if prio is not None else None,
        )

    # ---------------------------------------------------------------- rendering
    def to_dict(self) -> dict[str, Any]:
        """The ``sys_annotations`` JSON: every field with a value (None, empty tables and empty
        maps omitted; ``profile_version``, ``known`` and the ids always present)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _ALWAYS:
                out[f.name] = value
            elif value is None or (isinstance(value, (tuple, Mapping)) and not value
                                   and not self._keep_empty(f.name)):
                continue
            elif f.name == "predicted_output_len":
                out[f.name] = [value[0], value[1]]
            elif f.name == "output_len_upper":
                out[f.name] = [[a, u] for a, u in value]
            elif f.name == "tool_latency":
                out[f.name] = {k: v.to_dict() for k, v in value.items()}
            elif f.name == "next_agents":
                out[f.name] = [{"agent_id": n.agent_id, "p": n.p} for n in value]
            elif isinstance(value, Mapping):
                out[f.name] = dict(value)
            else:
                out[f.name] = value
        if not self.known:
            return {k: v for k, v in out.items() if k in _UNKNOWN_KEYS}
        return out

    def _keep_empty(self, name: str) -> bool:
        """Known annotations carry ``tool_latency`` even empty, and the path fields
        (``next_agents``, ``expected_distance``) even empty when the profile has an automaton."""
        return name == "tool_latency" or (name in _PATH_KEYS and self.predicted_path_regex is not None)

    def flat(self, app_metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The flat dict of scalars (``None`` = unknown) every engine dialect renders from; its
        keys are SGLang's ``custom_params`` keys (:data:`FLAT_KEYS`, in order). Ids missing from
        the annotation come from ``app_metadata``."""
        meta = app_metadata if isinstance(app_metadata, Mapping) else {}
        nxt = self.next_agent
        return {
            "wf_type": self.workflow_type_id or _ident(meta.get("workflow_type_id")),
            "wf_id": self.workflow_id or _ident(meta.get("workflow_id")),
            "agent": self.agent_id or _ident(meta.get("agent_id")),
            "known": self.known,
            "pred_out_lo": self.output_lo,
            "pred_out_hi": self.output_hi,
            "priority": self.priority,
            "exp_remaining_calls": self.expected_remaining_calls,
            "exp_remaining_s": self.expected_remaining_s,
            "next_agent": nxt.agent_id if nxt else None,
            "next_agent_p": nxt.p if nxt else None,
            "tool_p95_s": self.tool_p95_s,
            "retain_s": self.retain_s,
            "profile_version": self.profile_version,
            "p_end": self.p_end,
            "session_age_s": self.session_age_s,
            "pred_out_mean": self.output_len_mean,
            "keep_alive_ttl_s": self.keep_alive_ttl_s,
            "exp_remaining_out_tokens": self.expected_remaining_output_tokens,
        }

    @classmethod
    def from_flat(cls, params: Mapping[str, Any] | None) -> "Annotation":
        """Inverse of :meth:`flat` (what survives the flat form: one tool, one next agent, no
        bound table or distances). The single tool is named ``"_first"``."""
        p = params if isinstance(params, Mapping) else {}
        lo, hi = num(p.get("pred_out_lo")), num(p.get("pred_out_hi"))
        nxt, nxt_p = text(p.get("next_agent")), num(p.get("next_agent_p"))
        p95 = num(p.get("tool_p95_s"))
        prio = num(p.get("priority"))
        return cls(
            profile_version=text(p.get("profile_version")),
            known=p.get("known") is True,
            workflow_type_id=text(p.get("wf_type")),
            workflow_id=text(p.get("wf_id")),
            agent_id=text(p.get("agent")),
            predicted_output_len=(int(lo), int(hi)) if lo is not None and hi is not None else None,
            output_len_mean=num(p.get("pred_out_mean")),
            session_age_s=num(p.get("session_age_s")),
            tool_latency={FLAT_TOOL: ToolLatency(p95_s=p95)} if p95 is not None else {},
            retain_s=num(p.get("retain_s")),
            keep_alive_ttl_s=num(p.get("keep_alive_ttl_s")),
            next_agents=(NextAgent(nxt, nxt_p),) if nxt and nxt_p is not None else (),
            expected_remaining_calls=num(p.get("exp_remaining_calls")),
            expected_remaining_s=num(p.get("exp_remaining_s")),
            expected_remaining_output_tokens=num(p.get("exp_remaining_out_tokens")),
            p_end=num(p.get("p_end")),
            priority=int(prio) if prio is not None else None,
        )


#: Name of the one tool entry the flat form carries back (:meth:`Annotation.from_flat`).
FLAT_TOOL = "_first"
_ALWAYS = frozenset(("profile_version", "known", *ID_KEYS))
_UNKNOWN_KEYS = frozenset((*_ALWAYS, "reason", "detail"))
_PATH_KEYS = frozenset(("next_agents", "expected_distance"))
#: Keys of :meth:`Annotation.flat` (SGLang's ``custom_params``), in order.
FLAT_KEYS = tuple(Annotation().flat())


def to_sglang_custom_params(annotation: Annotation | Mapping[str, Any],
                            app_metadata: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """SGLang's flat ``custom_params`` (the scheduler sees it as ``req.sampling_params.custom_params``)
    for an annotation (or its JSON); every key of :data:`FLAT_KEYS` is present."""
    return Annotation.from_dict(annotation, app_metadata).flat(app_metadata)


def from_custom_params(params: Mapping[str, Any] | None) -> Annotation:
    """Read SGLang's ``custom_params`` back into the contract (the plugin's side)."""
    return Annotation.from_flat(params)
