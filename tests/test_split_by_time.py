"""``profiler split --by-time``: per workflow type, train on the workflows that started first."""
from __future__ import annotations

import json

import pytest

from store.split import split_logs


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _rec(wf: str, n: int, t: float | str | None, wt: str = "t") -> dict:
    return {"request_id": f"{wf}#{n}", "workflow_type_id": wt, "workflow_id": wf, "agent_id": "a",
            "t_arrival": t, "t_finish": t if not isinstance(t, float) else t + 1, "input_tokens": 10,
            "output_tokens": 5}


def _side(path) -> set[str]:
    return {json.loads(line)["workflow_id"] for line in path.read_text().splitlines()}


def test_the_earliest_starting_workflows_are_train_whatever_the_file_order(tmp_path):
    # w3 starts first but its later call is written first; w0 starts last
    recs = [_rec("w3", 1, 500.0), _rec("w0", 0, 400.0), _rec("w1", 0, 100.0), _rec("w2", 0, 200.0),
            _rec("w3", 0, 50.0), _rec("w4", 0, 300.0), _rec("w1", 1, 900.0)]
    counts = split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.6, order="time")
    assert _side(tmp_path / "s" / "train" / "logs.jsonl") == {"w3", "w1", "w2"}   # 3 of 5 by start
    assert _side(tmp_path / "s" / "test" / "logs.jsonl") == {"w4", "w0"}
    assert counts == {"train": 5, "test": 2}          # every call of a workflow on its side


def test_the_cut_is_per_workflow_type(tmp_path):
    # type b ran entirely after type a: a global cut would test b on a cold start
    recs = [_rec(f"a{i}", 0, float(i)) for i in range(4)] + [_rec(f"b{i}", 0, 100.0 + i, "b") for i in range(4)]
    split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.5, order="time")
    assert _side(tmp_path / "s" / "train" / "logs.jsonl") == {"a0", "a1", "b0", "b1"}


def test_iso_times_order_as_epoch_seconds_do(tmp_path):
    recs = [_rec("late", 0, "2026-01-02T00:00:00Z"), _rec("early", 0, "2026-01-01T00:00:00Z")]
    split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.5, order="time")
    assert _side(tmp_path / "s" / "train" / "logs.jsonl") == {"early"}


def test_a_workflow_without_a_time_goes_to_test_and_a_bad_order_is_refused(tmp_path):
    recs = [_rec("w0", 0, 1.0), _rec("w1", 0, None), _rec("w2", 0, 2.0), _rec("w3", 0, 3.0)]
    split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.5, order="time")
    assert "w1" in _side(tmp_path / "s" / "test" / "logs.jsonl")
    with pytest.raises(ValueError, match="'hash' or 'time'"):
        split_logs([_write(tmp_path / "b.jsonl", recs)], tmp_path / "t", order="date")
