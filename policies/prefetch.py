"""Just-in-time host prefetch of the next agent's prefix (Pythia algorithm 1, prefetch half).

The rule
--------
When a call arrives, the graph knows which agent most likely comes next (``next_agent``,
probability ``p``) and the output band tells when this call should finish:

    t_finish ≈ now + input_tokens / prefill_tok_s + output_lo / decode_tok_s

(the *low* end of the band: the earliest likely finish, so the staging is not late). If
``p ≥ min_p``, the next agent's prefix — its static template plus the history it references,
``prefix_tokens`` in all — should sit in **host memory** by the time the next call can
arrive, ``t_ready = t_finish + gap_s``. Copying ``prefix_tokens`` to host takes
``prefix_tokens / transfer_tok_s``, so the copy starts just in time:

    start_at = max(now, t_ready − prefix_tokens / transfer_tok_s − lead_s)

Staging never goes to GPU memory: a wrong guess then costs host memory and bus time only,
never a running request's KV. Nor does it push anything of value out of host memory: a copy is
made only when it fits in the host tier's free space plus the space held by prefixes the
keep/drop policy has *dropped* (:meth:`PrefetchPolicy.may_stage`); a speculative copy that
would evict another session's retained (or merely unannotated) prefix is skipped — the
guess is worth less than data some session is known, or likely, to reuse.

No copy is planned for a call announced as its session's last (``session_end``,
:mod:`policies.session_end`): nothing follows it, and the session's pending plans
are cancelled (:meth:`PrefetchPolicy.cancel_session`).

The policy object keeps the pending plans in a heap keyed by ``start_at``; the caller asks
:meth:`PrefetchPolicy.due` at each scheduling round (SGLang plugin: from the scheduler thread)
and performs the copies it returns.
"""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Any

#: The only tier the policy ever stages into.
HOST_TIER = "host"


@dataclass(frozen=True, order=True)
class PrefetchPlan:
    """A staging order: copy ``prefix_tokens`` of ``key``'s prefix to host from ``start_at``."""

    start_at: float
    ready_by: float = field(compare=False)
    key: str = field(compare=False)
    next_agent: str = field(compare=False)
    p: float = field(compare=False)
    prefix_tokens: int = field(compare=False)
    tier: str = field(default=HOST_TIER, compare=False)
    payload: Any = field(default=None, compare=False, repr=False)
    session: str | None = field(default=None, compare=False)


@dataclass
class PrefetchPolicy:
    """Pythia alg. 1 host prefetch; ``now`` is always passed in (no wall clock inside).

    Parameters
    ----------
    min_p:
        Smallest next-agent probability worth a speculative copy.
    transfer_tok_s:
        Tokens per second the copy into host memory moves (storage/PCIe bandwidth in
        tokens; default 200k tok/s ≈ a few GB/s for a 7B-class model's KV).
    prefill_tok_s, decode_tok_s:
        Serving speed used for the finish-time estimate.
    lead_s:
        Safety margin: the copy should end this long before the next call can arrive.
    """

    min_p: float = 0.5
    transfer_tok_s: float = 200_000.0
    prefill_tok_s: float = 8_000.0
    decode_tok_s: float = 40.0
    lead_s: float = 0.05
    _heap: list[tuple[float, int, PrefetchPlan]] = field(default_factory=list, repr=False)
    _live: dict[str, int] = field(default_factory=dict, repr=False)
    _session_of: dict[str, str] = field(default_factory=dict, repr=False)
    _seq: Any = field(default_factory=itertools.count, repr=False)

    def predicted_finish(self, now: float, input_tokens: int, output_lo: float | None) -> float:
        """``now + input/prefill_tok_s + output_lo/decode_tok_s`` (the annotation's
        ``output_lo``; output 0 when unknown)."""
        return (
            now
            + max(0, int(input_tokens)) / self.prefill_tok_s
            + max(0.0, float(output_lo or 0.0)) / self.decode_tok_s
        )

    def plan(
        self,
        key: str,
        now: float,
        next_agent: str | None,
        next_agent_p: float | None,
        finish_at: float,
        prefix_tokens: int,
        gap_s: float = 0.0,
        payload: Any = None,
        session: str | None = None,
        session_end: bool = False,
    ) -> PrefetchPlan | None:
        """Schedule the staging for the call ``key`` of ``session``; ``None`` when not worth it.

        A new plan for the same ``key`` replaces the old one. A call that ends its session
        (``session_end``) gets none, and the session's pending plans are cancelled.
        """
        if session_end:
            self.cancel(key)
            if session is not None:
                self.cancel_session(session)
            return None
        if not next_agent or next_agent_p is None or next_agent_p < self.min_p or prefix_tokens <= 0:
            self.cancel(key)
            return None
        ready_by = finish_at + max(0.0, gap_s)
        start_at = max(now, ready_by - prefix_tokens / self.transfer_tok_s - self.lead_s)
        plan = PrefetchPlan(
            start_at=start_at,
            ready_by=ready_by,
            key=key,
            next_agent=next_agent,
            p=float(next_agent_p),
            prefix_tokens=int(prefix_tokens),
            payload=payload,
            session=session,
        )
        seq = next(self._seq)
        self._live[key] = seq
        if session is not None:
            self._session_of[key] = session
        heapq.heappush(self._heap, (start_at, seq, plan))
        return plan

    @staticmethod
    def may_stage(prefix_tokens: int, free_tokens: int, dropped_tokens: int = 0) -> bool:
        """May a copy of ``prefix_tokens`` be staged? Only into free host memory plus memory
        held by dropped prefixes: ``prefix_tokens ≤ free + dropped``."""
        return int(prefix_tokens) <= max(0, int(free_tokens)) + max(0, int(dropped_tokens))

    def cancel(self, key: str) -> None:
        """Forget the plan of ``key`` (its next call already arrived, or it was aborted)."""
        self._live.pop(key, None)
        self._session_of.pop(key, None)

    def cancel_session(self, session: str) -> int:
        """Forget every pending plan of ``session`` (it ended); returns how many."""
        keys = [k for k, s in self._session_of.items() if s == session and k in self._live]
        for k in keys:
            self.cancel(k)
        return len(keys)

    def due(self, now: float) -> list[PrefetchPlan]:
        """Pop every live plan whose ``start_at ≤ now``, earliest first."""
        out: list[PrefetchPlan] = []
        while self._heap and self._heap[0][0] <= now:
            _, seq, plan = heapq.heappop(self._heap)
            if self._live.get(plan.key) == seq:
                del self._live[plan.key]
                self._session_of.pop(plan.key, None)
                out.append(plan)
        return out

    def pending(self) -> int:
        return len(self._live)
