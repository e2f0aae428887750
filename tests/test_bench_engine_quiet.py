"""The real-engine bench's quiet-machine check and idle-replica CPU (bench/engine_quiet.py), with
injected clocks and readers: no sleeping, no timing race."""
from __future__ import annotations

import os

import pytest

from bench.engine_quiet import SessionCPU, busy_share, session_cpu_s, wait_quiet


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def test_busy_share_is_the_busy_jiffies_over_the_probe() -> None:
    reads = iter([(100.0, 1000.0), (130.0, 1200.0)])
    assert busy_share(2.0, read=lambda: next(reads), sleep=lambda s: None) == pytest.approx(30 / 200)


def test_wait_quiet_passes_when_load_and_probe_are_low() -> None:
    clock = FakeClock()
    q = wait_quiet(1.5, 0.15, 300, cpus=2, loadavg=lambda: (2.9, 1.0, 0.5), busy=lambda s: 0.05,
                   clock=clock, sleep=clock.sleep)
    assert q.quiet and q.waited_s == 0 and q.load_average == [2.9, 1.0, 0.5] and q.cpus == 2


def test_wait_quiet_waits_for_the_load_to_fall_then_gives_up() -> None:
    clock = FakeClock()
    loads = iter([(5.0, 0, 0), (4.0, 0, 0), (2.0, 0, 0)])
    q = wait_quiet(1.5, 0.15, 300, cpus=2, loadavg=lambda: next(loads), busy=lambda s: 0.0,
                   clock=clock, sleep=clock.sleep)
    assert q.quiet and q.waited_s == 10.0 and q.load_average[0] == 2.0       # third look, 2 x 5 s later
    clock = FakeClock()
    q = wait_quiet(1.5, 0.15, 12, cpus=2, loadavg=lambda: (0.5, 0, 0), busy=lambda s: 0.6,
                   clock=clock, sleep=clock.sleep)
    assert not q.quiet and q.waited_s >= 12 and q.busy_share == 0.6           # another job keeps a core busy
    assert q.to_dict()["max_busy"] == 0.15


def test_session_cpu_reads_utime_and_stime_of_a_session(tmp_path) -> None:
    tick = os.sysconf("SC_CLK_TCK")
    def stat(pid: int, comm: str, session: int, ut: int, st: int) -> str:
        # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime ...
        return f"{pid} ({comm}) S 1 {session} {session} 0 -1 0 0 0 0 0 {ut} {st} 0 0 20 0 1 0\n"
    for pid, comm, sess, ut, st in ((10, "python", 10, 3 * tick, tick), (11, "sglang::sched uler) x", 10, tick, 0),
                                    (12, "other", 99, 50 * tick, 0)):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat(pid, comm, sess, ut, st))
    (tmp_path / "self").mkdir()
    assert session_cpu_s([10], proc=str(tmp_path)) == pytest.approx(5.0)      # comm with ") " parsed right
    assert session_cpu_s([99], proc=str(tmp_path)) == pytest.approx(50.0)
    assert session_cpu_s([], proc=str(tmp_path)) == 0


def test_session_cpu_share_of_one_core_over_a_run() -> None:
    clock = FakeClock()
    cpu = iter([10.0, 10.3])
    w = SessionCPU([1], clock=clock, read=lambda ids: next(cpu)).start()
    clock.t = 30.0
    assert w.stop() == pytest.approx(0.01)
    assert SessionCPU([]).start().stop() is None
    own = SessionCPU([os.getsid(0)]).start()                  # this test's own session, really read
    assert own.stop() >= 0
