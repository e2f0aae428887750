"""Scheduler hooks for the graph-driven priority (Pythia alg. 3).

* ``Scheduler._add_request_to_queue`` (BEFORE): its integer ``priority`` is set (precedence in
  :func:`admit_request`: explicit ``priority`` > the gateway's ``custom_params`` > a default
  for untagged traffic) and its score and arrival time are remembered on the request — and,
  for the gateway's requests, as its *session's* latest score (``PluginState.sessions``, a
  :class:`~policies.bookkeeping.SessionPriorityBook`; a call without a prediction
  leaves its session's score as it is and takes that score, aged). What the plugin remembers
  of a request is one :class:`Admission` record on it (attribute :data:`ADMISSION_ATTR`).
  Under TP the times come from the scheduler's step counter, the same on every rank
  (``AWP_DECISION_CLOCK``, see :mod:`serving_hooks.sglang_plugin.settings`).
* ``SchedulePolicy.calc_priority`` (BEFORE): at each scheduling round, every remembered
  request's priority (waiting and running) becomes ``to_sglang(score + rate · waited)``
  with the score, arrival and aging rate of its session's latest call (``rate`` =
  ``PriorityPolicy.aging_rate`` of the call's annotation: ``aging_per_s``, or per session
  duration), so all calls of a workflow carry the workflow's priority; SGLang's own ``(priority, wait time)`` sort then serves the oldest
  work first among equals.

The score is the gateway's ``priority`` (the request's :class:`~predictors.contract.Annotation`,
rebuilt once from ``custom_params``, carries it as a float): the gateway computes it once with
:meth:`PriorityPolicy.call_priority`, ``base + aging · (session age at issue)``, so adding
``aging · (time since arrival)`` here gives the workflow-level score
``base + aging · (now − session start)`` without sharing a clock. The plugin only ages and
applies it; without a gateway priority it calls the same ``call_priority`` on the annotation.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from serving_hooks.sglang_plugin.observe import decision
from serving_hooks.sglang_plugin.prefetch import plan_prefetch
from serving_hooks.sglang_plugin.state import get_state

logger = logging.getLogger(__name__)

#: The one attribute the plugin sets on SGLang's ``Req`` objects: its :class:`Admission`.
ADMISSION_ATTR = "_awp_admission"


@dataclass(slots=True)
class Admission:
    """What the plugin remembers of a request it admitted (:func:`admit_request`)."""
    #: its base score (the gateway's priority score; ``from_sglang`` of a client's own integer)
    base: float
    #: when it arrived (the plugin's "now"): its aging reference when its session is not known
    enqueued_at: float
    #: its session's id: the request takes its session's latest score, aged (None: its own)
    session: str | None = None
    #: its aging rate per second (``PriorityPolicy.aging_rate`` of its annotation; None: the
    #: policy's ``aging_per_s``) when its session is not known
    rate: float | None = None


def admission_of(req: Any) -> Admission | None:
    """The request's :class:`Admission`, or None when the plugin has not admitted it."""
    return getattr(req, ADMISSION_ATTR, None)


def admit_request(req: Any, now: float | None = None, default_priority: int | None = None) -> bool:
    """Set ``req.priority`` (precedence below); remember its base score and arrival.

    Precedence of the base priority, highest first:

    1. an explicit top-level ``priority`` the request carries — a client's own value, or the
       gateway's (``--sglang-fields`` sends its prediction there, replacing the client's) — unless
       it equals ``default_priority`` (SGLang's ``--default-priority-value``, which the
       tokenizer writes into every request without one: indistinguishable from a client that
       sent exactly that value, so it counts as "not set");
    2. ``custom_params.priority`` (the gateway's prediction);
    3. the score :meth:`PriorityPolicy.call_priority` computes from the request's annotation (its
       ``custom_params``);
    4. untagged traffic (no custom_params): ``default_priority`` when set, else the policy's
       ``unknown_score`` — and it is aged like everything else, so it cannot starve
       (``AWP_UNTAGGED=off`` leaves untagged requests to SGLang alone).

    Whatever the source, the value is the *base*: at each scheduling round the plugin writes
    ``base + aging · (session age)`` back into ``req.priority`` (see :func:`age_queue`).
    Returns False when the request was left alone.
    """
    state = get_state()
    if admission_of(req) is not None:  # a retracted request keeps its first arrival
        return True
    ann = state.annotation(req)
    if ann is None and not state.settings.age_untagged:
        return False
    now = state.now() if now is None else now
    pol = state.settings.priority
    explicit = req.priority is not None and req.priority != default_priority
    session = ann.workflow_id if ann is not None else None
    score: float | None = None                 # the call's own score (None: no prediction)
    rate = pol.aging_rate(ann)                 # per session duration when the policy says so
    if explicit:
        gateway = ann is not None and ann.priority is not None and ann.sglang_priority() == req.priority
        source = "gateway" if gateway else "client"
        score = ann.priority if gateway else pol.from_sglang(req.priority)
    elif ann is None:
        req.priority = default_priority if default_priority is not None else pol.to_sglang(pol.unknown_score)
        source = "default"
    elif ann.priority is not None:             # the gateway's score: applied, not recomputed
        score, source = ann.priority, "gateway"
        req.priority = pol.to_sglang(score)
    elif ann.known:                            # no gateway priority: the one rule, here
        score, source = pol.call_priority(ann), "plugin"
        req.priority = pol.to_sglang(score)
    else:                                      # no prediction: the session's score, aged
        source = "plugin"
    if session:
        fallback = pol.session_score(pol.unknown_score, ann.session_age_s)
        # the relative guard's live set (PriorityPolicy.oldest_share): the session started
        # session_age_s before this call, on the plugin's clock
        started = now - max(0.0, float(ann.session_age_s or 0.0))
        ref = state.sessions.note(session, score, now, fallback=fallback, rate=rate,
                                  started_at=started, batch=ann.latency_class != "interactive")
        if score is None or pol.monotone or state.sessions.guard:
            # no prediction, a rank that never falls, or a guard that may lift the session:
            # the session's reference, aged, not the call's own score
            req.priority = pol.to_sglang(pol.aged(ref[0], ref[1], now, state.sessions.rate(session)))
    elif score is None and ann is not None:
        score = pol.session_score(pol.unknown_score, ann.session_age_s)
        req.priority = pol.to_sglang(score)
    base = score if score is not None else pol.from_sglang(req.priority)
    setattr(req, ADMISSION_ATTR, Admission(base, now, session or None,
                                           rate if score is not None else None))
    state.counters["priority_set"] += 1
    state.counters[f"priority_from_{source}"] += 1
    decision("priority", rid=getattr(req, "rid", "?"), priority=req.priority, source=source,
             session=session, t=round(now, 3))
    if ann is not None:
        plan_prefetch(state, req, ann, state.clock())
    return True


def age_queue(waiting_queue: list, now: float | None = None) -> int:
    """Re-score every admitted request of ``waiting_queue``: its session's latest score aged
    from that call's arrival (its own score and arrival when the session is not known)."""
    state = get_state()
    now = state.now() if now is None else now
    pol = state.settings.priority
    n = 0
    for req in waiting_queue:
        adm = admission_of(req)
        if adm is None:
            continue
        ref = state.sessions.reference(adm.session or "")
        if ref is not None:
            (score, since), rate = ref, state.sessions.rate(adm.session)
        else:
            score, since, rate = adm.base, adm.enqueued_at, adm.rate
        req.priority = pol.to_sglang(pol.aged(score, since, now, rate))
        n += 1
    return n


def before_add_request_to_queue(scheduler: Any, req: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE hook on ``Scheduler._add_request_to_queue(self, req, is_retracted=False)``.

    A request admitted before that enters the queue again lost its KV and will be prefilled
    again: ``requeued_retracted`` counts those SGLang retracted (KV pool full,
    ``is_retracted=True``), ``requeued_preempted`` those a higher priority preempted
    (``--priority-scheduling-preemption-threshold``) — the re-prefills the plugin's counters line
    reports."""
    state = get_state()
    state.sync(scheduler)
    if admission_of(req) is not None:
        retracted = kwargs.get("is_retracted", args[0] if args else False)
        state.counters["requeued_retracted" if retracted else "requeued_preempted"] += 1
    admit_request(req, default_priority=getattr(getattr(scheduler, "server_args", None),
                                                "default_priority_value", None))


def before_calc_priority(policy: Any, waiting_queue: list, running_batch: Any = None, *args: Any,
                         **kwargs: Any) -> None:
    """BEFORE hook on ``SchedulePolicy.calc_priority(self, waiting_queue, running_batch, ...)``.

    The running requests are re-scored too: SGLang's priority preemption compares a waiting
    request's priority with the running ones', and with both aged at the same rate their
    difference stays ``Δbase + aging · Δarrival``, so a long-running request is not preempted
    merely because its priority was frozen when it started.

    Only with ``--enable-priority-scheduling`` and SGLang's default order (bigger first); with
    ``--schedule-low-priority-values-first`` the gateway's priorities would be inverted, so
    the plugin leaves the queue alone and logs it once.
    """
    if not getattr(policy, "enable_priority_scheduling", False):
        return
    if getattr(policy, "schedule_low_priority_values_first", False):
        state = get_state()
        if not state.counters["low_values_first_warned"]:
            logger.warning(
                "agent-workflow plugin: --schedule-low-priority-values-first inverts the "
                "gateway's priorities (bigger = sooner); aging disabled"
            )
        state.counters["low_values_first_warned"] += 1
        return
    now = get_state().now()
    age_queue(waiting_queue, now)
    if running_batch is not None and getattr(running_batch, "reqs", None):
        age_queue(running_batch.reqs, now)
