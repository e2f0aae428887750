"""Is the machine quiet enough to time a real-engine run? (``bench/bench_engine.py``)

On two shared cores an arm's JCT moved ±25 % with the machine's load (issue 34), more than the
effect the bench measures. So before every run the bench checks the machine, and during every
run it measures the replicas that are up but not measured:

* **Before a run** (:func:`wait_quiet`): the 1-minute load average must be at most
  ``max_load`` × cores, and the CPU the machine burns while none of the bench's arms runs —
  sampled from ``/proc/stat`` over ``probe_s`` — at most ``max_busy`` of all cores. The probe is
  the gate that matters: the load average remembers the bench's own previous run for minutes
  (it decays with a 1-minute time constant), the probe sees only what runs *now*, i.e. what
  the next run would share the cores with. The bench waits up to ``wait_s`` for both; then it
  refuses (or, with ``--allow-load``, runs and marks the run ``quiet: false``). Every run's
  JSON carries the check (:class:`QuietCheck`) and the load average at its start and end.
* **During a run** (:class:`SessionCPU`): the CPU seconds of every process in each idle
  replica's session (the servers start in their own session: the launcher, its scheduler and
  detokenizer), from ``/proc/<pid>/stat``, divided by the run's wall time: the share of one
  core an idle replica took. With ``--sleep-on-idle`` it should be ≈ 0; the bench reports it
  and flags a run where it is over 2 % of a core (:data:`IDLE_CPU_LIMIT`).

Linux only (``/proc``), as the real-engine bench is.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

#: an idle replica may take at most this share of one core while another arm is measured
IDLE_CPU_LIMIT = 0.02
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_times() -> tuple[float, float]:
    """``(busy, total)`` jiffies of all cores from the first line of ``/proc/stat``
    (idle = idle + iowait)."""
    with open("/proc/stat") as f:
        parts = [float(x) for x in f.readline().split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0.0)
    total = sum(parts[:8])
    return total - idle, total


def busy_share(probe_s: float, read: Callable[[], tuple[float, float]] = cpu_times,
               sleep: Callable[[float], None] = time.sleep) -> float:
    """Share of all cores busy over the next ``probe_s`` seconds (0 … 1)."""
    b0, t0 = read()
    sleep(probe_s)
    b1, t1 = read()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


@dataclass
class QuietCheck:
    """What the check before one run saw: the load average when it passed (or gave up), the
    busy share of the last probe, how long it waited, whether it passed, and its thresholds."""

    quiet: bool
    load_average: list[float]
    busy_share: float
    waited_s: float
    max_load: float
    max_busy: float
    cpus: int

    def to_dict(self) -> dict:
        return asdict(self)


def wait_quiet(max_load: float, max_busy: float, wait_s: float, probe_s: float = 2.0,
               cpus: int | None = None, loadavg: Callable[[], tuple[float, float, float]] = os.getloadavg,
               busy: Callable[[float], float] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               ) -> QuietCheck:
    """Wait until the 1-minute load average ≤ ``max_load`` × ``cpus`` and a probe of ``probe_s``
    finds ≤ ``max_busy`` of the cores busy, for at most ``wait_s`` seconds (probing again
    every 5 s); the last observation, ``quiet`` False when time ran out."""
    cpus = cpus or os.cpu_count() or 1
    busy = busy or (lambda s: busy_share(s, sleep=sleep))
    start = clock()
    while True:
        la = list(loadavg())
        b = busy(probe_s)
        ok = la[0] <= max_load * cpus and b <= max_busy
        waited = clock() - start
        if ok or waited >= wait_s:
            return QuietCheck(ok, la, b, waited, max_load, max_busy, cpus)
        sleep(5.0)


def session_cpu_s(session_ids: Iterable[int], proc: str = "/proc") -> float:
    """CPU seconds (user + system) so far of every process whose session id is in
    ``session_ids`` (a server started with ``start_new_session=True`` leads its own session)."""
    want = set(session_ids)
    total = 0
    for pid in os.listdir(proc):
        if not pid.isdigit():
            continue
        try:
            with open(f"{proc}/{pid}/stat") as f:
                stat = f.read()
        except OSError:                      # exited between listdir and open
            continue
        fields = stat[stat.rindex(")") + 2:].split()     # after "pid (comm) "
        if int(fields[3]) in want:                       # field 6: session
            total += int(fields[11]) + int(fields[12])   # fields 14, 15: utime, stime
    return total / _TICK


class SessionCPU:
    """CPU share of one core that the processes of some sessions took between :meth:`start`
    and :meth:`stop` (the idle replicas during a measured run)."""

    def __init__(self, session_ids: Iterable[int], clock: Callable[[], float] = time.monotonic,
                 read: Callable[[Iterable[int]], float] = session_cpu_s) -> None:
        self.ids, self.clock, self.read = list(session_ids), clock, read
        self._c0 = self._t0 = 0.0

    def start(self) -> "SessionCPU":
        self._c0, self._t0 = self.read(self.ids), self.clock()
        return self

    def stop(self) -> float | None:
        """Share of one core (None when there is nothing to watch)."""
        if not self.ids:
            return None
        wall = self.clock() - self._t0
        return (self.read(self.ids) - self._c0) / wall if wall > 0 else 0.0
