"""Graph-driven workflow priority (Pythia algorithm 3) with workflow-level aging.

The rule
--------
A *workflow* whose predicted graph says it is close to done should run first (shortest
expected remaining work first shortens the average job completion time), and so should a
workflow that will soon feed a *downstream model that is about to idle*:

    base = w1 / E[D_remain]  +  w2 · Σ_{m ∈ M_idle} 1 / E[D_m]

* ``E[D_remain]`` — expected number of calls left in the workflow, counting this one
  (``1 + expected_remaining_calls``; from the absorbing-chain fundamental matrix in synth/,
  i.e. from the session's automaton state after this call);
* ``E[D_m]`` — expected distance, in calls, from here to the first call of downstream model
  ``m`` (``expected_distance`` in sys_annotations), floored at 1;
* ``M_idle`` — downstream models whose queue depth is under ``idle_queue_threshold`` right
  now (they are at risk of idling, so work that reaches them sooner is worth more).

The score is a property of the **session**, not of one call: every call of a workflow carries
its session's current base, and the anti-starvation aging counts from the workflow's start,
not from the call's enqueue time:

    score(t) = base + aging_per_s · (t − t_session_start)

With one fixed rate (``aging_per_duration=None``, the default; aging on each session's own
time scale is an option, below) every waiting workflow ages alike, so the order between two is fixed —
``base − aging_per_s · t_start`` — and aging only bounds how long a newer workflow's smaller
remaining work may keep an older one waiting: ``Δbase / aging_per_s`` seconds (with the
default 1e-5 /s, a workflow one call from done (base 0.5) passes one that has just started a
13-call path (≈ 0.07) unless that one started more than 43,000 s earlier: near key order; the
tail bound this gives and why a tighter one was not taken: "Bounded tail" below). Aging from each call's
own enqueue time instead (per-call aging) would, once calls wait longer than ``Δbase /
aging_per_s``, order the queue by call arrival: call-level FCFS that interleaves workflows.

One function computes a call's priority, as a float: :meth:`PriorityPolicy.call_priority`
``= base + aging · (session age at issue)``, at the gateway (``PredictionService``) and in the
simulator; the SGLang plugin only ages a queued request by ``aging · (time since enqueue)``
(:meth:`PriorityPolicy.aged`), without sharing a clock; their sum is the workflow-level score
above.

SGLang's priority scheduler sorts integer priorities, bigger first (the default, without
``--schedule-low-priority-values-first``), so :meth:`PriorityPolicy.to_sglang` maps a score
to ``round(scale · score)`` (:func:`predictors.contract.sglang_priority`, the one rendering).

A call with no prediction (``known: false``) gets ``unknown_score``: neutral, served as if a
few calls remained, and aged like every other request.

Aging per session duration (``aging_per_duration``)
---------------------------------------------------
One constant ``aging_per_s`` bounds a *wait*: a workflow may be passed for at most
``Δbase / aging_per_s`` seconds, whatever its length. That fits a burst that drains in minutes
or an open loop that runs for an hour, not both. With ``aging_per_duration = k`` each session
ages on its own time scale: its rate is ``k / τ``, ``τ`` its expected total duration (age + the
profile's expected remaining seconds, ``expected_remaining_s``, at its latest predicted call), so

    score(t) ≈ base + k · age / τ

and the bound is on the *slowdown* (age ÷ expected duration): how long a session may be passed
scales with its own expected length, not with one number of seconds for every run, so an
hour-long open loop's age term does not swamp the remaining-work key. The rate is rounded to a power of two times ``aging_per_s`` (within
``2^±RATE_OCTAVES``), so a queue holds a few distinct rates: the simulator's
``SessionQueue`` keeps one heap per rate (exact, O(#rates) per head), and the plugin reads
the same rate off the call's annotation (:meth:`PriorityPolicy.aging_rate`) — no new field.
A call without ``expected_remaining_s`` ages at ``aging_per_s``.

Why it is off by default. ``k = 0.03`` (a session gains 0.03 — about a third of the gap between 2 and 3
calls left, 1/3 − 1/4 — per expected duration of age) was chosen on the validation draws (``profiler simulate
--scenario S --seed D``, D = 100, 101, S = ``pythia-like``, ``agent-platform``,
``agent-platform-bursty``; avg JCT ÷ ``continuum-ttl``'s, mean of the six runs): fixed
``aging_per_s = 0.001`` 0.955, k = 1 0.953, 0.3 0.943, 0.1 0.944, 0.03 0.940
(docs/simulator.md, "Aging per session duration"). A weak fixed rate does as well on these
draws (``aging_per_s`` 1e-5 with ``aging_per_duration=None``: 0.941; 1e-4: 0.957): the gain
there is weaker aging; the per-session scale keeps the bound a slowdown, whatever the run's
length. But on a validation draw of the real coding-trace mix at peak load (``profiler
simulate --workload MIX --load peak --seed 100``, MIX = the three shared coding traces:
agentless, mini-SWE-agent, SWE-agent), ÷ ``continuum-ttl``: fixed 0.001 /s 1.002, k = 0.03
1.185, k = 0.3 1.427, k = 1 1.312 (P95 8,331 s vs 11,488 s at 0.03): on real traces the
expected duration ``τ`` ranks poorly (remaining-work C-index ≈ 0.6), so a session predicted
long ages slowly and starves. Over all seven validation runs the fixed rate wins (mean 0.962
vs 0.975), so ``aging_per_duration=None`` is the default and per-duration aging is the
simulator's ``ours-duration-aging``.

Why 1e-5. On the same seven validation runs one weak fixed rate, ``aging_per_s = 1e-5``,
scores 0.941 on the six generated ones and 0.984 on the real mix (P95 8,171 s): mean 0.947,
ahead of 0.001 /s (0.962) and per-duration aging (0.975). The next section checks it with the
tail in view.

Bounded tail (``aging_per_s``)
------------------------------
The guarantee. Under the calls key a session's base lies in (0, 1] (plus its class term, the
same for every session of a class), so two sessions of one class waiting at ``t`` are ordered by
``base − aging_per_s · t_start``, and a session is never ranked below one of its class that
started more than

    W = (1 + I) / aging_per_s          (:meth:`PriorityPolicy.overtake_window_s`)

seconds after it (``I`` bounds the idle-downstream term; 0 with one model pool). Inside ``W``
the remaining-work order holds (a session closer to done passes); beyond it the order is program
FCFS. So what a session waits because others were preferred is at most the work of the sessions
that started within ``W`` after it. At the default 1e-5 /s, W ≈ 28 h: a bound on paper only.

Why not a tighter window: on validation draws (``bench/bench_tail.py``, docs/simulator.md,
"Bounded tail") only 1e-5 kept ours' P95 within 1.05× the best baseline's on every draw, with the
best mean; 1e-3 (W = 1,000 s) bounds the P99 but, on a peak whose backlog grows for the whole
run, turns the order into program FCFS and loses mean and P95. ``ours-aging-1e-3`` is that
variant.

Latency classes (``interactive_boost``)
---------------------------------------
A call of latency class ``"interactive"`` (a person waits; the rule is
:func:`predictors.compiled.latency_class`, docs/dialects.md) gets ``interactive_boost`` added to
its base (:meth:`class_term`, inside :meth:`score_annotation`, so gateway, plugin and simulator
rank it alike): it runs before every batch session that has not aged ``interactive_boost /
aging_per_s`` seconds, ranked for time to first token; batch sessions keep the order above.

Which unit ranks (``remaining_unit``; ``"calls"``, the default)
---------------------------------------------------------------
The default ranks by the session's expected remaining **calls** (the first rule above, with
``E[D_remain]`` from the profile's remaining-calls model: its context of agents, tool use and
stage). It was chosen over remaining output tokens and remaining seconds on simulator draws kept
apart for the choice (``profiler simulate --scenario S --seed D``, D = 100, 101, S =
``pythia-like``, ``agent-platform``, ``agent-platform-bursty``; avg JCT ÷ ``continuum-ttl``'s,
mean of the six runs): calls 0.962, tokens 1.008, seconds 0.970 (docs/simulator.md, "Across
workload draws"). Why calls: an agent call's cost to the engine is mostly its prompt — in the
``agent-platform`` mix 13.5k input tokens per call against 640 output tokens — so a session's
remaining engine work follows its remaining calls (each re-reads a long context) more than the
tokens it will still write; and the ``1/(1 + R)`` score, bounded in (0, 1], lets the aging
order sessions of similar length by their start while a session a call or two from done jumps
ahead. The other units stay selectable (``ours-tokens``, ``ours-seconds`` in the simulator).

Remaining output tokens (``remaining_unit="tokens"``)
-----------------------------------------------------
The work an engine still spends on a session is, to first order, the output tokens it has left
to decode, ``R`` (``expected_remaining_output_tokens``, :mod:`predictors.remaining_tokens`). It is
ranked on a log scale, so that what counts is the *ratio* of two sessions' remaining work:

    base = −w1 · ln(1 + R / tokens_per_call)  +  w2 · Σ_{m ∈ M_idle} 1 / E[D_m]

With aging 0.001 /s a session with ``e`` ≈ 2.7 times the work of another waits at most
~1,000 s behind it (the default 1e-3 /s). A known call whose annotation lacks ``R`` counts
``(1 + remaining calls) · tokens_per_call`` tokens; an unknown call is neutral at
``−ln(1 + 3)`` (as if 3 calls of ``tokens_per_call`` remained) (``ours-tokens`` in the
simulator).

With ``remaining_unit="seconds"`` the remaining work is the profile's expected remaining
*seconds* of the workflow (``expected_remaining_s``, LLM and tool time), or a quantile of it, in
units of ``seconds_per_call`` (same scale as calls against aging); which unit serves better is
chosen by simulation (``profiler simulate``: ``ours`` vs ``ours-seconds``).

Worked example (``w1 = w2 = 1``, threshold 2): a call with 1 call remaining after it
(``E[D_remain] = 2``) whose workflow reaches idle model ``verifier`` in 2 calls scores
``1/2 + 1/2 = 1.0``; a call with 4 remaining and no idle downstream scores ``1/5 = 0.2``.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

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
        Score added per second of the workflow's age (anti-starvation; see the module doc).
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
    #: With ``remaining_unit="tokens"`` (module doc, "Remaining output tokens"): the session's
    #: expected remaining output tokens ``R`` in units of ``tokens_per_call``, scored on a log
    #: scale, ``−w1 · ln(1 + R / tokens_per_call)``; a known call whose annotation lacks the field
    #: counts ``(1 + remaining calls) · tokens_per_call`` tokens.
    tokens_per_call: float = 500.0
    #: Aging on the session's own time scale (module doc, "Aging per session duration"): when
    #: set, a session whose expected total duration is ``τ`` seconds (its age + the profile's
    #: expected remaining seconds) ages at ``aging_per_duration / τ`` per second, rounded to a
    #: power of two (so a queue holds few distinct rates); None: every session at ``aging_per_s``.
    #: Off by default: 0.03 won the generated validation draws but loses 18.5 % on a validation
    #: draw of the real coding-trace mix (module doc, "Aging per session duration").
    aging_per_duration: float | None = None
    #: Added to the base score of a call of latency class ``"interactive"`` (module doc,
    #: "Latency classes"): a person waits on it, so it is ranked for time to first token, above
    #: every batch session that has not aged ``interactive_boost / aging_per_s`` seconds.
    interactive_boost: float = 2.0

    def __post_init__(self) -> None:
        if self.remaining_unit not in UNITS:
            raise ValueError(f"remaining_unit must be one of {', '.join(UNITS)}, got {self.remaining_unit!r}")
        if self.unknown_score is None:     # neutral: as if 3 calls remained, in the unit's scale
            neutral = (-self.w1 * math.log1p(NEUTRAL_CALLS) if self.remaining_unit == "tokens"
                       else self.w1 / (1.0 + NEUTRAL_CALLS))
            object.__setattr__(self, "unknown_score", neutral)

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
        score = self.w1 / (1.0 + max(0.0, float(remaining_calls)))
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

    def overtake_window_s(self, max_idle_term: float = 0.0) -> float:
        """The tail bound (module doc, "Bounded tail"): a session never ranks below one of its
        class that started more than this many seconds after it, ``(1 + max_idle_term) /
        aging_per_s`` — the calls key's base lies in (0, 1], ``max_idle_term`` bounds the
        idle-downstream term of the run (0 with one model pool)."""
        return (self.w1 + max(0.0, float(max_idle_term))) / self.aging_per_s

    def class_term(self, latency_class: str | None) -> float:
        """What the call's latency class adds to its base score: :attr:`interactive_boost` for
        ``"interactive"``, 0 for ``"batch"`` or an unclassified call (module doc, "Latency
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
        plus its latency class's :meth:`class_term` (module doc, "Latency classes").

        ``agent_model`` maps agent ids to the model that serves them, so that distances to
        agents (what the graph knows) become distances to models (what has a queue); the
        distance to a model is the smallest distance to any of its agents.
        """
        distance = self.downstream_distance(ann, agent_model)
        remaining = ann.expected_remaining_calls
        cls = self.class_term(ann.latency_class) if ann.known else 0.0
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
        return self.session_score(base, age, self.aging_rate(ann, age))

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
