"""Serving policies: one implementation each, free of SGLang imports.

The SGLang plugin (``serving_hooks.sglang_plugin``), the gateway's router
(``serving_hooks.routing``) and the simulator all drive these same objects. None of them
reads a clock: every time is passed in as ``now`` (seconds on any monotonic scale).

==========================  =======================================================
:class:`Annotation`         the per-call prediction message (``predictors.contract``)
:class:`CapacityLedger`     bookkeeping: requests in flight, drain rate, last replica
:class:`SessionPriorityBook`  bookkeeping: each session's priority reference
:class:`ModelPools`         bookkeeping: replicas per model pool, agents' pools, pool queues
:class:`PriorityPolicy`     Pythia alg. 3 per workflow: remaining work + idle downstream
:class:`CapacityPolicy`     Pythia alg. 2: union bound (risk split), session affinity
:class:`KeepDropPolicy`     Pythia alg. 1 + SAGA TTL: retain / drop a session prefix
:class:`PrefetchPolicy`     Pythia alg. 1: just-in-time host staging of the next prefix
:class:`AutoscalePolicy`    Pythia alg. 4: projected calls → suggested replicas
:class:`PrePrefillPolicy`   idle capacity prefills a predicted next call's known prefix
:class:`SessionEndRule`     end of session: client's last call or confident ``p_end``
==========================  =======================================================
"""
from predictors.contract import (Annotation, NextAgent, ToolLatency, from_custom_params,
                                 to_sglang_custom_params)
from policies.bookkeeping import (CapacityLedger, SessionPriorityBook,
                                                capacity_request)
from policies.autoscale import (AutoscalePolicy, autoscale_advice, live_autoscale_advice,
                                              live_projection)
from policies.capacity import (
    ActiveRequest,
    CapacityPolicy,
    Placement,
    ReplicaCheck,
    ReplicaState,
    replicas_from_snapshot,
)
from policies.keep_drop import (
    KeepDropPolicy,
    Retention,
    RetentionRank,
    lognormal_quantile,
    revisit_probability,
)
from policies.pools import ModelPools, NoReplicaForModel, pool_queue_depths
from policies.prefetch import HOST_TIER, PrefetchPlan, PrefetchPolicy
from policies.preprefill import PrePrefillPolicy
from policies.priority import PriorityPolicy
from policies.session_end import DEFAULT_SESSION_END_P, SessionEndRule

__all__ = [
    "ActiveRequest",
    "DEFAULT_SESSION_END_P",
    "SessionEndRule",
    "Annotation",
    "NextAgent",
    "ToolLatency",
    "from_custom_params",
    "to_sglang_custom_params",
    "AutoscalePolicy",
    "live_autoscale_advice",
    "live_projection",
    "CapacityLedger",
    "SessionPriorityBook",
    "capacity_request",
    "CapacityPolicy",
    "HOST_TIER",
    "KeepDropPolicy",
    "ModelPools",
    "NoReplicaForModel",
    "Placement",
    "PrefetchPlan",
    "PrefetchPolicy",
    "PrePrefillPolicy",
    "PriorityPolicy",
    "ReplicaCheck",
    "ReplicaState",
    "Retention",
    "RetentionRank",
    "autoscale_advice",
    "lognormal_quantile",
    "pool_queue_depths",
    "replicas_from_snapshot",
    "revisit_probability",
]
