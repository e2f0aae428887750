"""The gateway's relay path kept cheap (issue 35 item 2): the gateway log written in batches and
encoded by orjson without writing what JSON cannot hold, the stream follower's fast path, and
``observe`` run in place only when the session table is free."""
from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace

from serving_hooks.annotator import LocalAnnotator
from serving_hooks.gateway_log import GatewayLog
from serving_hooks.sse import StreamFollower


def _lines(tmp_path) -> list[dict]:
    return [json.loads(line) for p in sorted(tmp_path.glob("*.jsonl"))
            for line in p.read_text().splitlines()]


def test_log_writes_what_queued_meanwhile_in_one_write(tmp_path):
    calls: list[int] = []
    log = GatewayLog(tmp_path, batch_s=60.0, on_written=calls.append)  # only close() wakes it
    for i in range(50):
        log.write({"request_id": f"r{i}"})
    log.close()
    assert calls == [50]                                   # one write for the whole batch
    assert [r["request_id"] for r in _lines(tmp_path)] == [f"r{i}" for i in range(50)]


def test_log_batches_rotate_by_size_as_single_writes_did(tmp_path):
    log = GatewayLog(tmp_path, max_bytes=2000, max_age_s=3600, batch_s=60.0)
    for i in range(40):
        log.write({"request_id": f"r{i}", "pad": "x" * 150})
    log.close()
    files = sorted(tmp_path.glob("*.jsonl"))
    assert len(files) >= 3
    assert [r["request_id"] for r in _lines(tmp_path)] == [f"r{i}" for i in range(40)]
    for path in files[:-1]:   # each full file closed by the record that reached max_bytes
        data = path.read_bytes()
        last = data[:-1].rsplit(b"\n", 1)[-1] + b"\n"
        assert len(data) - len(last) < 2000 <= len(data)


def test_log_never_writes_what_json_cannot_hold(tmp_path):
    log = GatewayLog(tmp_path, batch_s=60.0)
    log.write({"request_id": "nan", "response": {"x": float("nan")}}, exact=False)  # lenient parse
    log.write({"request_id": "surrogate", "text": "\ud800"})
    log.write({"request_id": "big", "n": 2 ** 70})          # beyond orjson: the exact encoder
    log.write({"request_id": "keys", "by_index": {0: "a"}})  # int keys become strings, as json does
    log.write({"request_id": "text", "text": "héllo ✓"})
    log.close()
    rows = {r["request_id"]: r for r in _lines(tmp_path)}
    assert set(rows) == {"big", "keys", "text"} and log.encode_errors == 2
    assert rows["big"]["n"] == 2 ** 70 and rows["keys"]["by_index"] == {"0": "a"}
    assert rows["text"]["text"] == "héllo ✓"
    assert "héllo ✓".encode() in b"".join(p.read_bytes() for p in tmp_path.glob("*.jsonl"))


def test_stream_follower_fast_path_matches_the_general_one():
    chunk = lambda text: {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}
    f = StreamFollower()
    stream = (b"data: " + json.dumps(chunk("a")).encode() + b"\n\n"
              + b"event: x\r\ndata: " + json.dumps(chunk("b")).encode() + b"\r\n\r\n"
              + b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "c"},\n'
              + b'data:  "finish_reason": "stop"}]}\n\n'
              + b"data: [DONE]\n\n")
    events = []
    for i in range(0, len(stream), 7):            # cut anywhere, events still come out whole
        events += f.feed(stream[i:i + 7])
    assert b"".join(e.raw for e in events) == stream
    assert [e.data is not None for e in events] == [True, True, True, False]
    assert "".join(f.text_parts) == "abc" and f.finish_reason == "stop" and f.saw_done
    assert not f.lenient and f.malformed == 0


def test_stream_follower_reads_nan_leniently_and_says_so():
    f = StreamFollower()
    (event,) = f.feed(b'data: {"choices": [{"index": 0, "delta": {"content": "x"}, "logprob": NaN}]}\n\n')
    assert event.data is not None and f.text_parts == ["x"] and f.lenient
    (junk,) = f.feed(b"data: {not json\n\n")
    assert junk.data is None and f.malformed == 1


def test_observe_runs_in_place_only_when_the_session_table_is_free():
    threads: list[int] = []
    free = [True]
    service = SimpleNamespace(predictor=SimpleNamespace(session_table_free=lambda t: free[0]),
                              observe=lambda c: threads.append(threading.get_ident()))
    annotator = LocalAnnotator(service)

    async def run() -> int:
        await annotator.observe({"request_id": "a"})
        free[0] = False        # another thread holds the table: wait for it off the event loop
        await annotator.observe({"request_id": "b"})
        return threading.get_ident()

    loop_thread = asyncio.run(run())
    assert threads[0] == loop_thread and threads[1] != loop_thread


def test_gateway_started_by_the_cli_freezes_what_start_up_built():
    import gc

    from serving_hooks.gateway import Gateway, GatewayOptions
    from serving_hooks.upstreams import RoundRobinRouter

    async def start_stop(options: GatewayOptions) -> int:
        gw = Gateway(RoundRobinRouter(["http://127.0.0.1:9"]), options=options)
        await gw.start()
        frozen = gc.get_freeze_count()
        await gw.aclose()
        return frozen

    gc.unfreeze()
    try:
        assert asyncio.run(start_stop(GatewayOptions())) == 0          # embedded: left alone
        assert asyncio.run(start_stop(GatewayOptions(freeze_gc=True))) > 1000
    finally:
        gc.unfreeze()


def test_a_reloaded_profile_is_frozen_once():
    import gc

    from serving_hooks.gateway import Gateway, GatewayOptions
    from serving_hooks.upstreams import RoundRobinRouter

    service = SimpleNamespace(predictor=SimpleNamespace(version="v1"))
    gw = Gateway(RoundRobinRouter(["http://127.0.0.1:9"]), options=GatewayOptions(freeze_gc=True))
    gw.service = service              # the version is all the freeze reads
    gc.unfreeze()
    try:
        gw._frozen_version = "v1"
        assert not gw._freeze_reloaded_profile()            # nothing reloaded: no pause
        service.predictor.version = "v2"                    # a hot reload swapped the profile
        assert gw._freeze_reloaded_profile() and gc.get_freeze_count() > 1000
        assert not gw._freeze_reloaded_profile()            # once per version
    finally:
        gc.unfreeze()
