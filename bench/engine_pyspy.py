"""Where each replica's scheduler spends its CPU during a bench run, from a py-spy profile.

Run the engine bench under py-spy (``pip install py-spy``; it is not a project dependency) so
that every process the bench starts is sampled, then summarise the raw file per replica::

    py-spy record --subprocesses -r 25 -f raw -o run.raw -- \\
        python bench/bench_engine.py --condition open-contention --seeds 0 --setups round-robin hints
    python bench/engine_pyspy.py run.raw [--functions 'Scheduler.run_batch' ...]

py-spy's raw format is one line per distinct stack, ``frame;frame;… count``, each frame
``function (file:line)``; with ``--subprocesses`` the stack starts with one
``process PID:"command line"`` frame per ancestor. A replica is named by the ``--port`` of its
``sglang.launch_server`` ancestor; its scheduler is the child process with the most samples
under ``Scheduler.run_event_loop``. For each replica the summary gives inclusive samples (a
frame counted once per stack) of the event loop, the model forward (``Scheduler.run_batch``)
and the rest of the loop (scheduling, the radix cache, HiCache, the plugin's hooks), and of any
``--functions`` asked for. Counts, not seconds: py-spy samples only threads that are running,
so the shares compare the replicas' CPU work whatever the machine's load.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^()]*):\d+\)$")
#: the ancestor frames at the start of a stack (a command line may hold ';', not '"')
_PROCESS = re.compile(r'process (?P<pid>\d+):"(?P<cmd>[^"]*)";?')
_PORT = re.compile(r"--port (\d+)")
EVENT_LOOP = "Scheduler.run_event_loop"
FORWARD = "Scheduler.run_batch"


def frame_name(frame: str) -> str:
    """``function [file name]`` of a py-spy frame (the line number dropped)."""
    m = _FRAME.match(frame)
    return f"{m['fn']} [{Path(m['file']).name}]" if m else frame


def read_raw(path: Path) -> dict[tuple[str, str], Counter]:
    """``{(replica port, pid): Counter(frame name -> inclusive samples)}`` of every process that
    has a ``sglang.launch_server`` ancestor (or is one)."""
    out: dict[tuple[str, str], Counter] = defaultdict(Counter)
    with path.open() as f:
        for n_line, line in enumerate(f, 1):
            stack, _, count = line.rstrip("\n").rpartition(" ")
            if not stack or not count.isdigit():
                raise ValueError(f"{path}:{n_line}: not a py-spy raw line (frames;… count)")
            procs, pos = [], 0
            while (m := _PROCESS.match(stack, pos)) is not None:
                procs.append(m)
                pos = m.end()
            frames = stack[pos:].split(";") if pos < len(stack) else []
            port = next((p[1] for m in procs if "launch_server" in m["cmd"] for p in [_PORT.search(m["cmd"])] if p),
                        None)
            if port is None or not procs:
                continue
            counter = out[(port, procs[-1]["pid"])]
            for name in {frame_name(fr) for fr in frames}:
                counter[name] += int(count)
    return dict(out)


def _samples(counter: Counter, function: str) -> int:
    """Inclusive samples of every frame whose function is ``function`` (any file)."""
    return sum(n for name, n in counter.items() if name.split(" [")[0] == function)


def summarize(per_process: dict[tuple[str, str], Counter], functions: list[str] = ()) -> dict[str, dict]:
    """Per replica port: its scheduler's event-loop, forward and rest-of-loop samples and each of
    ``functions``."""
    out: dict[str, dict] = {}
    for port in sorted({p for p, _ in per_process}):
        pid, sched = max(((pid, c) for (p, pid), c in per_process.items() if p == port),
                         key=lambda kv: _samples(kv[1], EVENT_LOOP))
        loop, forward = _samples(sched, EVENT_LOOP), _samples(sched, FORWARD)
        out[port] = {"scheduler_pid": pid, "event_loop": loop, "forward": forward, "rest_of_loop": loop - forward,
                     "rest_share": (loop - forward) / loop if loop else None,
                     "functions": {fn: _samples(sched, fn) for fn in functions}}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("raw", type=Path, help="py-spy record -f raw output of a bench_engine run (--subprocesses)")
    ap.add_argument("--functions", nargs="*", default=[], metavar="NAME",
                    help="also count these functions' inclusive samples (e.g. TorchNativeAttnBackend.forward_extend)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        summary = summarize(read_raw(args.raw), args.functions)
    except (OSError, ValueError) as e:
        sys.exit(f"engine_pyspy: {e}")
    if args.json:
        print(json.dumps(summary, indent=1))
        return
    for port, s in summary.items():
        share = f"{s['rest_share']:.0%}" if s["rest_share"] is not None else "-"
        print(f"replica :{port} (scheduler pid {s['scheduler_pid']}): event loop {s['event_loop']}, "
              f"forward {s['forward']}, rest of the loop {s['rest_of_loop']} ({share})"
              + "".join(f", {fn} {n}" for fn, n in s["functions"].items()))


if __name__ == "__main__":
    main()
