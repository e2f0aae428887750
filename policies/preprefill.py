"""Pre-prefill: compute the known prefix of a session's predicted next call on idle capacity.

When a call finishes, its annotation names the session's most likely next agent and that
agent's probability ``p``. The part of the next prompt that is already known — the next
agent's system prompt and the workflow's task, or, for an agent that extends its own
conversation, that conversation so far — can be prefilled *before* the call exists, so that its
prefill becomes a prefix-cache hit. It is speculation, so it only uses what would otherwise go
unused:

* the replica is **idle** (nothing running, nothing waiting);
* the prefix fits in **free KV** (nothing cached is evicted for it);
* the prediction is confident (``p ≥ min_p``) and the prefix is worth an iteration
  (``missing ≥ min_tokens``).

Sessions are served oldest gap first (the session whose tool started earliest is likely back
first). The simulator drives this object (:mod:`simulator.preprefill`); the gateway and the
SGLang plugin do not yet.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrePrefillPolicy:
    """The rule above; pure arithmetic on what the caller observed.

    Parameters
    ----------
    min_p:
        Lowest probability of the predicted next agent worth speculating on.
    min_tokens:
        Smallest missing prefix worth one prefill iteration.
    """

    min_p: float = 0.5
    min_tokens: int = 64

    def wants(self, known: bool, next_agent: str | None, next_agent_p: float | None) -> bool:
        """Is the session's next call predicted confidently enough to prepare for?"""
        return bool(known and next_agent and next_agent_p is not None and next_agent_p >= self.min_p)

    def worth(self, missing_tokens: int, free_tokens: int, idle: bool) -> bool:
        """Prefill ``missing_tokens`` now? Only on an idle replica, into free KV, and only a
        prefix of at least ``min_tokens``."""
        return idle and self.min_tokens <= missing_tokens <= free_tokens
