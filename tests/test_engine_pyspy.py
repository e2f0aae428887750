"""``bench/engine_pyspy.py``: a py-spy raw profile of a bench run summarised per replica."""
from __future__ import annotations

import pytest

from bench import engine_pyspy as ep

BENCH = 'process 10:"python bench/bench_engine.py --condition open-contention"'
LAUNCH = 'process {pid}:"python -m sglang.launch_server --model-path m --port {port} --dtype float32"'
CHILD = 'process {pid}:"python -B -c from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=7) --multiprocessing-fork"'
LOOP = "Scheduler.run_event_loop (/x/sglang/srt/managers/scheduler.py:100)"
BATCH = "Scheduler.run_batch (/x/sglang/srt/managers/scheduler.py:200)"
ATTN = "TorchNativeAttnBackend.forward_extend (/x/torch_native_backend.py:50)"


def _stack(*frames: str, n: int) -> str:
    return ";".join(frames) + f" {n}"


def test_each_replicas_scheduler_forward_and_rest_of_loop(tmp_path) -> None:
    a = [BENCH, LAUNCH.format(pid=20, port=4001), CHILD.format(pid=21)]
    b = [BENCH, LAUNCH.format(pid=30, port=4002), CHILD.format(pid=31)]
    raw = tmp_path / "run.raw"
    raw.write_text("\n".join([
        _stack(*a, LOOP, BATCH, ATTN, n=6),
        _stack(*a, LOOP, BATCH, n=2),
        _stack(*a, LOOP, "Scheduler.get_next_batch_to_run (/x/scheduler.py:300)", n=4),
        _stack(*a, LOOP, LOOP, n=1),                            # recursion: counted once per stack
        _stack(*a[:2], "import_module (/x/__init__.py:1)", n=50),   # the launcher, not the scheduler
        _stack(*b, LOOP, BATCH, n=3),
        _stack(BENCH, "replay (/x/replay.py:1)", n=99),          # the bench itself: no replica
    ]) + "\n")
    s = ep.summarize(ep.read_raw(raw), ["TorchNativeAttnBackend.forward_extend"])
    assert set(s) == {"4001", "4002"}
    assert s["4001"]["scheduler_pid"] == "21"
    assert (s["4001"]["event_loop"], s["4001"]["forward"], s["4001"]["rest_of_loop"]) == (13, 8, 5)
    assert s["4001"]["functions"] == {"TorchNativeAttnBackend.forward_extend": 6}
    assert (s["4002"]["event_loop"], s["4002"]["forward"], s["4002"]["rest_share"]) == (3, 3, 0.0)


def test_a_line_that_is_not_py_spy_raw_names_file_and_line(tmp_path) -> None:
    raw = tmp_path / "bad.raw"
    raw.write_text(_stack(BENCH, LOOP, n=1) + "\nnot a profile\n")
    with pytest.raises(ValueError, match=r"bad\.raw:2: not a py-spy raw line"):
        ep.read_raw(raw)
    with pytest.raises(SystemExit, match="bad.raw:2"):
        ep.main([str(raw)])
