"""SGLang plugin: graph-driven priority, keep/drop retention and host prefetch.

Loaded by SGLang itself: ``pyproject.toml`` declares the entry point ::

    [project.entry-points."sglang.srt.plugins"]
    agent_workflow = "serving_hooks.sglang_plugin:register"

and every SGLang process (server, scheduler, detokenizer) calls :func:`register` from
``sglang.srt.plugins.load_plugins()`` before it starts serving, then applies the hooks.
What :func:`register` installs (all through ``sglang.srt.plugins.hook_registry.HookRegistry``
and ``sglang.srt.mem_cache.registry.register_radix_cache_backend``):

==================================================================  ========  ==================================
target                                                              type      does
==================================================================  ========  ==================================
``sglang.srt.managers.scheduler.Scheduler._add_request_to_queue``   BEFORE    ``req.priority`` from custom_params;
                                                                              plan the host prefetch
``sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority``  BEFORE  aging of waiting and
                                                                              running requests
``sglang.srt.mem_cache.common.release_kv_cache``                    AFTER     keep/drop stamp on the finished
                                                                              request's radix path
``sglang.srt.mem_cache.radix_cache.RadixCache._split_node``         AFTER     stamp follows node splits
``…unified_tree_core.UnifiedTreeCore._split_node``                  AFTER     same, unified tree
``sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run``   AFTER     run due host prefetches
``--radix-cache-backend workflow-retention``                        backend   eviction: retain-until, then LRU
==================================================================  ========  ==================================

The policies themselves live in :mod:`serving_hooks.policies` (no SGLang import); this
package only adapts them.

**Opt-in.** The plugin is off unless the server's environment has ``AWP_SGLANG_PLUGIN=1``: the
entry point makes SGLang call :func:`register` in every server of an environment where this
package is installed, and a server that did not ask for it runs as plain SGLang. Either way
:func:`register` prints one line to stderr (the server log), ``agent-workflow plugin on: …`` or
``agent-workflow plugin off: …``: SGLang loads plugins before it configures logging, so a
``logging`` record written here would be lost. Only the server's main process prints it (SGLang
starts its scheduler and detokenizer with ``multiprocessing``, and those load the plugin too);
the scheduler then logs ``agent-workflow plugin active: …`` at its first scheduling round, and
its counters (with ``hook_us_<hook>``, the time spent in each hook) every ``AWP_LOG_EVERY_S``. The
other knobs are in :mod:`serving_hooks.sglang_plugin.settings`.
"""
from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import sys
import time
from collections.abc import Callable
from importlib import import_module
from typing import Any, Literal, NamedTuple

from serving_hooks.sglang_plugin.settings import BACKEND_NAME
from serving_hooks.sglang_plugin.state import get_state

logger = logging.getLogger(__name__)



class Hook(NamedTuple):
    """One hook :func:`register` installs (the table in the module doc).

    ``target`` and ``when`` are SGLang's names: the dotted name of the hooked function (the key
    of ``HookRegistry``) and the ``HookType`` member. The implementation is named by module and
    function and imported by :meth:`load` only when SGLang registers the plugin: this package
    is imported in every SGLang process, also where the plugin is off, and :mod:`.retention`
    imports sglang at import."""
    target: str
    when: Literal["BEFORE", "AFTER"]
    #: module under ``serving_hooks.sglang_plugin`` and its function
    module: str
    function: str

    def load(self) -> Callable[..., Any]:
        """The hook function."""
        return getattr(import_module(f"{__name__}.{self.module}"), self.function)


_SCHED = "sglang.srt.managers.scheduler.Scheduler"
HOOKS: tuple[Hook, ...] = (
    Hook(f"{_SCHED}._add_request_to_queue", "BEFORE", "priority_hooks", "before_add_request_to_queue"),
    Hook("sglang.srt.managers.schedule_policy.SchedulePolicy.calc_priority", "BEFORE",
         "priority_hooks", "before_calc_priority"),
    Hook("sglang.srt.mem_cache.common.release_kv_cache", "AFTER", "retention", "after_release_kv_cache"),
    Hook("sglang.srt.mem_cache.radix_cache.RadixCache._split_node", "AFTER", "retention", "after_split_node"),
    Hook("sglang.srt.mem_cache.unified_cache.unified_tree_core.UnifiedTreeCore._split_node", "AFTER",
         "retention", "after_split_node"),
    Hook(f"{_SCHED}.get_next_batch_to_run", "AFTER", "prefetch", "after_get_next_batch_to_run"),
)

_registered = False
_announced = False


def announce(line: str) -> bool:
    """Print the plugin's on/off line to stderr from the server's main process, once (module
    doc: why not logging); SGLang's ``multiprocessing`` children stay quiet. True when printed."""
    global _announced
    if _announced or multiprocessing.parent_process() is not None:
        return False
    _announced = True
    print(f"{line} (pid {os.getpid()})", file=sys.stderr, flush=True)
    return True


def timed(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` adding the wall time it takes (µs) to the counter ``hook_us_<name>``: what the
    plugin costs the scheduler's loop, per hook, in the counters line the bench reads."""
    counters = get_state().counters
    key = f"hook_us_{name}"

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            counters[key] += int((time.perf_counter() - t) * 1e6)

    return wrapper


def register() -> None:
    """Entry point of group ``sglang.srt.plugins``: register the hooks and the cache backend.

    Idempotent; a no-op unless ``AWP_SGLANG_PLUGIN=1`` (opt-in, module doc).
    """
    global _registered
    if _registered:
        return
    if not get_state().settings.enabled:
        announce("agent-workflow plugin off: AWP_SGLANG_PLUGIN is not 1, SGLang runs unchanged")
        return
    # sglang (and retention, which subclasses its cache) only when sglang calls us: SGLang loads
    # this entry point in every process, and the policies/state must import without it.
    from sglang.srt.mem_cache.registry import get_radix_cache_factory, register_radix_cache_backend
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for hook in HOOKS:
        HookRegistry.register(hook.target, timed(hook.function, hook.load()), HookType[hook.when])
    from serving_hooks.sglang_plugin.retention import retention_cache_factory

    if get_radix_cache_factory(BACKEND_NAME) is None:
        register_radix_cache_backend(BACKEND_NAME, retention_cache_factory)
    _registered = True
    announce(f"agent-workflow plugin on: {len(HOOKS)} hooks and radix cache backend "
             f"{BACKEND_NAME!r} registered (AWP_SGLANG_PLUGIN=1)")
    logger.info("agent-workflow plugin registered %d hooks and backend %r", len(HOOKS), BACKEND_NAME)
