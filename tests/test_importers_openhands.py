"""OpenHands importer: token_usages + response_latencies + history events."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from store.importers import ImportFormatError, iter_records

FIXTURES = Path(__file__).parent / "fixtures" / "importers" / "openhands"
OUTPUT = next(FIXTURES.rglob("output.jsonl"))


def lines() -> list[dict]:
    return [json.loads(l) for l in OUTPUT.read_text().splitlines()]


def test_one_record_per_token_usage_entry():
    recs = list(iter_records("openhands", FIXTURES, on_error=lambda e: None))
    assert len(recs) == 7
    run = OUTPUT.parent.name
    assert {r["workflow_id"] for r in recs} == {f"{run}/ponylang__ponyc-4595", f"{run}/example__repo-1234"}
    assert {r["agent_id"] for r in recs} == {"CodeActAgent"}
    first = recs[0]
    assert (first["input_tokens"], first["output_tokens"], first["cached_tokens"]) == (5920, 128, 0)
    # t_finish: the action the response produced (naive local time of a UTC+8 machine, detected
    # against the responses' `created` stamps); t_arrival: minus its latency
    assert first["t_finish"] == pytest.approx(1746030777.821635 - 8 * 3600)
    assert first["t_finish"] - first["t_arrival"] == pytest.approx(3.0569519996643066)
    totals = [l["metrics"]["token_usages"] for l in lines()]
    assert sum(r["input_tokens"] for r in recs) == sum(u["prompt_tokens"] for t in totals for u in t)


def test_tools_from_actions_and_their_observations():
    recs = list(iter_records("openhands", OUTPUT))
    names = [[t["name"] for t in r.get("tool_calls", [])] for r in recs]
    assert names == [["execute_bash"], ["str_replace_editor"], ["think"], [], [],
                     ["execute_bash", "str_replace_editor"], []]  # finish runs nothing
    bash = recs[0]["tool_calls"][0]
    assert bash["t_end"] - bash["t_start"] == pytest.approx(58.441272 - 57.821635)
    assert recs[0]["response_text"] == "I'll start by exploring the repository."


def test_plain_agent_message_matched_by_running_token_totals():
    recs = list(iter_records("openhands", OUTPUT))
    message = recs[3]
    assert message["actions"] == ["message"]
    assert message["t_finish"] == pytest.approx(1746030784.930118 - 8 * 3600)


def test_timezone_option_and_detection():
    warnings: list[ImportFormatError] = []
    detected = next(iter_records("openhands", OUTPUT, on_error=warnings.append))
    assert [w.warning for w in warnings] == [True] and "UTC+08:00" in warnings[0].reason
    shanghai_warnings: list[ImportFormatError] = []
    shanghai = next(iter_records("openhands", OUTPUT, timezone="Asia/Shanghai", on_error=shanghai_warnings.append))
    assert shanghai_warnings == []  # the given zone agrees with the created stamps: nothing to say
    utc_warnings: list[ImportFormatError] = []
    utc = next(iter_records("openhands", OUTPUT, timezone="UTC", on_error=utc_warnings.append))
    assert "shifted by -8.00 h" in utc_warnings[0].reason or "shifted by +8.00 h" in utc_warnings[0].reason
    assert utc["t_finish"] - shanghai["t_finish"] == pytest.approx(8 * 3600)
    assert detected["t_finish"] == pytest.approx(shanghai["t_finish"])
    # read in the right zone, the action follows the provider's `created` stamp by a few seconds
    assert 0 < shanghai["t_finish"] - 1746001974 < 10


def test_naive_times_with_nothing_to_check_against_warn(tmp_path):
    data = lines()[1]
    for e in data["history"]:
        (e.get("tool_call_metadata") or {}).get("model_response", {}).pop("created", None)
    src = tmp_path / "run" / "output.jsonl"
    src.parent.mkdir()
    src.write_text(json.dumps(data) + "\n")
    warnings: list[ImportFormatError] = []
    recs = list(iter_records("openhands", src, on_error=warnings.append))
    assert recs and [w.warning for w in warnings] == [True] and "read as UTC" in warnings[0].reason


def test_call_without_event_is_reported_and_the_rest_kept(tmp_path):
    data = lines()
    data[1]["metrics"]["token_usages"].append({"model": "m", "prompt_tokens": 6000, "completion_tokens": 9,
                                               "response_id": "gen-never-acted"})
    src = tmp_path / "run" / "output.jsonl"
    src.parent.mkdir()
    src.write_text("\n".join(json.dumps(d) for d in data) + "\n")
    errors: list[ImportFormatError] = []
    recs = list(iter_records("openhands", src, on_error=errors.append))
    errors = [e for e in errors if not e.warning]
    assert len(recs) == 7
    assert len(errors) == 1 and errors[0].line == 2 and "gen-never-acted" in errors[0].reason


def test_malformed_and_old_format_lines(tmp_path):
    data = lines()
    old = {"instance_id": "x", "history": [[{"action": "run", "command": "ls"}, {"observation": "run"}]],
           "metrics": {"accumulated_cost": 0.1, "costs": [0.1]}}
    src = tmp_path / "output.jsonl"
    src.write_text(json.dumps(data[0]) + "\n{\"instance_id\": \"trunc\n" + json.dumps(old) + "\n"
                   + json.dumps({"instance_id": "y", "history": [], "metrics": {}}) + "\n")
    errors: list[ImportFormatError] = []
    recs = list(iter_records("openhands", src, on_error=errors.append))
    errors = [e for e in errors if not e.warning]
    assert len(recs) == 5
    assert [(e.line, e.field) for e in errors] == [(2, None), (3, "history"), (4, "metrics.token_usages")]
    with pytest.raises(ImportFormatError, match=r"output\.jsonl:2: not valid JSON"):
        list(iter_records("openhands", src))
