"""Every kind of bad input is quarantined with file, line and reason; nothing valid is lost."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from store import ingest
from tests.conftest import write_jsonl
from tests.test_ingest_formats import flat


def quarantine(con):
    return con.execute("SELECT file, line, field, reason FROM quarantine ORDER BY file, line").fetchall()


def load_one_bad(con, tmp_path, bad):
    path = write_jsonl(tmp_path / "x.jsonl", [flat("ok1"), bad, flat("ok2", t0=200)])
    rep = ingest.ingest(con, [path])
    assert rep.loaded == 2, "valid records around the bad one must load"
    assert rep.quarantined == 1
    (file, line, field, reason), = quarantine(con)
    assert file.endswith("x.jsonl") and line == 2
    return field, reason


def test_invalid_json(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, '{"request_id": "x", ')
    assert reason == "invalid JSON"


def test_missing_field(con, tmp_path):
    rec = flat("bad")
    del rec["agent_id"]
    field, reason = load_one_bad(con, tmp_path, rec)
    assert field == "agent_id" and "missing required field 'agent_id'" in reason


def test_wrong_type(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, flat("bad", inp="many"))
    assert field == "input_tokens" and "wrong type" in reason and "many" in reason


def test_wrong_type_in_tool_calls(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, flat("bad", tool_calls=[{"t_start": 1}]))
    assert field == "tool_calls"


def test_negative_tokens(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, flat("bad", out=-3))
    assert field == "output_tokens" and reason == "negative tokens: output_tokens = -3"


def test_finish_before_arrival(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, flat("bad", dur=-1.0))
    assert field == "t_finish" and reason.startswith("t_finish < t_arrival")


def test_implausible_duration(con, tmp_path):
    """Issue 35: t_arrival 12 and t_finish now (a 56-year call) was accepted."""
    field, reason = load_one_bad(con, tmp_path, flat("bad", t0=12.0, dur=1.7647e9))
    assert field == "t_finish" and reason.startswith("implausible duration: t_finish - t_arrival = 1.765e+09 s"), reason
    assert "ceiling 86,400 s" in reason


def test_a_day_long_call_is_still_valid(con, tmp_path):
    path = write_jsonl(tmp_path / "day.jsonl", [flat("a", dur=86_400.0)])
    assert ingest.ingest(con, [path]).loaded == 1


def test_tool_that_ends_before_it_starts(con, tmp_path):
    """Issue 35: it was stored at -1 s and silently left out of the tool fits."""
    tools = [{"name": "bash", "t_start": 100.5, "t_end": 100.8}, {"name": "edit", "t_start": 101.0, "t_end": 100.0}]
    field, reason = load_one_bad(con, tmp_path, flat("bad", tool_calls=tools))
    assert field == "tool_calls" and reason == "tool edit: t_end < t_start (100.0 < 101.0)", reason
    assert con.execute("SELECT count(*) FROM tool_calls WHERE latency_s < 0").fetchone()[0] == 0


@pytest.mark.parametrize("extra, field_name, starts", [
    ({"t_first_token": 0.0}, "t_first_token", "t_first_token < t_arrival"),     # TTFT -100 s
    ({"t_first_token": 99.5}, "t_first_token", "t_first_token < t_arrival"),
    ({"t_first_token": 103.0}, "t_first_token", "t_first_token > t_finish"),      # after the end
    ({"cached_tokens": 11}, "cached_tokens", "cached_tokens > input_tokens (11 > 10)"),
])
def test_impossible_first_token_or_cache_counts(con, tmp_path, extra, field_name, starts):
    """Issue 24: these were accepted (a TTFT of -1.76e9 s when t_first_token was 0)."""
    field, reason = load_one_bad(con, tmp_path, flat("bad", **extra))
    assert field == field_name and reason.startswith(starts), reason


def test_first_token_and_cache_at_their_bounds_are_valid(con, tmp_path):
    path = write_jsonl(tmp_path / "edge.jsonl", [flat("a", t_first_token=100.0, cached_tokens=10),
                                                 flat("b", t_first_token=102.0, cached_tokens=0)])
    assert ingest.ingest(con, [path]).quarantined == 0


def test_not_an_object(con, tmp_path):
    field, reason = load_one_bad(con, tmp_path, "[1, 2]")
    assert "not a JSON object" in reason


def test_duplicate_id_conflicting_content_in_one_batch(con, tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [flat("same", out=5), flat("other", t0=300), flat("same", out=999)])
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (2, 1)
    (_, line, field, reason), = quarantine(con)
    assert line == 3 and field == "request_id" and "conflicting duplicate" in reason and "d.jsonl:1" in reason
    assert con.execute("SELECT output_tokens FROM calls WHERE request_id='same'").fetchone()[0] == 5


def test_duplicate_id_conflicting_with_store(con, tmp_path):
    ingest.ingest(con, [write_jsonl(tmp_path / "a.jsonl", [flat("same", out=5)])])
    rep = ingest.ingest(con, [write_jsonl(tmp_path / "b.jsonl", [flat("same", out=6)])])
    assert (rep.loaded, rep.quarantined) == (0, 1)
    assert "already stored" in quarantine(con)[0][3]


def test_truncated_gzip_keeps_every_complete_record(con, tmp_path):
    body = "".join(json.dumps(flat(f"r{i}", t0=float(i))) + "\n" for i in range(2000)).encode()
    data = gzip.compress(body)
    path = tmp_path / "cut.jsonl.gz"
    path.write_bytes(data[: len(data) * 2 // 3])
    rep = ingest.ingest(con, [path])
    assert rep.loaded > 1000, "records before the damage must be kept"
    rows = quarantine(con)
    assert any(line is None and "damaged" in reason for _, line, _, reason in rows)
    stored = con.execute("SELECT max(source_line), count(*) FROM calls").fetchone()
    assert stored[0] == stored[1]  # every line up to the damage, none skipped


def test_empty_file(con, tmp_path):
    (tmp_path / "empty.jsonl").write_text("")
    rep = ingest.ingest(con, [tmp_path / "empty.jsonl"])
    assert rep.loaded == 0 and rep.quarantined == 1
    assert quarantine(con)[0][3] == "empty file: no records"


def test_blank_lines_are_not_records(con, tmp_path):
    path = tmp_path / "b.jsonl"
    path.write_text(json.dumps(flat("a")) + "\n\n   \n" + json.dumps(flat("b", t0=150)) + "\n")
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (2, 0)
    assert con.execute("SELECT source_line FROM calls WHERE request_id='b'").fetchone()[0] == 4


def test_strict_mode_raises_after_loading_valid_records(con, tmp_path):
    path = write_jsonl(tmp_path / "x.jsonl", [flat("ok"), flat("bad", out=-1)])
    with pytest.raises(ingest.IngestError, match="negative tokens"):
        ingest.ingest(con, [path], strict=True)
    assert con.execute("SELECT count(*) FROM calls").fetchone()[0] == 1


@pytest.mark.slow
def test_strict_cli_exit_code_and_reasons(tmp_path):
    path = write_jsonl(tmp_path / "logs" / "x.jsonl", [flat("ok"), flat("bad", dur=-5)])
    run = subprocess.run([sys.executable, "-m", "profiler", "fit", str(path.parent), "--out",
                          str(tmp_path / "p"), "--strict", "-q"], capture_output=True, text=True)
    assert run.returncode != 0
    assert "x.jsonl:2" in run.stderr and "t_finish < t_arrival" in run.stderr
    assert not (tmp_path / "p" / "CURRENT").exists()


def test_missing_path_is_a_clear_error(con, tmp_path):
    with pytest.raises(ingest.IngestError, match="no such file"):
        ingest.ingest(con, [tmp_path / "nope"])
