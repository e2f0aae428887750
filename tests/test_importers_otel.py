"""OpenTelemetry GenAI (OTLP JSON) importer: mapping, tool attachment, malformed input."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from store.importers import ImportFormatError, iter_records, otel

FIXTURES = Path(__file__).parent / "fixtures" / "importers" / "otel"
TRACES = FIXTURES / "agent_traces.jsonl"


def by_span(records):
    return {r["otel_span_id"]: r for r in records}


def test_chat_spans_become_calls_with_agents_sessions_and_tokens():
    recs = by_span(iter_records("otel", TRACES))
    assert len(recs) == 5  # 4 chat spans in trace 1, 1 in trace 2; embeddings and HTTP spans are not calls
    first = recs["a000000000000003"]
    assert first["workflow_type_id"] == "trip_planner"  # gen_ai.workflow.name of the invoke_workflow root
    assert first["workflow_id"] == "conv-7f3a"  # gen_ai.conversation.id inherited from the root span
    assert first["agent_id"] == "planner"  # from the invoke_agent parent
    assert (first["input_tokens"], first["output_tokens"]) == (120, 40)
    assert first["model"] == "gpt-4o-2024-08-06"  # response model preferred over request model
    assert first["t_arrival"] == pytest.approx(1760000000.1)
    assert first["t_finish"] == pytest.approx(1760000001.2)
    assert recs["a000000000000006"]["cached_tokens"] == 128
    # spans of the second export line still find their ancestors from the first line
    assert recs["a000000000000008"]["agent_id"] == "booker"
    assert recs["a000000000000008"]["workflow_id"] == "conv-7f3a"
    assert recs["a00000000000000a"]["status"] == "error"


def test_tool_spans_attach_to_the_call_before_them():
    recs = by_span(iter_records("otel", TRACES))
    tools = recs["a000000000000003"]["tool_calls"]
    assert [t["name"] for t in tools] == ["search_flights"]
    assert tools[0]["t_start"] == pytest.approx(1760000001.3)
    assert tools[0]["t_end"] == pytest.approx(1760000002.0)
    assert "tool_calls" not in recs["a000000000000006"]
    hotel = recs["a000000000000008"]["tool_calls"]
    assert [(t["name"], t["status"]) for t in hotel] == [("book_hotel", "error")]


def test_old_attribute_names_and_fallbacks():
    rec = by_span(iter_records("otel", TRACES))["b000000000000001"]
    assert (rec["input_tokens"], rec["output_tokens"]) == (77, 12)  # gen_ai.usage.prompt/completion_tokens
    assert rec["agent_id"] == "default"
    assert rec["workflow_id"] == "0af7651916cd43dd8448eb211c80319c"  # no conversation id: the trace
    assert rec["workflow_type_id"] == "travel-desk"  # resource service.name


def test_messages_converted_to_openai_chat_shape():
    rec = by_span(iter_records("otel", TRACES))["a000000000000003"]
    assert rec["messages"] == [{"role": "system", "content": "You plan trips."},
                               {"role": "user", "content": "Weekend in Paris, under 800 EUR"}]
    assert rec["response_text"] == "Searching flights first."
    plain = by_span(iter_records("otel", TRACES, with_text=False))["a000000000000003"]
    assert "messages" not in plain and "response_text" not in plain


def test_pretty_printed_single_document_with_numeric_int_values():
    recs = list(iter_records("otel", FIXTURES / "single_export.json"))
    assert [(r["agent_id"], r["input_tokens"], r["output_tokens"]) for r in recs] == [
        ("researcher", 512, 48), ("researcher", 1480, 365)]
    assert recs[0]["workflow_id"] == "thread-42"
    assert recs[0]["tool_calls"][0]["name"] == "web_search"
    assert recs[0]["tool_calls"][0]["t_end"] - recs[0]["tool_calls"][0]["t_start"] == pytest.approx(2.5)


def test_missing_token_counts_are_left_out_not_invented(tmp_path):
    line = json.loads(TRACES.read_text().splitlines()[0])
    for span in line["resourceSpans"][0]["scopeSpans"][0]["spans"]:
        span["attributes"] = [a for a in span["attributes"] if not a["key"].startswith("gen_ai.usage")]
    src = tmp_path / "t.jsonl"
    src.write_text(json.dumps(line) + "\n")
    recs = list(iter_records("otel", src))
    assert recs and all("input_tokens" not in r and "output_tokens" not in r for r in recs)


def test_malformed_line_names_file_and_line_and_keeps_the_rest(tmp_path):
    lines = TRACES.read_text().splitlines()
    src = tmp_path / "broken.jsonl"
    src.write_text("\n".join([lines[0], lines[1][:57], lines[2]]) + "\n")
    with pytest.raises(ImportFormatError) as exc:
        list(iter_records("otel", src))
    assert exc.value.line == 2 and str(src) in str(exc.value) and "not valid JSON" in str(exc.value)
    errors: list[ImportFormatError] = []
    recs = list(iter_records("otel", src, on_error=errors.append))
    assert [e.line for e in errors] == [2]
    assert len(recs) == 3  # two planner calls (line 1) and the trace-2 call (line 3)


def test_broken_first_line_does_not_hide_the_rest(tmp_path):
    lines = TRACES.read_text().splitlines()
    src = tmp_path / "first_broken.jsonl"
    src.write_text("\n".join(['{"resourceSpans": [', lines[2]]) + "\n")
    errors: list[ImportFormatError] = []
    recs = list(iter_records("otel", src, on_error=errors.append))
    assert [e.line for e in errors] == [1] and len(recs) == 1


def test_bad_values_name_the_field(tmp_path):
    line = json.loads(TRACES.read_text().splitlines()[0])
    spans = line["resourceSpans"][0]["scopeSpans"][0]["spans"]
    chat = next(s for s in spans if s["spanId"] == "a000000000000003")
    for a in chat["attributes"]:
        if a["key"] == "gen_ai.usage.output_tokens":
            a["value"] = {"intValue": "-5"}
    other = next(s for s in spans if s["spanId"] == "a000000000000006")
    del other["endTimeUnixNano"]
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps(line) + "\n" + json.dumps({"resource": {}}) + "\n")
    errors: list[ImportFormatError] = []
    assert list(iter_records("otel", src, on_error=errors.append)) == []
    fields = sorted((e.line or 0, e.field or "") for e in errors)
    assert fields == [(1, "end_time"), (1, "gen_ai.usage.output_tokens"), (2, "resourceSpans")]


def test_any_value_decoding():
    assert otel.any_value({"arrayValue": {"values": [{"intValue": "3"}, {"stringValue": "x"}]}}) == [3, "x"]
    assert otel.any_value({"kvlistValue": {"values": [{"key": "k", "value": {"boolValue": True}}]}}) == {"k": True}
    assert otel.any_value({"doubleValue": 1.5}) == 1.5


def _span(span_id: int, parent: int | None, name: str, attrs: dict, t0: float, t1: float) -> dict:
    return {"name": name, "context": {"trace_id": 77, "span_id": span_id}, "parent_id": parent,
            "start_time": int(t0 * 1e9), "end_time": int(t1 * 1e9), "status": {"status_code": "OK"},
            "attributes": attrs, "resource": {"attributes": {"service.name": "team"}}}


LLM = {"openinference.span.kind": "LLM", "llm.token_count.prompt": 300, "llm.token_count.completion": 40}


@pytest.mark.parametrize("parent_attrs, agent", [
    # LangGraph under OpenInference: node runs are CHAIN spans whose metadata names the node
    ({"openinference.span.kind": "CHAIN", "metadata": json.dumps({"langgraph_node": "researcher",
                                                                   "langgraph_step": 2})}, "researcher"),
    # OpenLLMetry (Traceloop): an agent span names itself in traceloop.entity.name
    ({"traceloop.span.kind": "agent", "traceloop.entity.name": "planner"}, "planner"),
    # pydantic-ai / Logfire: the agent run span carries agent_name
    ({"agent_name": "support_agent"}, "support_agent"),
    # OpenInference graph attributes
    ({"graph.node.id": "coder"}, "coder"),
])
def test_agent_names_of_other_frameworks_are_kept(tmp_path, parent_attrs, agent):
    spans = [_span(1, None, "run", {"session.id": "s-1"}, 0.0, 10.0),
             _span(2, 1, "node", parent_attrs, 1.0, 9.0),
             _span(3, 2, "ChatOpenAI", dict(LLM), 2.0, 4.0)]
    (tmp_path / "spans.json").write_text(json.dumps({"spans": spans}))
    (rec,) = iter_records("otel", tmp_path / "spans.json")
    assert rec["agent_id"] == agent and rec["workflow_id"] == "s-1"


def test_stage_is_the_langgraph_node_or_openllmetry_task_the_call_ran_in(tmp_path):
    node = {"openinference.span.kind": "CHAIN", "metadata": json.dumps({"langgraph_node": "review"}),
            "gen_ai.agent.name": "coder"}
    spans = [_span(1, None, "run", {"session.id": "s-1", "gen_ai.agent.name": "coder"}, 0.0, 10.0),
             _span(2, 1, "node", node, 1.0, 9.0),
             _span(3, 2, "ChatOpenAI", dict(LLM), 2.0, 4.0),
             _span(4, 1, "write_tests.task", {"traceloop.span.kind": "task", "traceloop.entity.name": "write_tests"},
                   4.5, 9.5),
             _span(5, 4, "ChatOpenAI", dict(LLM), 5.0, 6.0),
             _span(6, 1, "ChatOpenAI", dict(LLM), 9.6, 9.9)]
    (tmp_path / "spans.json").write_text(json.dumps({"spans": spans}))
    recs = sorted(iter_records("otel", tmp_path / "spans.json"), key=lambda r: r["t_arrival"])
    assert [r["agent_id"] for r in recs] == ["coder"] * 3        # an agent name wins over the node
    assert [r.get("stage") for r in recs] == ["review", "write_tests", None]


def test_langgraph_start_node_is_not_an_agent(tmp_path):
    spans = [_span(1, None, "run", {"metadata": json.dumps({"langgraph_node": "__start__"})}, 0.0, 10.0),
             _span(3, 1, "ChatOpenAI", dict(LLM), 2.0, 4.0)]
    (tmp_path / "spans.json").write_text(json.dumps({"spans": spans}))
    (rec,) = iter_records("otel", tmp_path / "spans.json")
    assert rec["agent_id"] == "default"
