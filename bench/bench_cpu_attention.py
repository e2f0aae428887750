"""What a cached prefix saves in one extend's attention on CPU: SGLang's torch-native backend
against the CPU stand-in that attends with the new tokens only.

SGLang's ``TorchNativeAttnBackend._run_sdpa_forward_extend`` pads an extend's queries to the whole
sequence (cached prefix included) and runs causal SDPA over all of it, so its cost is the same
whether P of the L tokens were cached or not, ~L²; GPU kernels (and the stand-in in
``tests/sglang/cpu_standins/awp_cpu_standins.py``) attend with the n = L − P new queries only,
~n·L. This times both, one layer of the bench's tiny model (4 query heads, 2 KV heads, head
size 32, float32, one thread), median of ``--repeats``::

    python bench/bench_cpu_attention.py [--shapes 600:0 600:420 1500:1200 3000:2700]

It needs the CPU import shims SGLang needs here (``AWP_TEST_CPU_STANDINS=1`` and
``tests/sglang/cpu_standins`` on ``PYTHONPATH``); it sets them up itself when run as a script.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STANDINS = REPO / "tests" / "sglang" / "cpu_standins"
sys.path.insert(0, str(REPO))

from tests.sglang.cpu_standins.awp_cpu_standins import extend_attention_new_tokens  # noqa: E402


def time_extend(seq_len: int, cached: int, repeats: int = 15) -> dict[str, float]:
    """Median milliseconds of one extend (``seq_len`` tokens, ``cached`` of them a cached prefix)
    with SGLang's attention and with the stand-in's."""
    import torch
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

    sglang_fn = TorchNativeAttnBackend._run_sdpa_forward_extend
    sglang_fn = getattr(sglang_fn, "awp_original", sglang_fn)
    new_fn = extend_attention_new_tokens(sglang_fn)
    heads, kv_heads, d = 4, 2, 32
    n = seq_len - cached
    g = torch.Generator().manual_seed(0)
    k, v = torch.randn(seq_len, kv_heads, d, generator=g), torch.randn(seq_len, kv_heads, d, generator=g)
    q = torch.randn(n, heads, d, generator=g)
    args = (k, v, torch.arange(seq_len).reshape(1, seq_len), torch.tensor([0]), torch.tensor([seq_len]),
            torch.tensor([cached]), torch.tensor([n]))
    kw = {"scaling": d ** -0.5, "enable_gqa": True, "causal": True}
    out = {}
    for name, fn in (("sglang", sglang_fn), ("new_tokens", new_fn)):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn(None, q, torch.zeros_like(q), *args, **kw)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
    return out


def parse_shape(shape: str) -> tuple[int, int]:
    """``L:P`` -> (sequence length, cached prefix), with 0 <= P < L."""
    try:
        seq_len, cached = (int(x) for x in shape.split(":"))
    except ValueError:
        seq_len = cached = -1
    if not 0 <= cached < seq_len:
        raise ValueError(f"--shapes {shape!r}: want L:P with 0 <= P < L")
    return seq_len, cached


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shapes", nargs="+", default=["600:0", "600:420", "1500:1200", "3000:2700"],
                    metavar="L:P", help="sequence length : cached prefix, per extend timed")
    ap.add_argument("--repeats", type=int, default=15, help="timings per shape and version (median)")
    args = ap.parse_args(argv)
    if os.environ.get("AWP_TEST_CPU_STANDINS") != "1":     # re-run with the shims SGLang needs on CPU
        env = {**os.environ, "AWP_TEST_CPU_STANDINS": "1",
               "PYTHONPATH": os.pathsep.join([str(STANDINS), str(REPO), os.environ.get("PYTHONPATH", "")])}
        sys.exit(subprocess.call([sys.executable, __file__, *(argv if argv is not None else sys.argv[1:])], env=env))
    import torch

    torch.set_num_threads(1)
    for shape in args.shapes:
        try:
            seq_len, cached = parse_shape(shape)
        except ValueError as e:
            sys.exit(f"bench_cpu_attention: {e}")
        t = time_extend(seq_len, cached, args.repeats)
        print(f"sequence {seq_len}, cached {cached}: SGLang torch-native {t['sglang']:.2f} ms, "
              f"new tokens only {t['new_tokens']:.2f} ms per layer ({t['sglang'] / t['new_tokens']:.1f}x)")


if __name__ == "__main__":
    main()
