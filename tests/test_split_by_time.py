"""``profiler split --by time``: train on the workflows that started first, test on the rest."""
from __future__ import annotations

import json

import pytest

from profiler.split import split_logs


def _write(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _rec(wf: str, n: int, t: float | str) -> dict:
    return {"request_id": f"{wf}#{n}", "workflow_type_id": "t", "workflow_id": wf, "agent_id": "a",
            "t_arrival": t, "t_finish": t if isinstance(t, str) else t + 1, "input_tokens": 10,
            "output_tokens": 5}


def _side(path) -> set[str]:
    return {json.loads(line)["workflow_id"] for line in path.read_text().splitlines()}


def test_the_earliest_starting_workflows_are_train_whatever_the_file_order(tmp_path):
    # w3 starts first but its later call is written first; w0 starts last
    recs = [_rec("w3", 1, 500.0), _rec("w0", 0, 400.0), _rec("w1", 0, 100.0), _rec("w2", 0, 200.0),
            _rec("w3", 0, 50.0), _rec("w4", 0, 300.0), _rec("w1", 1, 900.0)]
    counts = split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.6, by="time")
    assert _side(tmp_path / "s" / "train" / "logs.jsonl") == {"w3", "w1", "w2"}   # 3 of 5 by start
    assert _side(tmp_path / "s" / "test" / "logs.jsonl") == {"w4", "w0"}
    assert counts == {"train": 5, "test": 2}          # every call of a workflow on its side


def test_iso_times_order_as_epoch_seconds_do(tmp_path):
    recs = [_rec("late", 0, "2026-01-02T00:00:00Z"), _rec("early", 0, "2026-01-01T00:00:00Z")]
    split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", train=0.5, by="time")
    assert _side(tmp_path / "s" / "train" / "logs.jsonl") == {"early"}


def test_a_workflow_without_a_time_is_refused_in_one_line(tmp_path):
    recs = [_rec("w0", 0, 1.0), {**_rec("w1", 0, 2.0), "t_arrival": None}]
    with pytest.raises(ValueError, match="workflow 'w1' has no readable t_arrival"):
        split_logs([_write(tmp_path / "a.jsonl", recs)], tmp_path / "s", by="time")
    with pytest.raises(ValueError, match="--by 'date'"):
        split_logs([_write(tmp_path / "b.jsonl", recs)], tmp_path / "t", by="date")
