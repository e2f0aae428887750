"""Adversarial input: out-of-range numbers, odd keys, malformed CSV lines, overlong lines, gzip
bombs, symlinks, re-reads — each quarantined alone (or the file alone) with a clear reason, and
the store stays fit-able."""
from __future__ import annotations

import csv
import gzip
import json
import os

import pytest

from store import ingest, profile_artifact as pa
from fitting.profile_fit import FitOptions, fit_from_store
from tests.conftest import write_jsonl
from tests.test_ingest_formats import flat


def quarantine(con):
    return con.execute("SELECT file, line, field, reason FROM quarantine ORDER BY file, line").fetchall()


@pytest.mark.parametrize("field,value,reason", [
    ("output_tokens", 1e30, "out of range: output_tokens = 1e"),
    ("input_tokens", 2**63, "out of range: input_tokens"),
    ("output_tokens", 1_000_000_001, "out of range: output_tokens"),
    ("output_tokens", "NaN", "not a finite number: output_tokens"),
    ("t_arrival", "Infinity", "not a finite number: t_arrival"),
    ("t_arrival", "-1e400", "not a finite number: t_arrival"),
    ("t_arrival", 1.7e12, "out of range: t_arrival"),       # milliseconds
    ("t_first_token", -5.0, "out of range: t_first_token"),
    ("cached_tokens", -1, "negative tokens: cached_tokens"),
])
def test_out_of_range_numbers_are_quarantined_per_record(con, tmp_path, field, value, reason):
    bad = flat("bad", t0=150)
    if field == "t_arrival" and isinstance(value, float) and value > 0:
        bad["t_finish"] = value + 1
    text = json.dumps(bad)[:-1] + f', "{field}": {value if not isinstance(value, str) else value}}}'
    text = text.replace(f'"{field}": {json.dumps(bad.get(field))}, ', "") if field in bad else text
    path = write_jsonl(tmp_path / "x.jsonl", [flat("ok1"), text, flat("ok2", t0=200)])
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (2, 1)
    (_, line, got_field, got_reason), = quarantine(con)
    assert line == 2 and got_field == field and got_reason.startswith(reason), got_reason
    fit_from_store(con, FitOptions(conditional=False))  # the store stays fit-able


def test_any_json_key_is_kept_in_extra(con, tmp_path):
    rec = flat("a")
    rec.update({"": 1, 'a\\"b': 2, "x/y~z": [3], "a.b": {"c": 4}, "q'": "five"})
    path = write_jsonl(tmp_path / "k.jsonl", [rec, flat("b", t0=200)])
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (2, 0)
    extra = json.loads(con.execute("SELECT extra FROM calls WHERE request_id = 'a'").fetchone()[0])
    assert extra == {"": 1, 'a\\"b': 2, "x/y~z": [3], "a.b": {"c": 4}, "q'": "five"}


def test_malformed_csv_line_is_quarantined_alone(con, tmp_path):
    path = tmp_path / "calls.csv"
    cols = ["request_id", "workflow_type_id", "workflow_id", "agent_id", "t_arrival", "t_finish",
            "input_tokens", "output_tokens", "messages"]
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(cols)
        for i in range(1000):
            w.writerow([f"r{i}", "app", f"w{i % 7}", "a", 100 + i, 101 + i, 10, 5,
                        json.dumps([{"role": "user", "content": "hi, there"}])])
    lines = path.read_text().splitlines(keepends=True)
    lines[500] = 'rX,app,w1,a,1,2,3\n'                 # file line 501: too few fields
    lines[800] = 'rY,app,w1,a,1,2,3,4,"[]",extra,more\n'  # file line 801: too many
    path.write_text("".join(lines))
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (998, 2)
    rows = quarantine(con)
    assert [r[1] for r in rows] == [501, 801] and all("unreadable line" in r[3] for r in rows)
    # rows after a rejected line keep their real line numbers
    assert con.execute("SELECT source_line FROM calls WHERE request_id = 'r600'").fetchone()[0] == 602
    assert con.execute("SELECT source_line FROM calls WHERE request_id = 'r999'").fetchone()[0] == 1001


def test_overlong_line_is_quarantined_alone(con, tmp_path, monkeypatch):
    monkeypatch.setenv("PROFILER_MAX_LINE_BYTES", "2000")
    big = flat("big", t0=300, response_text="x" * 5000)
    path = write_jsonl(tmp_path / "l.jsonl", [flat("a"), big, flat("b", t0=200), big, flat("c", t0=400)])
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.quarantined) == (3, 2)
    rows = quarantine(con)
    assert [r[1] for r in rows] == [2, 4]
    assert "longer than the limit 2,000" in rows[0][3] and "PROFILER_MAX_LINE_BYTES" in rows[0][3]
    assert dict(con.execute("SELECT request_id, source_line FROM calls").fetchall()) == {"a": 1, "b": 3, "c": 5}


def test_overlong_line_in_a_damaged_gzip_is_quarantined_alone(con, tmp_path, monkeypatch):
    """The Python fallback (DuckDB cannot read a truncated gzip) also keeps lines bounded."""
    monkeypatch.setenv("PROFILER_MAX_LINE_BYTES", "3000")
    recs = [flat(f"r{i}", t0=float(i)) for i in range(400)]
    recs[5] = dict(recs[5], response_text="y" * 10_000)
    data = gzip.compress("".join(json.dumps(r) + "\n" for r in recs).encode())
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) * 3 // 4])
    rep = ingest.ingest(con, [tmp_path / "cut.jsonl.gz"])
    rows = quarantine(con)
    assert any(line == 6 and "longer than the limit" in reason for _, line, _, reason in rows)
    assert any(line is None and "damaged" in reason for _, line, _, reason in rows)
    assert rep.loaded > 100
    assert con.execute("SELECT count(*) FROM calls WHERE source_line = 7 AND request_id = 'r6'").fetchone()[0] == 1


def test_gzip_bomb_is_quarantined_without_reading_it(con, tmp_path):
    bomb = tmp_path / "bomb.jsonl.gz"
    with gzip.open(bomb, "wb") as fh:
        for _ in range(40):
            fh.write(b" " * 2**20)           # 40 MiB of blanks compress ~1000x
    write_jsonl(tmp_path / "ok.jsonl", [flat("a")])
    limits = ingest.Limits(max_gzip_ratio=20, gzip_ratio_floor_bytes=2**20)
    rep = ingest.ingest(con, [tmp_path], limits=limits)
    assert (rep.loaded, rep.quarantined) == (1, 1)
    (file, line, _, reason), = [r for r in quarantine(con) if r[0].endswith("bomb.jsonl.gz")]
    assert line is None and "decompresses to more than" in reason and "PROFILER_MAX_GZIP_RATIO" in reason
    # not marked as ingested (raise the limit and it is read), and re-running adds no second row
    assert con.execute("SELECT count(*) FROM ingested_files WHERE path LIKE '%bomb.jsonl.gz'").fetchone()[0] == 0
    ingest.ingest(con, [tmp_path], limits=limits)
    assert len(quarantine(con)) == 1


def test_file_size_limit(con, tmp_path, monkeypatch):
    monkeypatch.setenv("PROFILER_MAX_FILE_BYTES", "500")
    path = write_jsonl(tmp_path / "big.jsonl", [flat(f"r{i}", t0=float(i)) for i in range(20)])
    rep = ingest.ingest(con, [path])
    assert rep.loaded == 0 and "over the limit 500" in quarantine(con)[0][3]


def test_quarantine_is_idempotent_when_a_file_is_read_again(con, tmp_path):
    path = write_jsonl(tmp_path / "g.jsonl", [flat("a"), flat("bad", out=-1)])
    ingest.ingest(con, [path])
    with open(path, "a") as fh:  # the file grows: new hash, read again from the top
        fh.write(json.dumps(flat("b", t0=300)) + "\n")
    rep = ingest.ingest(con, [path])
    assert (rep.loaded, rep.duplicates) == (1, 1)
    assert len(quarantine(con)) == 1


def test_symlinks_leaving_the_folder_are_not_followed(con, tmp_path):
    outside = write_jsonl(tmp_path / "secret" / "other.jsonl", [flat("s")])
    logs = tmp_path / "logs"
    write_jsonl(logs / "a.jsonl", [flat("a")])
    os.symlink(outside, logs / "link.jsonl")
    os.symlink(outside.parent, logs / "linkdir")
    os.symlink(logs / "a.jsonl", logs / "same.jsonl")   # inside: read once
    rep = ingest.ingest(con, [logs])
    assert rep.loaded == 1
    assert con.execute("SELECT request_id FROM calls").fetchall() == [("a",)]
    rows = quarantine(con)
    assert sorted(os.path.basename(r[0]) for r in rows) == ["link.jsonl", "linkdir"]
    assert all("outside the log folder: not followed" in r[3] for r in rows)
    ingest.ingest(con, [logs])
    assert len(quarantine(con)) == 2  # idempotent


def _shaped(x: int) -> dict:
    """The smallest profile of the shape a fit writes (the versions a hint may name, issue 35)."""
    return {"format": pa.FORMAT, "agents": {"w": {"a": {}}}, "workflow_types": {"w": {}}, "workflows": {},
            "output_length": {}, "tool_latency": {}, "x": x}


def test_current_is_validated(tmp_path):
    p1 = pa.write_profile(tmp_path, _shaped(1), {})
    (tmp_path / "CURRENT").write_text("../../etc\n")
    with pytest.raises(pa.ProfileError, match=f"does not name a version.*{p1.version}"):
        pa.load_profile(tmp_path)
    (tmp_path / "CURRENT").write_text("0123456789ab\n")
    with pytest.raises(pa.ProfileError, match=f"is missing.*valid versions here.*{p1.version}"):
        pa.load_profile(tmp_path)
    p2 = pa.write_profile(tmp_path, _shaped(2), {})
    (tmp_path / "versions" / p2.version / "profile.json").write_text('{"x": ')  # damaged
    with pytest.raises(pa.ProfileError, match="profile.json is damaged"):
        pa.load_profile(tmp_path)
    assert pa.valid_versions(tmp_path) == [p1.version]
    # a fit of the same content repairs the damaged version folder
    assert pa.load_profile(pa.write_profile(tmp_path, _shaped(2), {}).path).data["x"] == 2
    assert pa.load_profile(tmp_path).data["x"] == 2
