"""What the plugin decides when a request finishes, free of SGLang imports.

:func:`decide_finished` reads the request's ``custom_params`` (the gateway's flat annotation),
asks the shared :class:`~policies.KeepDropPolicy` for the session prefix's
retention, counts it, and — for a request that ends its session (``session_end``) — cancels the
session's pending host prefetch. :mod:`.retention` stamps the decision onto the radix tree; the
parity test (tests/test_policy_parity.py) drives this function against the simulator's
keep/drop part without an SGLang install.
"""
from __future__ import annotations

from typing import Any

from policies import Retention
from serving_hooks.sglang_plugin.observe import decision
from serving_hooks.sglang_plugin.prefetch import cancel_session_prefetch
from serving_hooks.sglang_plugin.state import PluginState


def decide_finished(state: PluginState, req: Any, now: float) -> Retention | None:
    """The keep/drop decision for a finished request (None: it carries no annotation)."""
    ann = state.annotation(req)
    if ann is None:
        return None
    if ann.workflow_id:   # the relative guard's live set: a call finished, maybe its session's last
        state.sessions.finished(ann.workflow_id, now, end=ann.session_end is True)
    retention = state.settings.keep_drop.decide_annotation(ann, now)
    state.counters[f"retention_{retention.rank.name.lower()}"] += 1
    if ann.session_end:   # released: dropped, and no host copy of it is still wanted
        state.counters["retention_session_end"] += 1
        state.counters["prefetch_cancelled_session_end"] += cancel_session_prefetch(state, ann)
    decision("retention", rid=getattr(req, "rid", "?"), rank=retention.rank.name,
             retain_until=round(retention.retain_until, 3), session=ann.workflow_id, t=round(now, 3))
    return retention
