"""Keep/drop retention in SGLang's radix cache: eviction by retain-until, then LRU.

SGLang evicts radix-tree leaves in the order of ``eviction_strategy.get_priority(node)``,
smallest first (``LRUStrategy``: last access time). This module replaces that order with

    (retention rank at now, <the configured strategy's key>)        # LRU by default

where the rank comes from :class:`policies.KeepDropPolicy`:

* ``KEEP`` (2) while ``now < retain_until`` — the session's path comes back, within the TTL
  of the tool it is running;
* ``DROP`` (0) for the exclusive tail of a session whose path ends or does not come back to
  it — evicted first, unless it has been accessed again since the decision;
* ``NEUTRAL`` (1) otherwise, i.e. plain LRU among everything unannotated or expired.

A request whose ``custom_params`` say ``session_end: true`` (the gateway's end-of-session
signal) is ``DROP`` whatever else it predicts — its exclusive tail is released first — and the
session's pending host prefetch is cancelled.

How the ranks get onto the tree: an AFTER hook on ``sglang.srt.mem_cache.common
.release_kv_cache`` (where a finished request hands its KV to the tree) reads the request's
``custom_params``, asks the keep/drop policy, and stamps the request's path in the tree:
``KEEP`` on every node from its last node up to the root (a shared prefix is retained as long
as any session retains it), ``DROP`` only on its exclusive tail (up to the first node shared
with another branch). A node split (``_split_node`` of either tree) copies the stamp to the
new parent.

The strategy is installed by the radix-cache backend ``workflow-retention``
(``--radix-cache-backend workflow-retention``), which builds SGLang's default cache with the
pure-Python tree core — the Rust core orders eviction natively and cannot take a Python
strategy — and wraps whatever ``--radix-eviction-policy`` configured.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sglang.srt.mem_cache.evict_policy import EvictionStrategy, LRUStrategy

from policies import Retention, RetentionRank
from serving_hooks.sglang_plugin.finish import decide_finished
from serving_hooks.sglang_plugin.observe import debug_enabled, decision
from serving_hooks.sglang_plugin.settings import BACKEND_NAME
from serving_hooks.sglang_plugin.state import get_state

logger = logging.getLogger(__name__)

#: Node attributes written by the stamps.
UNTIL_ATTR = "_awp_retain_until"
DROP_ATTR = "_awp_drop_access"


class RetentionEvictionStrategy(EvictionStrategy):
    """``(rank at now, inner key)``: dropped first, then LRU, retained last."""

    def __init__(self, clock: Callable[[], float] | None = None, inner: EvictionStrategy | None = None):
        self._clock = clock
        self.inner = inner or LRUStrategy()

    def clock(self) -> float:
        return (self._clock or get_state().now)()

    def rank(self, node: Any, now: float) -> RetentionRank:
        if getattr(node, UNTIL_ATTR, 0.0) > now:
            return RetentionRank.KEEP
        dropped_at = getattr(node, DROP_ATTR, None)
        if dropped_at is not None and node.last_access_time <= dropped_at:
            return RetentionRank.DROP
        return RetentionRank.NEUTRAL

    def get_priority(self, node: Any) -> tuple[int, Any]:
        return (int(self.rank(node, self.clock())), self.inner.get_priority(node))


def stamp_path(leaf: Any, retention: Retention, now: float) -> int:
    """Write ``retention`` onto the tree path ending at ``leaf``; returns nodes stamped."""
    n = 0
    node = leaf
    if retention.rank == RetentionRank.KEEP:
        while node is not None and node.parent is not None:  # the root has no parent
            if getattr(node, UNTIL_ATTR, 0.0) < retention.retain_until:
                setattr(node, UNTIL_ATTR, retention.retain_until)
            n += 1
            node = node.parent
    elif retention.rank == RetentionRank.DROP:
        while node is not None and node.parent is not None and len(node.children) <= 1:
            if getattr(node, UNTIL_ATTR, 0.0) > now:
                break  # another session still retains this prefix
            setattr(node, DROP_ATTR, node.last_access_time)
            n += 1
            node = node.parent
    return n


def stamp_finished_request(req: Any, tree_cache: Any, now: float | None = None) -> Retention | None:
    """Keep/drop decision for a finished request (:func:`.finish.decide_finished`), stamped onto
    its path in ``tree_cache``.

    The decision is always taken (it counts, and a session's end cancels its host prefetch);
    the stamp is only written where :class:`RetentionEvictionStrategy` reads it. Without the
    ``workflow-retention`` backend SGLang's default Rust tree core has no Python nodes to stamp
    (``resolve_node_handle`` raises ``NotImplementedError``) and nothing would read them."""
    state = get_state()
    now = state.now() if now is None else now
    retention = decide_finished(state, req, now)
    if retention is None or not retention_installed(tree_cache):
        return retention
    handle = getattr(req, "last_node", None)
    leaf = tree_cache.resolve_node_handle(handle) if handle is not None else None
    if leaf is not None:
        stamp_path(leaf, retention, now)
    return retention


def after_release_kv_cache(result: Any, req: Any, tree_cache: Any, *args: Any, checkpoint: bool = False,
                           **kwargs: Any) -> None:
    """AFTER hook on ``release_kv_cache(req, tree_cache, *, checkpoint)``.

    With ``AWP_SGLANG_DEBUG=1`` it also logs ``awp-decision finish rid=…``: the order in which the
    scheduler finished requests, free of the HTTP hops that reorder responses on the way out."""
    try:
        if checkpoint and req.finished():
            if debug_enabled():
                decision("finish", rid=getattr(req, "rid", "?"), t=round(get_state().now(), 3))
            stamp_finished_request(req, tree_cache)
    except Exception:  # retention is advice: never break the release path
        logger.exception("retention stamp failed for %s", getattr(req, "rid", "?"))
    return None


def after_split_node(result: Any, tree: Any, key: Any, child: Any, split_len: int, *args: Any,
                     **kwargs: Any) -> None:
    """AFTER hook on ``RadixCache._split_node`` / ``UnifiedTreeCore._split_node``.

    The new parent node holds the first part of ``child``'s tokens, so it inherits the
    retention; a drop stamp is re-based on the new node's own access time.
    """
    new_node = result[0] if isinstance(result, tuple) else result
    until = getattr(child, UNTIL_ATTR, None)
    if until is not None:
        setattr(new_node, UNTIL_ATTR, max(until, getattr(new_node, UNTIL_ATTR, 0.0)))
    dropped_at = getattr(child, DROP_ATTR, None)
    if dropped_at is not None and child.last_access_time <= dropped_at:
        setattr(new_node, DROP_ATTR, new_node.last_access_time)
    return None


def retention_installed(cache: Any) -> bool:
    """Whether ``cache`` evicts in retention order (:func:`install_retention_strategy` ran on it)."""
    target = getattr(cache, "tree_core", None) or cache
    return isinstance(getattr(target, "eviction_strategy", None), RetentionEvictionStrategy)


def install_retention_strategy(cache: Any, clock: Callable[[], float] | None = None) -> RetentionEvictionStrategy:
    """Wrap ``cache``'s eviction strategy (RadixCache, or UnifiedRadixCache's Python core)."""
    target = getattr(cache, "tree_core", None) or cache
    inner = getattr(target, "eviction_strategy", None)
    if inner is None:
        raise TypeError(
            f"{type(target).__name__} exposes no Python eviction_strategy (the Rust tree core "
            "orders eviction natively); build the cache with tree_core_backend='python'"
        )
    strategy = inner if isinstance(inner, RetentionEvictionStrategy) else RetentionEvictionStrategy(clock, inner)
    target.eviction_strategy = strategy
    return strategy


def retention_cache_factory(ctx: Any) -> Any:
    """Radix-cache backend ``workflow-retention``: SGLang's default cache + retention order."""
    from sglang.srt.mem_cache.registry import default_radix_cache_factory  # lazy as in register(): sglang only once it runs us

    if getattr(ctx.params, "tree_core_backend", None) is None:
        ctx.params.tree_core_backend = "python"
    cache = default_radix_cache_factory(ctx)
    install_retention_strategy(cache)
    logger.info("agent-workflow retention eviction installed on %s", type(cache).__name__)
    return cache
