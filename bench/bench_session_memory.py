"""Memory of the predictor's session table under its limits (issue 11, item 5).

Drives ``N`` sessions through :class:`predictors.predictor.Predictor` the way the gateway does
(annotate at arrival, observe at completion with the response text, as the gateway sends it:
at most 64 K characters), ``R`` calls per session, each response ``TEXT`` characters and a
distinct string object, and reports Python heap growth (tracemalloc), the table's own estimate,
peak RSS, and the evictions. Defaults: 100,000 sessions × 8 responses of 60 KB under the default
limits (100,000 sessions, 512 MiB).

    python bench/bench_session_memory.py [--sessions N] [--calls R] [--text CHARS] [--max-session-mb MB]
"""
from __future__ import annotations

import argparse
import resource
import time
import tracemalloc

from predictors.predictor import DEFAULT_MAX_SESSION_BYTES, Predictor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--text", type=int, default=60_000)
    ap.add_argument("--max-session-mb", type=float, default=DEFAULT_MAX_SESSION_BYTES / (1 << 20))
    ap.add_argument("--no-tracemalloc", action="store_true", help="RSS only (faster)")
    a = ap.parse_args()
    p = Predictor(None, max_session_bytes=int(a.max_session_mb * (1 << 20)))
    base = "x" * (a.text - 8)
    if not a.no_tracemalloc:
        tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0] if tracemalloc.is_tracing() else 0
    t0 = time.perf_counter()
    for i in range(a.sessions):
        for j in range(a.calls):
            meta = {"workflow_type_id": "wt", "workflow_id": f"wf-{i}", "agent_id": f"agent{j % 3}"}
            rid = f"gw-{i}-{j}"
            p.annotate(meta, request_id=rid)
            p.observe({"app_metadata": meta, "request_id": rid, "output_tokens": 100,
                       "response_text": base + f"{j:08d}"})
    secs = time.perf_counter() - t0
    st = p.memory_stats()
    heap = (tracemalloc.get_traced_memory()[0] - before) / (1 << 20) if tracemalloc.is_tracing() else None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"sessions driven {a.sessions:,} x {a.calls} responses of {a.text:,} chars; "
          f"limits: {p.max_sessions:,} sessions, {a.max_session_mb:g} MiB")
    print(f"held: {st['sessions']:,} sessions, estimate {st['session_bytes'] / (1 << 20):.1f} MiB "
          f"(texts {st['session_text_bytes'] / (1 << 20):.1f} MiB), "
          + (f"heap growth (tracemalloc) {heap:.1f} MiB, " if heap is not None else "")
          + f"peak RSS {rss:.0f} MiB")
    print(f"evicted: {st['evicted']}, responses dropped for the byte budget: {st['texts_dropped']:,}; "
          f"{a.sessions * a.calls / secs:,.0f} calls/s")


if __name__ == "__main__":
    main()
