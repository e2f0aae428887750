"""End of session: when a call is announced as its session's last, so its KV can be released.

The rule (agreed contract, docs/dialects.md "End of session"): a call ends its session when

* the client says so — ``app_metadata.last_call: true`` (it knows: the harness is returning its
  final answer), or
* the prediction is confident — a known annotation whose served ``p_end`` (the probability
  that no call follows) reaches ``p_threshold`` (``profiler gateway --session-end-p``).

``--no-session-end-signal`` turns the rule off. The gateway applies it once per call
(:meth:`SessionEndRule.mark` sets the contract's ``session_end``), every dialect renders the
mark in its own place, and the consumers read it: :class:`~policies.keep_drop
.KeepDropPolicy` drops the session's prefix (it is not kept for a TTL), and
:class:`~policies.prefetch.PrefetchPolicy` plans no host copy for the session and
cancels a pending one. The simulator's prediction feed applies the same rule, so the plugin,
the gateway and the simulator decide alike (tests/test_policy_parity.py).

The default threshold was chosen by measurement on the bundled real traces
(``bench/session_end_threshold.py``; docs/dialects.md): on held-out workflows the served
``p_end`` of a call that another follows never exceeded 0.17, while the last calls of the
fixed pipeline (Agentless) had ``p_end`` ≥ 0.82; at 0.8 every one of those last calls is
flagged and no other call. Single-agent loops (SWE-agent, mini-SWE-agent) never predict their
end confidently (last calls' ``p_end`` ≈ 0.02): there only the client's ``last_call`` fires.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from predictors.contract import Annotation

#: Default ``--session-end-p`` (module doc; docs/dialects.md for the measurement).
DEFAULT_SESSION_END_P = 0.8


@dataclass(frozen=True)
class SessionEndRule:
    """When a call is announced as its session's last (module doc)."""

    enabled: bool = True
    p_threshold: float = DEFAULT_SESSION_END_P

    def __post_init__(self) -> None:
        if not 0.0 < self.p_threshold <= 1.0:
            raise ValueError(f"--session-end-p {self.p_threshold}: expected a probability in (0, 1]")

    def ends(self, ann: Annotation, app_metadata: Mapping[str, Any] | None = None) -> bool:
        """Whether this call ends its session."""
        if not self.enabled:
            return False
        if isinstance(app_metadata, Mapping) and app_metadata.get("last_call") is True:
            return True
        return ann.known and ann.p_end is not None and ann.p_end >= self.p_threshold

    def mark(self, ann: Annotation, app_metadata: Mapping[str, Any] | None = None) -> Annotation:
        """``ann`` with ``session_end: true`` when :meth:`ends` (else ``ann`` itself)."""
        return replace(ann, session_end=True) if self.ends(ann, app_metadata) else ann
