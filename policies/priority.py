"""Graph-driven workflow priority (Pythia algorithm 3) with workflow-level aging.

A *workflow* whose predicted graph says it is close to done should run first (shortest expected
remaining work first shortens the average job completion time), and so should one that will soon
feed a *downstream model that is about to idle*:

    score(t) = w1 / E[D_remain]  +  w2 · Σ_{m ∈ M_idle} 1 / E[D_m]  +  aging_per_s · (t − t_session_start)

``E[D_remain]`` is 1 + the session's expected remaining calls (absorbing-chain fundamental matrix,
synth/), ``E[D_m]`` the expected distance to downstream model ``m``, ``M_idle`` the models whose
queue is under ``idle_queue_threshold``. The score belongs to the **session**: aging counts from
the workflow's start, so the order between two waiting workflows is fixed and a session is never
ranked below one of its class that started more than ``W = (1 + I) / aging_per_s`` seconds after
it (:meth:`PriorityPolicy.overtake_window_s`); per-call aging would decay into call-level FCFS.

One function computes a call's priority, :meth:`PriorityPolicy.call_priority`, at the gateway and
in the simulator; the SGLang plugin only adds ``aging · (time since enqueue)``
(:meth:`PriorityPolicy.aged`); :meth:`PriorityPolicy.to_sglang` renders ``round(scale · score)``
(bigger first). A call with no prediction gets ``unknown_score``. Options: ``interactive_boost``
(latency classes, :meth:`class_term`), ``aging_per_duration`` (aging on each session's expected
duration, off by default), ``remaining_unit`` (``"calls"``, the default, ``"tokens"`` or
``"seconds"``), ``slowdown_bound`` (a session older than a multiple of the seconds it is expected
to still need is overdue and ranks above every batch session that is not; off by default),
``rank_skill_min`` (a workflow type whose remaining-work order showed no skill forward in time on
the fit's training side ranks its sessions by program start: :meth:`PriorityPolicy.for_profile`;
off: rejected on validation draws), ``monotone`` (a session's rank never falls; off by default),
``oldest_share`` (a relative guard: the oldest share of the live batch sessions run first, by
start; kept by :class:`policies.bookkeeping.SessionPriorityBook`; off by default).

Defaults (``aging_per_s = 1e-5``, calls, per-duration aging off) were chosen on simulator
validation draws; the rules in full, the worked example and every figure with its command:
docs/simulator.md ("Graph-driven priority (policies/priority.py)").
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from predictors.contract import PRIORITY_SCALE, Annotation, sglang_priority

#: Units ``PriorityPolicy.remaining_unit`` ranks by.
UNITS = ("tokens", "calls", "seconds")
#: A call without a prediction is ranked as if this many calls remained.
NEUTRAL_CALLS = 3.0
#: ``PriorityPolicy.aging_rate`` stays within 2^±RATE_OCTAVES of ``aging_per_s``.
RATE_OCTAVES = 10


@dataclass(frozen=True)
class PriorityPolicy:
    """Pythia alg. 3 priority; pure: every time and queue state is passed in.

    Parameters
    ----------
    w1, w2:
        Weights of the remaining-work term and of the idle-downstream term.
    idle_queue_threshold:
        A downstream model with fewer than this many waiting requests is "at risk of idling".
    aging_per_s:
        Score added per second of the workflow's age (anti-starvation; docs/simulator.md).
    unknown_score:
        Base score of a call without a prediction (default, None: as if 3 calls remained, in the
        scale of ``remaining_unit``: ``1/4`` for calls and seconds, ``−ln 4`` for tokens).
    scale:
        Multiplier from score to SGLang's integer priority.
    """

    w1: float = 1.0
    w2: float = 1.0
    idle_queue_threshold: int = 2
    aging_per_s: float = 1e-5
    unknown_score: float | None = None
    scale: float = PRIORITY_SCALE
    #: What ``E[D_remain]`` counts: ``"calls"`` (alg. 3) or ``"seconds"`` — the profile's
    #: expected remaining seconds of the workflow (LLM and tool time), in units of
    #: ``seconds_per_call`` so both scores live on the same scale against aging:
    #: ``w1 / (1 + R_s / seconds_per_call)``.
    remaining_unit: str = "calls"
    seconds_per_call: float = 30.0
    #: Rank by a quantile of the remaining seconds instead of their mean. The profile holds only
    #: the mean, so the quantile assumes an exponential remaining time: ``R_q = −ln(1 − q)·R``
    #: (the same order between workflows; it re-weighs the term against aging and idle models).
    remaining_quantile: float | None = None
    #: With ``remaining_unit="tokens"`` (docs/simulator-results.md, "Remaining output tokens"): the session's
    #: expected remaining output tokens ``R`` in units of ``tokens_per_call``, scored on a log
    #: scale, ``−w1 · ln(1 + R / tokens_per_call)``; a known call whose annotation lacks the field
    #: counts ``(1 + remaining calls) · tokens_per_call`` tokens.
    tokens_per_call: float = 500.0
    #: Aging on the session's own time scale (docs/simulator-results.md, "Aging per session duration"): when
    #: set, a session whose expected total duration is ``τ`` seconds (its age + the profile's
    #: expected remaining seconds) ages at ``aging_per_duration / τ`` per second, rounded to a
    #: power of two (so a queue holds few distinct rates); None: every session at ``aging_per_s``.
    #: Off by default: 0.03 won the generated validation draws but loses 18.5 % on a validation
    #: draw of the real coding-trace mix (docs/simulator-results.md, "Aging per session duration").
    aging_per_duration: float | None = None
    #: Added to the base score of a call of latency class ``"interactive"`` (docs/simulator-results.md,
    #: "Latency classes"): a person waits on it, so it is ranked for time to first token, above
    #: every batch session that has not aged ``interactive_boost / aging_per_s`` seconds.
    interactive_boost: float = 2.0
    #: Rank a session with more than this many expected remaining calls (in ``seconds_per_call``
    #: units with ``remaining_unit="seconds"``) as if it had this many (docs/simulator-results.md,
    #: "Bounded tail"): the long sessions tie on the base and the aging serves them in order of
    #: their start, instead of the longest last; None: no cap.
    remaining_cap: float | None = None
    #: Per-session slowdown bound (docs/simulator-results.md, "Bounded tail", fifth round): a
    #: batch session older than ``slowdown_bound`` times the seconds the profile expects it still
    #: needs (:meth:`expected_seconds`) is *overdue*: ``w1 + overdue_boost`` is added to its base,
    #: so it ranks above every batch session that is not, and the overdue ones keep the key's
    #: order among themselves. None: off (the default: rejected on validation draws, it lost the
    #: mean on a growing backlog and did not bound the coding mix's P95).
    slowdown_bound: float | None = None
    #: What an overdue session's base is raised by, on top of the calls key's best (``w1``).
    overdue_boost: float = 1.0
    #: Overdue sessions run in order of their start instead (their base becomes
    #: ``w1 + overdue_boost`` alike, and the aging orders them): FCFS among the overdue.
    overdue_by_start: bool = False
    #: Rank by program start where the order has no skill (docs/simulator-results.md, "Bounded
    #: tail", seventh round): a workflow type whose served remaining-tokens order reached a
    #: forward-in-time C-index of at most this on the fit's training side
    #: (``remaining_tokens.selection.<type>.forward``) gives every session the type's mean
    #: remaining work (:func:`start_ranked_types`): they tie on the base and the aging serves
    #: them in order of their start (FCFS among them, continuum's order), while the types with
    #: skill keep the remaining-work rank. Bound to a profile by :meth:`for_profile`. None: off
    #: (rejected on validation draws: docs/simulator-results.md, "Bounded tail", seventh round).
    rank_skill_min: float | None = None
    #: A session's rank never falls (docs/simulator-results.md, "Bounded tail", seventh round):
    #: the session's reference (:class:`policies.bookkeeping.SessionPriorityBook`) keeps the
    #: higher of its aged score and the new call's, so a session that outlives what the profile
    #: expected of it is not demoted for it (where the expected remainder grows with the calls
    #: done, a heavy tail). False: each predicted call replaces the session's score.
    monotone: bool = False
    #: A relative tail guard (docs/simulator-results.md, "Bounded tail", ninth round): among the
    #: *live* batch sessions (:attr:`live_window_s`), the oldest ``oldest_share`` of them by
    #: session start (``floor(q · n)`` of ``n``) are *lifted*: their reference becomes
    #: :meth:`lifted_score` at their start, so they rank above every batch session that is not
    #: lifted and among themselves in order of their start (FCFS). The share lifted stays ``q``
    #: however far the backlog grows. Kept by :class:`policies.bookkeeping.SessionPriorityBook`
    #: (it alone sees which sessions are live). None: off (the default).
    oldest_share: float | None = None
    #: A session is live from its first call until a call of it marked ``session_end`` finishes,
    #: or until it has had no call in flight for this many seconds (a session that stops calling
    #: without an end mark: the gateway, the plugin and the simulator all see both signals).
    live_window_s: float = 600.0
    #: Added to ``w1`` in :meth:`lifted_score` (0: the calls key's best base; a lifted session is
    #: then above every non-lifted batch session by its age alone, with one model pool).
    guard_boost: float = 0.0
    #: The bound types: ``((type, mean remaining calls, mean remaining output tokens), ...)``
    #: (:meth:`for_profile` fills it; a tuple so the policy stays hashable).
    start_ranked: tuple[tuple[str, float, float], ...] = ()

    def __post_init__(self) -> None:
        if self.remaining_unit not in UNITS:
            raise ValueError(f"remaining_unit must be one of {', '.join(UNITS)}, got {self.remaining_unit!r}")
        if self.oldest_share is not None and not 0.0 < self.oldest_share < 1.0:
            raise ValueError(f"oldest_share must lie in (0, 1), got {self.oldest_share!r}")
        if not self.live_window_s > 0.0:
            raise ValueError(f"live_window_s must be > 0, got {self.live_window_s!r}")
        if self.unknown_score is None:     # neutral: as if 3 calls remained, in the unit's scale
            neutral = (-self.w1 * math.log1p(NEUTRAL_CALLS) if self.remaining_unit == "tokens"
                       else self.w1 / (1.0 + NEUTRAL_CALLS))
            object.__setattr__(self, "unknown_score", neutral)
        object.__setattr__(self, "_start_ranked", {t: (c, k) for t, c, k in self.start_ranked})

    def for_profile(self, profile_data: Mapping | None) -> "PriorityPolicy":
        """This policy bound to a profile: with :attr:`rank_skill_min` set, :attr:`start_ranked`
        holds the profile's types without skill (:func:`start_ranked_types`); otherwise ``self``.
        The gateway's prediction service (per profile version) and the simulator's ``ours`` call
        it, so both rank alike."""
        if self.rank_skill_min is None:
            return self
        section = (profile_data or {}).get("remaining_tokens") or {}
        ranked = start_ranked_types(section, self.rank_skill_min)
        return replace(self, start_ranked=tuple((t, c, k) for t, (c, k) in sorted(ranked.items())))

    def base_score(
        self,
        remaining_calls: float | None,
        downstream_distance: Mapping[str, float] | None = None,
        queue_depth: Mapping[str, float] | None = None,
        known: bool = True,
    ) -> float:
        """``w1 / E[D_remain] + w2 · Σ_{m idle} 1/E[D_m]`` for one call.

        ``remaining_calls`` is the expected number of calls *after* this one (the predictor's
        ``expected_remaining_calls``); ``downstream_distance`` maps a model (or agent) to its
        expected distance in calls; ``queue_depth`` maps the same names to their current
        number of waiting requests (a model absent from it is not considered at risk).
        """
        if not known or remaining_calls is None:
            return self.unknown_score
        remaining = max(0.0, float(remaining_calls))
        if self.remaining_cap is not None:
            remaining = min(remaining, self.remaining_cap)
        score = self.w1 / (1.0 + remaining)
        return score + self._idle_term(downstream_distance, queue_depth)

    def base_score_tokens(
        self,
        remaining_tokens: float | None,
        downstream_distance: Mapping[str, float] | None = None,
        queue_depth: Mapping[str, float] | None = None,
        known: bool = True,
    ) -> float:
        """``−w1 · ln(1 + R / tokens_per_call) + w2 · Σ_{m idle} 1/E[D_m]`` for a call whose
        session has ``R`` output tokens left (this call's included)."""
        if not known or remaining_tokens is None:
            return self.unknown_score
        score = -self.w1 * math.log1p(max(0.0, float(remaining_tokens)) / max(self.tokens_per_call, 1e-9))
        return score + self._idle_term(downstream_distance, queue_depth)

    def lifted_score(self) -> float:
        """The base of a session the guard lifts (:attr:`oldest_share`): ``w1 + guard_boost``,
        at least every batch base of the calls, seconds and tokens keys without the idle-downstream
        term (those lie in (0, w1] or at most 0), and below an interactive call's
        (``interactive_boost`` + a positive base) while ``guard_boost < interactive_boost − w1``."""
        return self.w1 + self.guard_boost

    def overtake_window_s(self, max_idle_term: float = 0.0) -> float:
        """The tail bound (docs/simulator-results.md, "Bounded tail"): a session never ranks below one of its
        class that started more than this many seconds after it, ``(1 + max_idle_term) /
        aging_per_s`` — the calls key's base lies in (0, 1], ``max_idle_term`` bounds the
        idle-downstream term of the run (0 with one model pool)."""
        return (self.w1 + max(0.0, float(max_idle_term))) / self.aging_per_s

    def class_term(self, latency_class: str | None) -> float:
        """What the call's latency class adds to its base score: :attr:`interactive_boost` for
        ``"interactive"``, 0 for ``"batch"`` or an unclassified call (docs/simulator-results.md, "Latency
        classes")."""
        return self.interactive_boost if latency_class == "interactive" else 0.0

    def _idle_term(self, downstream_distance: Mapping[str, float] | None,
                   queue_depth: Mapping[str, float] | None) -> float:
        """``w2 · Σ_{m idle} 1/E[D_m]`` (0 without distances or queue depths)."""
        out = 0.0
        if downstream_distance and queue_depth:
            for model, distance in downstream_distance.items():
                depth = queue_depth.get(model)
                if depth is not None and depth < self.idle_queue_threshold:
                    out += self.w2 / max(1.0, float(distance))
        return out

    def score_annotation(
        self,
        ann: Annotation,
        queue_depth: Mapping[str, float] | None = None,
        agent_model: Mapping[str, str] | None = None,
    ) -> float:
        """:meth:`base_score` (or :meth:`base_score_tokens`) of one call's :class:`Annotation`,
        plus its latency class's :meth:`class_term` (docs/simulator-results.md, "Latency classes").

        ``agent_model`` maps agent ids to the model that serves them, so that distances to
        agents (what the graph knows) become distances to models (what has a queue); the
        distance to a model is the smallest distance to any of its agents.
        """
        distance = self.downstream_distance(ann, agent_model)
        remaining = ann.expected_remaining_calls
        cls = self.class_term(ann.latency_class) if ann.known else 0.0
        by_start = self._start_ranked.get(ann.workflow_type_id) if ann.known else None
        if by_start is not None:      # no skill: every session of the type ranks alike
            if self.remaining_unit == "tokens":
                return self.base_score_tokens(by_start[1], distance, queue_depth) + cls
            return self.base_score(by_start[0], distance, queue_depth) + cls
        if self.remaining_unit == "tokens":
            tokens = ann.expected_remaining_output_tokens
            if tokens is None and remaining is not None:
                tokens = (1.0 + max(0.0, float(remaining))) * self.tokens_per_call
            return self.base_score_tokens(tokens, distance, queue_depth, known=ann.known) + cls
        if self.remaining_unit == "seconds" and ann.expected_remaining_s is not None:
            sec = max(0.0, float(ann.expected_remaining_s))
            if self.remaining_quantile is not None:
                sec *= -math.log(max(1e-9, 1.0 - self.remaining_quantile))
            remaining = sec / max(self.seconds_per_call, 1e-9)
        return self.base_score(remaining, distance, queue_depth, known=ann.known) + cls

    @staticmethod
    def downstream_distance(ann: Annotation, agent_model: Mapping[str, str] | None = None
                            ) -> dict[str, float]:
        """Expected distance in calls to each downstream agent — to each model with
        ``agent_model`` (the smallest distance to any of its agents); the next agent at distance
        1 when the graph gives no distances."""
        distance = dict(ann.expected_distance)
        if not distance and ann.next_agent_id:
            distance = {ann.next_agent_id: 1.0}
        if agent_model:
            by_model: dict[str, float] = {}
            for agent, d in distance.items():
                model = agent_model.get(agent, agent)
                by_model[model] = min(d, by_model.get(model, float("inf")))
            distance = by_model
        return distance

    def idle_downstream_term(self, ann: Annotation, queue_depth: Mapping[str, float] | None = None,
                             agent_model: Mapping[str, str] | None = None) -> float:
        """The ``w2 · Σ_{m idle} 1/E[D_m]`` part of :meth:`score_annotation` alone."""
        return self._idle_term(self.downstream_distance(ann, agent_model), queue_depth)

    def aging_rate(self, ann: Annotation | None = None, session_age_s: float | None = None) -> float:
        """Score added per second of waiting for the session ``ann`` belongs to.

        ``aging_per_s`` unless :attr:`aging_per_duration` is set; then
        ``aging_per_duration / τ`` with ``τ = age + expected remaining seconds`` (the session's
        expected total duration, ``session_age_s`` overriding the annotation's), rounded to the
        nearest power of two and kept within ``2^±RATE_OCTAVES`` of ``aging_per_s``; an
        annotation without remaining seconds ages at ``aging_per_s``."""
        if self.aging_per_duration is None or ann is None or not ann.known \
                or ann.expected_remaining_s is None:
            return self.aging_per_s
        age = ann.session_age_s if session_age_s is None else session_age_s
        tau = max(1.0, float(age or 0.0) + max(0.0, float(ann.expected_remaining_s)))
        octave = round(math.log2(self.aging_per_duration / tau / self.aging_per_s))
        return self.aging_per_s * 2.0 ** max(-RATE_OCTAVES, min(RATE_OCTAVES, octave))

    def call_priority(self, ann: Annotation, session_age_s: float | None = None,
                      queue_depth: Mapping[str, float] | None = None,
                      agent_model: Mapping[str, str] | None = None) -> float:
        """**The** priority of one call, as a float (bigger runs first): its
        :meth:`score_annotation` (with the model pools' ``queue_depth`` and ``agent_model`` when
        there are pools) plus aging over the session's age, ``session_age_s`` (None: the
        annotation's ``session_age_s``) at :meth:`aging_rate`. The gateway computes it once per
        call (``PredictionService.annotate_call``, or the gateway itself for a sidecar's
        annotation with pool inputs); the SGLang plugin only for a call whose ``custom_params``
        carry no priority; the simulator's ``PriorityScheduler`` with the workflow's simulated
        age. SGLang's integer is :func:`predictors.contract.sglang_priority` of it."""
        age = ann.session_age_s if session_age_s is None else session_age_s
        base = self.score_annotation(ann, queue_depth, agent_model)
        if self.overdue(ann, age):
            lift = self.w1 + self.overdue_boost
            base = max(base, lift) if self.overdue_by_start else base + lift
        return self.session_score(base, age, self.aging_rate(ann, age))

    def expected_seconds(self, ann: Annotation) -> float:
        """The seconds the profile expects ``ann``'s session still needs: its
        ``expected_remaining_s``, else ``(1 + expected remaining calls) · seconds_per_call``
        (``NEUTRAL_CALLS`` when neither is known), at least ``seconds_per_call``."""
        if ann.expected_remaining_s is not None:
            sec = float(ann.expected_remaining_s)
        else:
            calls = NEUTRAL_CALLS if ann.expected_remaining_calls is None else float(ann.expected_remaining_calls)
            sec = (1.0 + max(0.0, calls)) * self.seconds_per_call
        return max(sec, self.seconds_per_call)

    def overdue(self, ann: Annotation, session_age_s: float | None) -> bool:
        """Is the session past its slowdown bound (:attr:`slowdown_bound`): a known batch call
        whose session is older than ``slowdown_bound · expected_seconds(ann)``? Interactive calls
        are never overdue (their class already ranks them above every batch session)."""
        if self.slowdown_bound is None or not ann.known or ann.latency_class == "interactive":
            return False
        return float(session_age_s or 0.0) > self.slowdown_bound * self.expected_seconds(ann)

    def session_score(self, base: float, session_age_s: float | None,
                      rate: float | None = None) -> float:
        """``base + rate · session_age_s`` (``rate`` default ``aging_per_s``): the score of a
        call issued when its workflow was ``session_age_s`` seconds old (what the gateway sends
        as the call's priority)."""
        rate = self.aging_per_s if rate is None else rate
        return base + rate * max(0.0, float(session_age_s or 0.0))

    def aged(self, base: float, enqueued_at: float, now: float, rate: float | None = None) -> float:
        """``base + rate · (now − enqueued_at)`` (``rate`` default ``aging_per_s``); waiting
        time never counts negative.

        Applied to a :meth:`session_score`, this is the workflow-level score at ``now``."""
        rate = self.aging_per_s if rate is None else rate
        return base + rate * max(0.0, now - enqueued_at)

    def to_sglang(self, score: float) -> int:
        """Integer priority for SGLang (bigger runs first), clamped to a safe range
        (:func:`predictors.contract.sglang_priority` at this policy's ``scale``)."""
        return sglang_priority(score, self.scale)

    def from_sglang(self, priority: int) -> float:
        """Inverse of :meth:`to_sglang` (up to rounding)."""
        return priority / self.scale

    def order(
        self,
        items: Iterable[tuple[str, float, float]],
        now: float,
    ) -> list[str]:
        """Ids sorted the way the scheduler should serve them.

        ``items`` holds ``(id, base_score, enqueued_at)``; the result is by aged score
        descending, then by enqueue time (first come first served on ties) — the same key
        SGLang's ``_sort_by_priority_and_fcfs`` uses on the integer priorities.
        """
        keyed = [
            (-self.to_sglang(self.aged(base, t0, now)), t0, rid) for rid, base, t0 in items
        ]
        return [rid for _, _, rid in sorted(keyed)]


def start_ranked_types(remaining_tokens: Mapping, rank_skill_min: float) -> dict[str, tuple[float, float]]:
    """The workflow types of a profile's ``remaining_tokens`` section whose served order has no
    skill: ``{type: (mean remaining calls, mean remaining output tokens)}``.

    A type qualifies when the fit scored its served candidate forward in time
    (``selection.<type>.forward``: the C-index over concurrent sessions on the training side,
    predictors/remaining_tokens.py) and that C-index is at most ``rank_skill_min``; a type
    without that evidence (too few workflows, no arrival times) keeps the remaining-work rank.
    Its figures are the type's unconditional means over its calls (the table's type-level key):
    ``R̄`` output tokens, and ``R̄ / m̄ − 1`` calls after this one (``m̄`` the mean output of a
    call), so across types it still ranks as a position-free predictor would."""
    out: dict[str, tuple[float, float]] = {}
    entries = remaining_tokens.get("workflow_types") or {}
    for wt, sel in (remaining_tokens.get("selection") or {}).items():
        fwd = sel.get("forward") if isinstance(sel, Mapping) else None
        entry = entries.get(wt)
        if not fwd or not entry:
            continue
        c = (fwd.get("c_index") or {}).get(fwd.get("served"))
        if c is None or not math.isfinite(float(c)) or float(c) > rank_skill_min:
            continue
        tokens = float(entry["keys"][""][1])
        calls = max(0.0, tokens / max(float(entry.get("mean_out") or 0.0), 1e-9) - 1.0)
        out[str(wt)] = (calls, tokens)
    return out
