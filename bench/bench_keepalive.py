"""Stale upstream connections against a real uvicorn: how many calls the gateway loses.

    python bench/bench_keepalive.py                                   # old: 60 s pool, no resend
    python bench/bench_keepalive.py --pool-keepalive 0.15 --resend    # the defaults, scaled

A fake OpenAI server under real uvicorn closes idle connections after ``--server-keepalive``
seconds (SGLang: uvicorn's 5 s, scaled down here so the race comes often); the gateway sits in
front with its pool keep-alive and stale-connection resend as given; ``--clients`` threads each
send ``--calls`` calls with a pause of 0.97-1.03 × the server's keep-alive between them — the
moment the server closes an idle connection, so some calls are written onto a connection the
server is closing. Prints the calls, the failed ones (the gateway's 502s) and the resent ones.
The race is by chance: the deterministic fault test is ``tests/test_upstream_keepalive.py``.
"""
from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from serving_hooks.fake_openai import FakeOpenAI  # noqa: E402
from serving_hooks.server_thread import serve_in_thread  # noqa: E402
from tests.serving_helpers import metric, running_gateway  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server-keepalive", type=float, default=0.2, help="uvicorn timeout_keep_alive (s)")
    ap.add_argument("--pool-keepalive", type=float, default=60.0, help="gateway upstream keep-alive (s)")
    ap.add_argument("--resend", action="store_true", help="resend a call that met a stale connection")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--calls", type=int, default=60, help="calls per client")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    fake = FakeOpenAI()
    codes: list[int] = []
    with serve_in_thread(fake.app, timeout_keep_alive=a.server_keepalive) as up, \
            running_gateway([up.url], upstream_keepalive_s=a.pool_keepalive,
                            retry_stale_connections=a.resend) as gw:
        def client(k: int) -> None:
            rng = random.Random(a.seed * 1000 + k)
            with httpx.Client(timeout=30, trust_env=False) as c:
                for i in range(a.calls):
                    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": f"{k}-{i}"}]}
                    codes.append(c.post(gw.url + "/v1/chat/completions", json=body).status_code)
                    time.sleep(a.server_keepalive * rng.uniform(0.97, 1.03))

        threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        resent = metric(gw.url, "profiler_gateway_upstream_responses_total", outcome="stale_connection_retried")
    print(f"server keep-alive {a.server_keepalive} s, pool keep-alive {a.pool_keepalive} s, "
          f"resend {'on' if a.resend else 'off'}: {len(codes)} calls, "
          f"{sum(c != 200 for c in codes)} failed, {resent:.0f} resent")


if __name__ == "__main__":
    main()
