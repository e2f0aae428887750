"""Pieces of the gateway on their own: body rewriting, SSE following, the rotating log."""
from __future__ import annotations

import json
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from store.ingest import discover
from predictors.contract import FLAT_KEYS as CUSTOM_PARAM_KEYS
from serving_hooks.annotations import find_app_metadata, flatten_for_sglang, forward_body
from serving_hooks.gateway_log import GatewayLog
from serving_hooks.sse import StreamFollower

META = {"workflow_type_id": "wt", "workflow_id": "w1", "agent_id": "engineer"}
ANN = {"profile_version": "v1", "known": True, "workflow_type_id": "wt", "workflow_id": "w1",
       "agent_id": "engineer", "predicted_output_len": [10, 90], "priority": 250,
       "next_agents": [{"agent_id": "reviewer", "p": 0.7}, {"agent_id": "engineer", "p": 0.3}],
       "expected_remaining_calls": 3.5, "expected_remaining_s": 40.0, "p_end": 0.1,
       "session_age_s": 12.5, "output_len_mean": 42.0, "tool_latency": {"run_tests": {"p95_s": 4.5}, "edit": {"p95_s": 0.1}}}


def test_find_app_metadata_top_level_nested_or_absent():
    assert find_app_metadata({"app_metadata": META}) == (META, "top")
    assert find_app_metadata({"extra_body": {"app_metadata": META}}) == (META, "extra_body")
    assert find_app_metadata({"app_metadata": "x"}) == (None, None)
    assert find_app_metadata([1]) == (None, None)


def test_flatten_for_sglang_is_flat_and_complete():
    flat = flatten_for_sglang(ANN)
    assert list(flat) == list(CUSTOM_PARAM_KEYS)
    assert flat == {"wf_type": "wt", "wf_id": "w1", "agent": "engineer", "known": True,
                    "pred_out_lo": 10, "pred_out_hi": 90, "priority": 250,
                    "exp_remaining_calls": 3.5, "exp_remaining_s": 40.0, "next_agent": "reviewer",
                    "next_agent_p": 0.7, "tool_p95_s": 4.5, "retain_s": None, "profile_version": "v1",
                    "p_end": 0.1, "session_age_s": 12.5, "pred_out_mean": 42.0,
                    "keep_alive_ttl_s": None, "exp_remaining_out_tokens": None,
                    "latency_class": None, "session_end": None}
    unknown = flatten_for_sglang({"known": False, "profile_version": "v1"}, META)
    assert unknown["known"] is False and unknown["agent"] == "engineer" and unknown["pred_out_hi"] is None


def test_forward_body_splices_or_rewrites_only_when_it_must():
    raw = b'  {"model": "m", "app_metadata": {"workflow_type_id": "wt", "workflow_id": "w1", "agent_id": "engineer"}, "x": 1.50}'
    body = json.loads(raw)
    out = forward_body(raw, body, "top", ANN)
    assert out.endswith(raw[3:]) and json.loads(out) == {"sys_annotations": ANN, **body}
    # a key the client already set is replaced in place (the body is re-encoded)
    mine = {**body, "priority": 1, "custom_params": {"k": "v"}}
    out = json.loads(forward_body(json.dumps(mine).encode(), mine, "top", ANN, sglang_fields=True))
    assert out["priority"] == 250 and out["custom_params"]["k"] == "v" and out["custom_params"]["agent"] == "engineer"
    # stream usage is merged into the client's stream_options
    s = {**body, "stream": True, "stream_options": {"continuous_usage_stats": False}}
    out = json.loads(forward_body(json.dumps(s).encode(), s, "top", None, request_stream_usage=True))
    assert out["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert "sys_annotations" not in out
    # nothing to change: the same bytes
    assert forward_body(raw, body, "top", None) is raw
    # strip for strict upstreams, nested form
    nested = {"model": "m", "extra_body": {"app_metadata": META, "other": 2}}
    out = json.loads(forward_body(json.dumps(nested).encode(), nested, "extra_body", ANN,
                                  sglang_fields=True, strip_metadata=True))
    assert out["extra_body"] == {"other": 2} and out["custom_params"]["wf_id"] == "w1"


def _chunks(n_tokens: int) -> bytes:
    events = [{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}]
    events += [{"id": "c", "choices": [{"index": 0, "delta": {"content": f" t{i}"}}]} for i in range(n_tokens)]
    events += [{"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "call_1", "function": {"name": "run_", "arguments": '{"a"'}}]}}]},
        {"id": "c", "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"name": "tests", "arguments": ": 1}"}}]}, "finish_reason": "tool_calls"}]},
        {"id": "c", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n_tokens}}]
    return b"".join(b"data: " + json.dumps(e).encode() + b"\r\n\r\n" for e in events) + b"data: [DONE]\r\n\r\n"


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 30), st.lists(st.integers(1, 60), min_size=1, max_size=40))
def test_stream_follower_is_independent_of_chunk_boundaries(n_tokens, cuts):
    stream = _chunks(n_tokens)
    f = StreamFollower()
    pieces, pos, i = [], 0, 0
    while pos < len(stream):
        step = cuts[i % len(cuts)]
        pieces.append(stream[pos:pos + step])
        pos, i = pos + step, i + 1
    events = [e for p in pieces for e in f.feed(p)] + f.flush()
    assert b"".join(e.raw for e in events) == stream            # every byte, in order
    assert sum(e.usage_only for e in events) == 1 and events[-1].done
    resp = f.response(chat=True)
    assert resp["choices"][0]["message"]["content"] == "".join(f" t{k}" for k in range(n_tokens))
    assert resp["choices"][0]["message"]["tool_calls"][0]["function"] == {"name": "run_tests", "arguments": '{"a": 1}'}
    assert resp["usage"]["completion_tokens"] == n_tokens


def test_gateway_log_rotates_by_size_and_hides_open_files(tmp_path):
    written = threading.Condition()
    count = [0]

    def on_written(n: int) -> None:  # called by the writer thread once a record is on disk
        with written:
            count[0] += n
            written.notify_all()

    log = GatewayLog(tmp_path, max_bytes=2000, max_age_s=3600, on_written=on_written)
    for i in range(30):
        log.write({"request_id": f"r{i}", "pad": "x" * 200})
    log.rotate()
    closed = sorted(tmp_path.glob("*.jsonl"))
    assert len(closed) >= 3 and not list(tmp_path.glob("*.open"))
    lines = [json.loads(line) for p in closed for line in p.read_text().splitlines()]
    assert [r["request_id"] for r in lines] == [f"r{i}" for i in range(30)]
    log.write({"request_id": "late"})
    log.rotate(wait=False)
    log.write({"request_id": "open"})
    with written:  # woken by the write itself; the timeout only bounds a writer that died
        assert written.wait_for(lambda: count[0] == 32, timeout=60)
    assert len(list(tmp_path.glob("*.jsonl.open"))) == 1  # "open" sits in a file still open
    assert {p.name for p, _ in discover([tmp_path])} == {p.name for p in tmp_path.glob("*.jsonl")}
    log.close()
    assert not list(tmp_path.glob("*.open")) and log.records_written == 32
