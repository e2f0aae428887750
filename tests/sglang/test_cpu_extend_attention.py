"""The CPU stand-in for SGLang's torch-native extend attention (``tests/sglang/cpu_standins``):
it attends with the new tokens' queries only and must give the rows SGLang's whole-sequence
version keeps, so a real CPU server answers the same while a cached prefix saves attention work."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
TorchNativeAttnBackend = pytest.importorskip(
    "sglang.srt.layers.attention.torch_native_backend").TorchNativeAttnBackend

from tests.sglang.cpu_standins import awp_cpu_standins as standins  # noqa: E402


def _original():
    f = TorchNativeAttnBackend._run_sdpa_forward_extend
    return getattr(f, "awp_original", f)


@pytest.mark.parametrize("gqa", [False, True])
def test_new_token_queries_give_the_rows_sglang_keeps(gqa: bool) -> None:
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d = 4, (2 if gqa else 4), 8
    prefix = torch.tensor([0, 7, 3])          # cached tokens of each sequence (0: a cold prefill)
    new = torch.tensor([5, 4, 1])             # tokens computed in this extend
    seq = prefix + new
    pool = 64
    k_cache = torch.randn(pool, kv_heads, d, generator=g)
    v_cache = torch.randn(pool, kv_heads, d, generator=g)
    req_to_token = torch.zeros(3, 32, dtype=torch.int64)
    slots = torch.randperm(pool, generator=g)
    used = 0
    for i, n in enumerate(seq.tolist()):        # each sequence's tokens at scattered pool slots
        req_to_token[i, :n] = slots[used:used + n]
        used += n
    query = torch.randn(int(new.sum()), heads, d, generator=g)
    args = (k_cache, v_cache, req_to_token, torch.tensor([0, 1, 2]), seq, prefix, new)
    kw = {"scaling": d ** -0.5, "enable_gqa": gqa, "causal": True}
    want = _original()(None, query.clone(), torch.zeros_like(query), *args, **kw)
    got = standins.extend_attention_new_tokens(_original())(None, query.clone(), torch.zeros_like(query), *args, **kw)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_what_it_does_not_cover_goes_to_sglangs_own() -> None:
    calls = []

    def original(*a, **kw):
        calls.append(kw)
        return "sglang"

    run = standins.extend_attention_new_tokens(original)
    z = torch.zeros(1)
    assert run(None, z, z, z, z, z, z, z, z, z, causal=False) == "sglang"
    assert run(None, z, z, z, z, z, z, z, z, z, causal=True, sliding_window_size=16) == "sglang"
    assert len(calls) == 2 and run.awp_original is original


def test_the_timing_bench_times_both_versions() -> None:
    from bench import bench_cpu_attention

    t = bench_cpu_attention.time_extend(64, 48, repeats=1)
    assert set(t) == {"sglang", "new_tokens"} and min(t.values()) > 0
    assert bench_cpu_attention.parse_shape("1500:1200") == (1500, 1200)
    for bad in ("10:10", "10", "a:b", "5:-1"):
        with pytest.raises(ValueError, match="want L:P"):
            bench_cpu_attention.parse_shape(bad)
