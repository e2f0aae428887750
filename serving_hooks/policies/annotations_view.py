"""A typed, read-only view of what the policies know about one call.

:class:`CallView` is built from the annotation contract
(:class:`predictors.contract.Annotation`) — whichever shape the caller holds: the
nested ``sys_annotations`` the predictor returns, the flat ``custom_params`` the SGLang
scheduler sees, or the contract object itself. The parsing lives in the contract; this view only
renames its fields into the short names the policies use. Missing or malformed fields become
``None``: a prediction never fails a request, so a policy facing ``None`` falls back to its
documented neutral behaviour.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from predictors.contract import Annotation, from_custom_params


@dataclass(frozen=True)
class CallView:
    """What the profile predicted for one LLM call of one workflow session.

    Attributes mirror the flattened ``custom_params`` keys (CONTRACTS §5); ``expected_distance``,
    ``next_agents`` and ``upper_bounds`` are only filled from the nested sys_annotations (the flat
    form carries the top next agent alone, and no bound table).
    """

    known: bool = False
    wf_type: str | None = None
    wf_id: str | None = None
    agent: str | None = None
    pred_out_lo: float | None = None
    pred_out_hi: float | None = None
    priority: float | None = None
    exp_remaining_calls: float | None = None
    exp_remaining_s: float | None = None
    next_agent: str | None = None
    next_agent_p: float | None = None
    tool_p95_s: float | None = None
    retain_s: float | None = None
    profile_version: str | None = None
    expected_distance: Mapping[str, float] = field(default_factory=dict)
    next_agents: tuple[tuple[str, float], ...] = ()
    #: Seconds since the session's first call when this call was issued (workflow-level aging).
    session_age_s: float | None = None
    #: Probability that no call follows this one (the automaton's ``p_end``).
    p_end: float | None = None
    #: The agent's mean output length (tokens).
    pred_out_mean: float | None = None
    #: ``((α, U(α)), …)``, largest α first: one-sided (1 − α) upper bounds of the output length.
    upper_bounds: tuple[tuple[float, int], ...] = ()
    #: Keep-alive TTL from the idle gap (call finish → the session's next arrival), seconds.
    keep_alive_ttl_s: float | None = None
    #: Expected output tokens the session still has to generate, this call's included.
    exp_remaining_out_tokens: float | None = None

    @property
    def session_id(self) -> str | None:
        """The workflow id: the unit whose KV the keep/drop policy retains."""
        return self.wf_id

    @classmethod
    def from_annotation(cls, ann: Annotation, app_metadata: Mapping[str, Any] | None = None,
                        tool: str | None = None) -> "CallView":
        """The view of a contract object. ``tool`` names the tool whose p95 is ``tool_p95_s``
        (default: the agent's most frequent tool, the contract's definition); ids missing from
        the annotation come from ``app_metadata``."""
        meta = app_metadata or {}
        nxt = ann.next_agent

        def ident(key: str, own: str | None) -> str | None:
            value = own if own is not None else meta.get(key)
            return value if isinstance(value, str) and value else None

        return cls(
            known=ann.known,
            wf_type=ident("workflow_type_id", ann.workflow_type_id),
            wf_id=ident("workflow_id", ann.workflow_id),
            agent=ident("agent_id", ann.agent_id),
            pred_out_lo=None if ann.output_lo is None else float(ann.output_lo),
            pred_out_hi=None if ann.output_hi is None else float(ann.output_hi),
            priority=None if ann.priority is None else float(ann.priority),
            exp_remaining_calls=ann.expected_remaining_calls,
            exp_remaining_s=ann.expected_remaining_s,
            next_agent=nxt.agent_id if nxt else None,
            next_agent_p=nxt.p if nxt else None,
            tool_p95_s=ann.tool_p95_of(tool),
            retain_s=ann.retain_s,
            profile_version=ann.profile_version,
            expected_distance=dict(ann.expected_distance),
            next_agents=tuple((n.agent_id, n.p) for n in ann.next_agents),
            session_age_s=ann.session_age_s,
            p_end=ann.p_end,
            pred_out_mean=ann.output_len_mean,
            upper_bounds=tuple(ann.output_len_upper),
            keep_alive_ttl_s=ann.keep_alive_ttl_s,
            exp_remaining_out_tokens=ann.expected_remaining_output_tokens,
        )

    @classmethod
    def from_custom_params(cls, params: Mapping[str, Any] | None) -> "CallView":
        """Read the flat dict the gateway forwards as ``custom_params`` (the contract's flat form)."""
        return cls.from_annotation(from_custom_params(params))

    @classmethod
    def from_sys_annotations(
        cls,
        ann: Mapping[str, Any] | Annotation | None,
        app_metadata: Mapping[str, Any] | None = None,
        tool: str | None = None,
    ) -> "CallView":
        """Read the nested sys_annotations (or a contract object) plus the client's app_metadata."""
        return cls.from_annotation(Annotation.from_dict(ann, app_metadata), app_metadata, tool)
