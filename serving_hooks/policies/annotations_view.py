"""A typed, read-only view of what the policies know about one call.

The serving path hands the policies two shapes of the same information:

* the nested ``sys_annotations`` dict the predictor returns (DESIGN.md), and
* the flat ``custom_params`` dict the gateway forwards to SGLang (CONTRACTS §5), which is
  what the SGLang scheduler sees as ``req.sampling_params.custom_params``.

:class:`CallView` reads either into one small frozen object so that every policy takes the
same input whatever the caller (gateway, SGLang plugin, simulator). Missing or malformed
fields become ``None``: a prediction never fails a request, so a policy facing ``None``
falls back to its documented neutral behaviour.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _num(value: Any) -> float | None:
    """``value`` as a finite float, or ``None`` (bools, strings and NaN are not numbers here)."""
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _upper_table(value: Any) -> tuple[tuple[float, int], ...]:
    """``[[α, U], …]`` → ``((α, U), …)`` sorted by α descending; malformed entries are skipped."""
    out = []
    for item in value or ():
        if isinstance(item, (list, tuple)) and len(item) == 2:
            a, u = _num(item[0]), _num(item[1])
            if a is not None and u is not None and 0.0 < a < 1.0:
                out.append((a, int(u)))
    return tuple(sorted(out, reverse=True))


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

    @property
    def session_id(self) -> str | None:
        """The workflow id: the unit whose KV the keep/drop policy retains."""
        return self.wf_id

    @classmethod
    def from_custom_params(cls, params: Mapping[str, Any] | None) -> "CallView":
        """Read the flat dict the gateway forwards as ``custom_params`` (CONTRACTS §5)."""
        p = params or {}
        next_agent = _str(p.get("next_agent"))
        next_p = _num(p.get("next_agent_p"))
        return cls(
            known=p.get("known") is True,
            wf_type=_str(p.get("wf_type")),
            wf_id=_str(p.get("wf_id")),
            agent=_str(p.get("agent")),
            pred_out_lo=_num(p.get("pred_out_lo")),
            pred_out_hi=_num(p.get("pred_out_hi")),
            priority=_num(p.get("priority")),
            exp_remaining_calls=_num(p.get("exp_remaining_calls")),
            exp_remaining_s=_num(p.get("exp_remaining_s")),
            next_agent=next_agent,
            next_agent_p=next_p,
            tool_p95_s=_num(p.get("tool_p95_s")),
            retain_s=_num(p.get("retain_s")),
            profile_version=_str(p.get("profile_version")),
            next_agents=((next_agent, next_p),) if next_agent and next_p is not None else (),
            session_age_s=_num(p.get("session_age_s")),
            p_end=_num(p.get("p_end")),
            pred_out_mean=_num(p.get("pred_out_mean")),
            keep_alive_ttl_s=_num(p.get("keep_alive_ttl_s")),
        )

    @classmethod
    def from_sys_annotations(
        cls,
        ann: Mapping[str, Any] | None,
        app_metadata: Mapping[str, Any] | None = None,
        tool: str | None = None,
    ) -> "CallView":
        """Read the nested sys_annotations (DESIGN.md) plus the client's app_metadata.

        ``tool`` picks which entry of ``tool_latency`` gives ``tool_p95_s``; by default the
        largest p95 among the tools listed (the conservative choice for a TTL).
        """
        a = ann or {}
        meta = app_metadata or {}
        band = a.get("predicted_output_len") or (None, None)
        lo, hi = (band[0], band[1]) if isinstance(band, (list, tuple)) and len(band) == 2 else (None, None)
        nexts = []
        for item in a.get("next_agents") or ():
            if isinstance(item, Mapping) and _str(item.get("agent_id")) and _num(item.get("p")) is not None:
                nexts.append((item["agent_id"], float(item["p"])))
        nexts.sort(key=lambda t: -t[1])
        tools = a.get("tool_latency") or {}
        p95s = {name: _num(v.get("p95_s")) for name, v in tools.items() if isinstance(v, Mapping)}
        p95s = {k: v for k, v in p95s.items() if v is not None}
        tool_p95 = p95s.get(tool) if tool is not None else (max(p95s.values()) if p95s else None)
        dist = a.get("expected_distance") or {}
        return cls(
            session_age_s=_num(a.get("session_age_s")),
            p_end=_num(a.get("p_end")),
            pred_out_mean=_num(a.get("output_len_mean")),
            keep_alive_ttl_s=_num(a.get("keep_alive_ttl_s")),
            upper_bounds=_upper_table(a.get("output_len_upper")),
            known=a.get("known") is True,
            wf_type=_str(meta.get("workflow_type_id")),
            wf_id=_str(meta.get("workflow_id")),
            agent=_str(meta.get("agent_id")),
            pred_out_lo=_num(lo),
            pred_out_hi=_num(hi),
            priority=_num(a.get("priority")),
            exp_remaining_calls=_num(a.get("expected_remaining_calls")),
            exp_remaining_s=_num(a.get("expected_remaining_s")),
            next_agent=nexts[0][0] if nexts else None,
            next_agent_p=nexts[0][1] if nexts else None,
            tool_p95_s=tool_p95,
            retain_s=_num(a.get("retain_s")),
            profile_version=_str(a.get("profile_version")),
            expected_distance={k: float(v) for k, v in dist.items() if _num(v) is not None},
            next_agents=tuple(nexts),
        )
