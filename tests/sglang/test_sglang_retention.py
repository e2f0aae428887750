"""Keep/drop retention inside real sglang radix caches under memory pressure."""
from __future__ import annotations

import importlib.util
from dataclasses import replace

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin is None:  # a namespace match is this folder, not sglang
    pytest.skip("sglang is not installed (see tests/sglang/conftest.py)", allow_module_level=True)

from array import array

import torch

from policies import RetentionRank
from serving_hooks.sglang_plugin.retention import (
    BACKEND_NAME,
    RetentionEvictionStrategy,
    install_retention_strategy,
    stamp_finished_request,
)
from serving_hooks.sglang_plugin.state import get_state

pytestmark = pytest.mark.usefixtures("sglang_runtime")

POOL_TOKENS = 96
SESSION_TOKENS = 40


#: Plugin clock start for this module (the ``clock`` fixture of conftest.py reads it).
CLOCK_START = 500.0


@pytest.fixture(autouse=True)
def _keeping_on(clock):
    """These tests exercise the KEEP stamp; keeping is opt-in (``AWP_KEEP_IDLE=1``)."""
    state = get_state()
    state.settings = replace(state.settings, keep_drop=replace(state.settings.keep_drop, keep_idle=True))
    yield


def _pool():
    """A real CPU KV pool of POOL_TOKENS slots and its allocator."""
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    kv = MHATokenToKVPool(size=POOL_TOKENS, page_size=1, dtype=torch.float16, head_num=1, head_dim=8,
                          layer_num=1, device="cpu", enable_memory_saver=False)
    return TokenToKVPoolAllocator(POOL_TOKENS, torch.float16, "cpu", kv, need_sort=False)


def _unified_cache_from_backend(server_args, allocator):
    """The cache SGLang builds for ``--radix-cache-backend workflow-retention``."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.registry import TreeCacheBuildContext, get_radix_cache_factory

    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                             page_size=1)
    ctx = TreeCacheBuildContext(server_args=server_args, params=params, is_hybrid_swa=False,
                                is_hybrid_ssm=False, enable_hierarchical_cache=False,
                                disable_radix_cache=False, tp_worker=None, model_config=None, tp_size=1,
                                tp_rank=0, tp_group=None)
    return get_radix_cache_factory(BACKEND_NAME)(ctx)


def _plain_unified_cache(allocator):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    return UnifiedRadixCache(CacheInitParams(
        disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator, page_size=1,
        tree_components=(ComponentType.FULL,), tree_core_backend="python"))


def _radix_cache(allocator):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.radix_cache import RadixCache

    return RadixCache(CacheInitParams(disable=False, req_to_token_pool=None,
                                      token_to_kv_pool_allocator=allocator, page_size=1))


def _finish_session(cache, allocator, first_token: int, custom_params: dict | None):
    """Insert one finished call's prompt+output KV, as the scheduler's checkpoint does, and
    run the plugin's completion hook on a real Req pointing at it."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    tokens = array("q", range(first_token, first_token + SESSION_TOKENS))
    result = cache.insert(InsertParams(key=RadixKey(tokens), value=allocator.alloc(SESSION_TOKENS)))
    req = Req(f"r{first_token}", "", tokens, SamplingParams(max_new_tokens=1, custom_params=custom_params))
    req.last_node = result.last_device_node
    return stamp_finished_request(req, cache)


def _cached_len(cache, first_token: int) -> int:
    from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    key = RadixKey(array("q", range(first_token, first_token + SESSION_TOKENS)))
    return cache.match_prefix(MatchPrefixParams(key=key)).device_prefix_len


RETAINED = {"known": True, "wf_id": "keep", "agent": "coder", "exp_remaining_calls": 3.0,
            "next_agent": "coder", "next_agent_p": 0.9, "tool_p95_s": 30.0}
DEAD = {"known": True, "wf_id": "done", "agent": "verifier", "exp_remaining_calls": 0.0}


def _pressure(cache, allocator) -> None:
    """A new 40-token request arrives with 16 free slots: the scheduler's eviction path."""
    from sglang.srt.mem_cache.common import evict_from_tree_cache

    need = SESSION_TOKENS
    assert allocator.available_size() == POOL_TOKENS - 2 * SESSION_TOKENS
    evict_from_tree_cache(cache, need)
    assert allocator.alloc(need) is not None


@pytest.mark.parametrize("build", ["backend", "radix"])
def test_retention_evicts_the_dropped_session_where_lru_evicts_the_retained_one(build, clock, sglang_runtime):
    # --- plain LRU, same sequence: the retained session finished first, so it is evicted
    allocator = _pool()
    lru = _plain_unified_cache(allocator) if build == "backend" else _radix_cache(allocator)
    _finish_session(lru, allocator, 100, RETAINED)
    _finish_session(lru, allocator, 200, DEAD)
    _pressure(lru, allocator)
    assert _cached_len(lru, 100) == 0 and _cached_len(lru, 200) == SESSION_TOKENS

    # --- with the plugin's retention order
    allocator = _pool()
    if build == "backend":
        cache = _unified_cache_from_backend(sglang_runtime, allocator)
        assert isinstance(cache.tree_core.eviction_strategy, RetentionEvictionStrategy)
    else:
        cache = _radix_cache(allocator)
        install_retention_strategy(cache)
    keep = _finish_session(cache, allocator, 100, RETAINED)
    drop = _finish_session(cache, allocator, 200, DEAD)
    assert keep.rank == RetentionRank.KEEP and keep.retain_until == 530.0  # p95 of the tool: 30 s
    assert drop.rank == RetentionRank.DROP
    clock.t = 510.0  # the retained session's tool call is still running
    _pressure(cache, allocator)
    assert _cached_len(cache, 100) == SESSION_TOKENS  # retained prefix survives
    assert _cached_len(cache, 200) == 0  # dead session's prefix went first


def test_retention_expires_into_lru_and_reaccess_clears_a_drop(clock, sglang_runtime):
    allocator = _pool()
    cache = _unified_cache_from_backend(sglang_runtime, allocator)
    _finish_session(cache, allocator, 100, RETAINED)  # retained until 530
    _finish_session(cache, allocator, 200, DEAD)
    assert _cached_len(cache, 200) == SESSION_TOKENS  # the "dead" session is read again: no longer dropped
    clock.t = 531.0  # TTL over: both neutral, plain LRU -> the older session (100) goes
    _pressure(cache, allocator)
    assert _cached_len(cache, 100) == 0 and _cached_len(cache, 200) == SESSION_TOKENS
    assert get_state().counters["retention_keep"] == 1 and get_state().counters["retention_drop"] == 1


def test_split_node_inherits_retention_and_shared_prefix_is_not_dropped(clock, sglang_runtime):
    """Two sessions share a 20-token system prompt; the dead one's drop stops at the fork."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import InsertParams
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    allocator = _pool()
    cache = _radix_cache(allocator)
    strategy = install_retention_strategy(cache)
    shared = list(range(1, 21))
    a = array("q", shared + list(range(100, 120)))
    b = array("q", shared + list(range(200, 220)))
    ra = cache.insert(InsertParams(key=RadixKey(a), value=allocator.alloc(40)))
    req_a = Req("a", "", a, SamplingParams(max_new_tokens=1, custom_params=RETAINED))
    req_a.last_node = ra.last_device_node
    stamp_finished_request(req_a, cache)
    # inserting b splits a's node at token 20 (the patched _split_node copies the stamp)
    prefix = cache.insert(InsertParams(key=RadixKey(b), value=allocator.alloc(40)))
    fork = prefix.last_device_node.parent
    assert len(fork.key) == 20 and len(fork.children) == 2
    assert strategy.rank(fork, clock.t) == RetentionRank.KEEP
    req_b = Req("b", "", b, SamplingParams(max_new_tokens=1, custom_params=DEAD))
    req_b.last_node = prefix.last_device_node
    stamp_finished_request(req_b, cache)
    assert strategy.rank(prefix.last_device_node, clock.t) == RetentionRank.DROP
    assert strategy.rank(fork, clock.t) == RetentionRank.KEEP


def test_a_session_end_call_is_released_though_its_prediction_goes_on(clock, sglang_runtime):
    """The gateway's end-of-session signal (``custom_params.session_end``, issue 24 item 7): a
    call whose prediction alone would keep its prefix (``RETAINED``) is dropped when it is
    marked as its session's last, so under pressure it goes first and the other session's
    unannotated prefix (plain LRU, finished earlier) survives; its pending host prefetch is
    cancelled."""
    state = get_state()
    state.prefetch.plan("earlier", 500.0, "coder", 0.9, finish_at=600.0, prefix_tokens=10,
                        session="ending")
    allocator = _pool()
    cache = _unified_cache_from_backend(sglang_runtime, allocator)
    _finish_session(cache, allocator, 100, None)                     # unannotated, older
    ended = _finish_session(cache, allocator, 200, {**RETAINED, "wf_id": "ending", "session_end": True})
    assert ended.rank == RetentionRank.DROP and ended.reason == "session ends"
    assert state.prefetch.pending() == 0 and state.counters["prefetch_cancelled_session_end"] == 1
    _pressure(cache, allocator)
    assert _cached_len(cache, 200) == 0                # released first
    assert _cached_len(cache, 100) == SESSION_TOKENS   # LRU alone would have evicted this one
