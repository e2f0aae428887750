"""SWE-agent importer: .traj steps + the debug log's times and token counts."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from store.importers import ImportFormatError, iter_records

FIXTURES = Path(__file__).parent / "fixtures" / "importers" / "swe_agent"
INSTANCE = FIXTURES / "glm45__swe_bench_lite__bs1" / "django__django-14016"
TRAJ = INSTANCE / "django__django-14016.traj"


@pytest.fixture
def copy_of_instance(tmp_path) -> Path:
    dest = tmp_path / "run_x" / "django__django-14016"
    shutil.copytree(INSTANCE, dest)
    return dest


def test_one_record_per_llm_call_with_logged_tokens_and_times():
    recs = list(iter_records("swe-agent", FIXTURES))
    assert [r["request_id"].rsplit("/", 1)[1] for r in recs] == ["step1", "step2-requery1", "step2", "step3"]
    assert all(r["workflow_id"] == "glm45__swe_bench_lite__bs1/django__django-14016" for r in recs)
    assert {r["workflow_type_id"] for r in recs} == {"swe_agent"}
    assert {r["agent_id"] for r in recs} == {"main"}
    assert [(r["input_tokens"], r["output_tokens"]) for r in recs] == [(5920, 128), (6736, 81), (6790, 70),
                                                                      (2430, 120)]
    # tokens add up to the trajectory's own totals (info.model_stats): nothing invented
    stats = json.loads(TRAJ.read_text())["info"]["model_stats"]
    assert sum(r["input_tokens"] for r in recs) == stats["tokens_sent"]
    assert sum(r["output_tokens"] for r in recs) == stats["tokens_received"]
    assert len(recs) == stats["api_calls"]
    first = recs[0]
    assert first["t_arrival"] == pytest.approx(1760234763.909)  # "STEP 1" line, read as UTC
    assert first["t_finish"] == pytest.approx(1760234767.455)  # its input_tokens= line
    assert recs[2]["t_arrival"] == pytest.approx(recs[1]["t_finish"])  # the requery follows the failed call
    assert first["model"] == "/data/models/GLM-4.5-FP8"


def test_step_actions_become_timed_tools():
    recs = list(iter_records("swe-agent", TRAJ))
    tools = [(r.get("tool_calls") or [{}])[0].get("name") for r in recs]
    assert tools == ["str_replace_editor", None, "grep", "submit"]
    t = recs[0]["tool_calls"][0]
    assert t["t_start"] == pytest.approx(1760234767.914)  # the THOUGHT/ACTION line
    assert t["t_end"] - t["t_start"] == pytest.approx(0.14640825241804123)  # execution_time
    assert recs[1]["requery"] is True


def test_messages_are_the_exact_query_in_chat_shape():
    rec = next(iter_records("swe-agent", TRAJ))
    assert [m["role"] for m in rec["messages"]] == ["system", "user"]
    assert all(set(m) <= {"role", "content", "tool_calls", "tool_call_id", "name"} for m in rec["messages"])
    assert rec["response_text"].startswith("I'll look at how Q objects")
    assert "messages" not in next(iter_records("swe-agent", TRAJ, with_text=False))


def test_timezone_of_the_log(copy_of_instance):
    utc = next(iter_records("swe-agent", copy_of_instance))
    paris = next(iter_records("swe-agent", copy_of_instance, timezone="Europe/Paris"))
    assert utc["t_arrival"] - paris["t_arrival"] == pytest.approx(2 * 3600)  # CEST in October
    assert utc["workflow_id"] == "run_x/django__django-14016"


def test_without_debug_log_and_step_tokens_steps_come_in_order_with_unknown_tokens(copy_of_instance):
    """A .traj alone holds only run totals: its steps in order with their tools and real execution
    times, token counts flagged unknown, and a one-line warning naming the totals."""
    (copy_of_instance / "django__django-14016.debug.log").unlink()
    warnings: list[ImportFormatError] = []
    recs = list(iter_records("swe-agent", copy_of_instance, on_error=warnings.append))
    (warning,) = warnings
    assert warning.warning and "\n" not in str(warning)
    assert re.search(r"no per-call token counts .*tokens_sent=21876.*--estimate-tokens", str(warning))
    doc = json.loads(next(copy_of_instance.glob("*.traj")).read_text())
    steps = doc["trajectory"]
    assert len(recs) == len(steps) == 3
    assert all(r["tokens_unknown"] and (r["input_tokens"], r["output_tokens"]) == (0, 0) for r in recs)
    assert [r["timing"] for r in recs] == ["synthetic_order"] * 3
    assert [r["tool_calls"][0]["name"] for r in recs] == ["str_replace_editor", "grep", "submit"]
    for rec, step in zip(recs, steps):  # the tool's duration is the step's real execution_time
        (tool,) = rec["tool_calls"]
        assert tool["t_end"] - tool["t_start"] == pytest.approx(float(step["execution_time"]))
        assert rec["tool_timing"] == "duration_only"


def test_totals_only_traj_token_estimate_is_opt_in_and_flagged(copy_of_instance):
    (copy_of_instance / "django__django-14016.debug.log").unlink()
    recs = list(iter_records("swe-agent", copy_of_instance, estimate_tokens=True, on_error=lambda e: None))
    doc = json.loads(next(copy_of_instance.glob("*.traj")).read_text())
    for rec, step in zip(recs, doc["trajectory"]):
        assert rec["tokens_estimated"] is True and rec["token_estimate_method"] == "utf8_bytes/4"
        assert "tokens_unknown" not in rec
        text_in = sum(len((c if isinstance(c, str) else "".join(part["text"] for part in c)).encode())
                      for c in (m["content"] for m in step["query"]))
        assert rec["input_tokens"] == -(-text_in // 4) > 0
        assert rec["output_tokens"] == -(-len(step["response"].encode()) // 4) > 0


def test_log_of_another_run_is_rejected(copy_of_instance):
    log = copy_of_instance / "django__django-14016.debug.log"
    log.write_text("\n".join(l for l in log.read_text().splitlines() if "STEP 3" not in l) + "\n")
    with pytest.raises(ImportFormatError, match=r"\[2\] steps but .* has 3"):
        list(iter_records("swe-agent", copy_of_instance))


def test_rerun_appended_to_the_log_uses_the_last_run(copy_of_instance):
    log = copy_of_instance / "django__django-14016.debug.log"
    text = log.read_text()
    log.write_text(text.replace("2025-10-12", "2025-10-11") + text)  # an earlier run, a day before
    recs = list(iter_records("swe-agent", copy_of_instance))
    assert recs[0]["t_arrival"] == pytest.approx(1760234763.909)


def test_broken_traj_names_its_line(copy_of_instance):
    traj = copy_of_instance / "django__django-14016.traj"
    traj.write_text(traj.read_text()[:400])
    errors: list[ImportFormatError] = []
    assert list(iter_records("swe-agent", copy_of_instance, on_error=errors.append)) == []
    assert len(errors) == 1 and errors[0].file == str(traj) and errors[0].line is not None
