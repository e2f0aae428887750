"""Host prefetch staging through a real UnifiedRadixCache with HiCache on CPU: in process with
either tree core, and in a real ``sglang.launch_server`` that runs HiCache without the
``workflow-retention`` backend (SGLang's default Rust tree core)."""
from __future__ import annotations

import importlib.util
import re

import pytest

_SGLANG = importlib.util.find_spec("sglang")
if _SGLANG is None or _SGLANG.origin is None:  # a namespace match is this folder, not sglang
    pytest.skip("sglang is not installed (see tests/sglang/conftest.py)", allow_module_level=True)

from array import array
from types import SimpleNamespace

import httpx
import torch

from serving_hooks.annotations import flatten_for_sglang
from serving_hooks.replay_prompts import words
from serving_hooks.sglang_plugin.prefetch import run_due_prefetches
from serving_hooks.sglang_plugin.priority_hooks import admit_request
from serving_hooks.sglang_plugin.state import get_state
from tests.serving_helpers import wait_for
from tests.sglang.real_server import SGLangServer, build_tiny_model, missing_server_modules

pytestmark = pytest.mark.usefixtures("sglang_runtime")
POOL = 96
PROMPT = 40


#: Plugin clock start for this module (the ``clock`` fixture of conftest.py reads it).
CLOCK_START = 0.0


@pytest.fixture(params=["rust", "python"])
def hicache_on_cpu(request, monkeypatch):
    """HiCache (device pool + host pool + controller) on CPU tensors, with either tree core:
    ``rust`` is SGLang's default (what a server without ``--radix-cache-backend`` builds; it
    hands out node ids only), ``python`` is what the ``workflow-retention`` backend builds.

    Three CPU stand-ins for CUDA-only pieces, restored after the test: the host pool is
    allocated without pinning (``cudaHostRegister``), ``torch.cpu.Stream`` gets the no-op
    ``synchronize`` CUDA streams have, and the ``direct`` IO backend's CUDA copy kernel is
    replaced by the same copy in plain torch indexing.
    """
    import sglang.srt.mem_cache.pool_host.common as host_common
    import sglang.srt.mem_cache.pool_host.mha as mha_host
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.runtime_context import get_context

    def alloc_unpinned(dims, dtype, device, pin_memory, allocator, registration_granularity_bytes=None):
        return host_common.alloc_with_host_register(dims, dtype, device, False, allocator,
                                                    registration_granularity_bytes)

    def copy_direct(src_layers, dst_layers, src_indices, dst_indices, page_size=1, **_):
        for src, dst in zip(src_layers, dst_layers, strict=True):
            dst[dst_indices] = src[src_indices]

    funcs = mha_host.ALLOC_MEMORY_FUNCS
    monkeypatch.setattr(funcs, "default_factory", lambda: alloc_unpinned)
    for key in list(funcs):
        monkeypatch.setitem(funcs, key, alloc_unpinned)
    monkeypatch.setattr(torch.cpu.Stream, "synchronize", lambda self: None, raising=False)
    monkeypatch.setattr(mha_host, "transfer_kv_direct", copy_direct, raising=False)

    override = get_context().override_server_args(
        enable_hierarchical_cache=True, hicache_ratio=2.0, hicache_write_policy="write_back",
        hicache_io_backend="direct", hicache_mem_layout="layer_first", page_size=1,
        enable_priority_scheduling=True,
    )
    server_args = override.install()
    kv = MHATokenToKVPool(size=POOL, page_size=1, dtype=torch.float16, head_num=1, head_dim=8, layer_num=2,
                          device="cpu", enable_memory_saver=False)
    allocator = TokenToKVPoolAllocator(POOL, torch.float16, "cpu", kv, need_sort=False)
    params = CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=allocator,
                             page_size=1, tree_components=(ComponentType.FULL,), tree_core_backend=request.param)
    cache = UnifiedRadixCache(params)
    cache.init_hicache(server_args, params)
    assert cache.cache_controller is not None
    assert type(cache.tree_core).__name__ == {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}[request.param]
    yield cache, kv, allocator
    cache.shutdown()
    override.restore()


def _admitted_req(tokens: array, custom_params: dict):
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req("call-1", "", tokens, SamplingParams(max_new_tokens=8, custom_params=custom_params), priority=None)
    assert admit_request(req)
    return req


def test_next_agent_prefix_is_staged_to_host_just_in_time(clock, hicache_on_cpu):
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    cache, kv, allocator = hicache_on_cpu
    tokens = array("q", range(100, 100 + PROMPT))
    # the call's prompt is prefilled and cached on the device, as after its prefill
    slots = allocator.alloc(PROMPT)
    for layer in range(2):
        kv.k_buffer[layer][slots] = 1.5 + layer
        kv.v_buffer[layer][slots] = -2.0
    node = cache.insert(InsertParams(key=RadixKey(tokens), value=slots)).last_device_node  # a node id

    # admitted at t=0 with a confident next agent and 80..400 output tokens predicted:
    # finish = 40/8000 + 80/40 = 2.005 s; copy 40/200000 s; start = 2.005 - 0.0002 - 0.05 = 1.9548 s
    req = _admitted_req(tokens, {"known": True, "wf_id": "w", "agent": "planner", "pred_out_lo": 80,
                                 "pred_out_hi": 400, "exp_remaining_calls": 3, "next_agent": "coder",
                                 "next_agent_p": 0.9})
    scheduler = SimpleNamespace(tree_cache=cache, tp_size=1)
    assert run_due_prefetches(scheduler, now=1.9) == 0 and not cache.is_backuped(node)  # not yet: just in time
    free_before = allocator.available_size()
    assert run_due_prefetches(scheduler, now=1.96) == PROMPT
    cache.writing_check(write_back=True)  # the scheduler drains write acks in its loop
    assert cache.is_backuped(node)  # a host copy exists before any memory pressure
    assert allocator.available_size() == free_before  # no device memory was taken
    assert cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens))).device_prefix_len == PROMPT
    assert get_state().counters["prefetch_staged_tokens"] == PROMPT
    assert get_state().counters["prefetch_errors"] == 0
    assert run_due_prefetches(scheduler, now=100.0) == 0  # a plan runs once

    # the tool call is long; memory pressure evicts the prefix from the device...
    for layer in range(2):
        kv.k_buffer[layer][slots] = 0.0
    cache.evict(EvictParams(num_tokens=PROMPT))
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    assert match.device_prefix_len == 0 and match.host_hit_length == PROMPT
    # ...and the next call loads it back from host instead of recomputing it
    assert cache.load_back(match.best_match_node)
    cache.ready_to_load_host_cache()
    match = cache.match_prefix(MatchPrefixParams(key=RadixKey(tokens)))
    idx = cache.path_device_indices(match.last_device_node)
    assert match.device_prefix_len == PROMPT
    assert torch.all(kv.k_buffer[0][idx] == 1.5) and torch.all(kv.k_buffer[1][idx] == 2.5)
    assert torch.all(kv.v_buffer[1][idx] == -2.0)
    del req


def test_no_plan_for_an_unsure_next_agent_and_no_host_tier_is_skipped(clock):
    tokens = array("q", range(10))
    _admitted_req(tokens, {"known": True, "next_agent": "coder", "next_agent_p": 0.2, "exp_remaining_calls": 2})
    assert get_state().prefetch.pending() == 0
    _admitted_req(tokens, {"known": True, "next_agent": "coder", "next_agent_p": 0.8, "exp_remaining_calls": 2})
    assert get_state().prefetch.pending() == 1
    assert run_due_prefetches(SimpleNamespace(tree_cache=object(), tp_size=1), now=1e6) == 0
    assert get_state().counters["prefetch_skipped_no_host_tier"] == 1


@pytest.fixture(scope="module")
def hicache_server_without_retention(tmp_path_factory):
    """A real CPU SGLang server with the plugin and HiCache but SGLang's own radix cache (no
    ``--radix-cache-backend``): the "no-retention" arm of ``bench/bench_engine.py --ablation``."""
    missing = missing_server_modules()
    if missing:
        pytest.skip(f"a real SGLang server needs {', '.join(missing)} (.ci/run installs them)")
    root = tmp_path_factory.mktemp("sglang_hicache_plain")
    srv = SGLangServer(build_tiny_model(root / "model"), root / "server.log", extra_args=[
        "--max-total-tokens", "2048", "--enable-priority-scheduling", "--schedule-policy", "fcfs",
        "--enable-hierarchical-cache", "--hicache-ratio", "2", "--hicache-write-policy", "write_back",
        "--hicache-io-backend", "direct", "--hicache-mem-layout", "layer_first", "--enable-cache-report",
    ], env={"AWP_SGLANG_PLUGIN": "1", "AWP_LOG_EVERY_S": "1", "AWP_KEEP_IDLE": "1"})
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def _last_counters(log: str) -> dict[str, int] | None:
    lines = [l for l in log.splitlines() if "agent-workflow plugin counters:" in l]
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])} if lines else None


@pytest.mark.slow
def test_prefetch_stages_on_sglang_own_hicache_cache(hicache_server_without_retention):
    """Without the retention backend SGLang builds its default cache on the Rust tree core, which
    has node ids but no Python nodes; a call with a confident next agent is still staged to host:
    ``prefetch_staged`` > 0 and no ``prefetch_errors`` (it was 44 errors, 0 staged, before)."""
    srv = hicache_server_without_retention
    ann = {"known": True, "expected_remaining_calls": 3.0, "p_end": 0.05,
           "next_agents": [{"agent_id": "coder", "p": 0.9}], "output_len_mean": 4,
           "predicted_output_len": [4, 4]}
    params = flatten_for_sglang(ann, {"workflow_type_id": "ca", "workflow_id": "wf-plain", "agent_id": "coder"})
    body = {"text": words(300, "plain-hicache", 0),
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True, "temperature": 0,
                                "custom_params": params}}
    r = httpx.post(srv.url + "/generate", json=body, timeout=300, trust_env=False)
    assert r.status_code == 200, r.text

    def settled() -> bool:
        c = _last_counters(srv.log_text()) or {}
        return c.get("prefetch_staged", 0) + c.get("prefetch_errors", 0) >= 1

    assert wait_for(settled, 120, every_s=0.2), srv.log_tail()
    counters = _last_counters(srv.log_text())
    assert "backend=workflow-retention in_use=False" in srv.log_text()   # SGLang's own cache
    assert counters.get("prefetch_errors", 0) == 0, (counters, srv.log_tail())
    assert counters["prefetch_staged"] >= 1 and counters["prefetch_staged_tokens"] > 0, counters
    log = srv.log_text()
    assert "host prefetch staging failed" not in log
    # the finished call's keep/drop is decided (and counted) but not stamped: no Python nodes
    assert counters.get("retention_keep", 0) == 1 and "retention stamp failed" not in log
