"""The replay annotates a call with what a client of the gateway sends: its ids and, where the
log records one, its ``stage`` (``app_metadata.stage``); a finished call is observed with the
tools its response called (``tool_names``), as the gateway reads them off the response. A
phased-team log (``profiler generate --workload phased-team``) replays with its stages."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.config import ClusterConfig
from simulator.engine import Simulator
from simulator.ours import build_ours
from simulator.runner import arrival_times, prepare, simulate
from simulator.sources import make_predictor
from store.workloads import generate, load_spec


def replay_of(spec: str, root: Path):
    """A generated log of ``spec`` written to disk and prepared as a log replay (70 % train)."""
    log = root / f"{spec}.jsonl"
    with log.open("w") as f:
        for rec in generate(load_spec(spec), 120, seed=5, with_text=False, arrival_rate=1.0):
            f.write(json.dumps(rec) + "\n")
    cfg = ClusterConfig(replicas=1, kv_capacity_tokens=200_000)
    return prepare(str(log), 12, seed=0, profile_dir=root / "p", cfg=cfg), cfg


def sure(anns: dict) -> float:
    """Mean probability of the most likely next agent over the annotations."""
    tops = [max((x["p"] for x in d.get("next_agents") or []), default=0.0) for d in anns.values()]
    return sum(tops) / len(tops)


@pytest.fixture(scope="module")
def phased(tmp_path_factory):
    return replay_of("phased_team", tmp_path_factory.mktemp("phased"))


def recorded_stage(prep, request_id: str) -> str | None:
    """The stage the log records for a replayed call (a replicated session's ids carry ``~k``)."""
    stages = {r["request_id"]: r.get("stage") for r in prep.source.test}
    return stages[request_id.rsplit("~", 1)[0]]


def test_replay_sends_each_calls_recorded_stage(phased):
    prep, cfg = phased
    assert all(r.get("stage") for r in prep.source.test)   # every phased-team call has one
    res, _ = simulate(prep, "ours", cfg, arrival_times(prep.workload, 0.05, 0))
    sent = {r.call.request_id: r.pred.meta.get("stage") for r in res.requests}
    assert len(sent) == prep.workload.n_calls and len(set(sent.values())) > 1
    assert all(stage == recorded_stage(prep, rid) for rid, stage in sent.items())


def test_the_stage_changes_what_the_predictor_says(phased):
    """Stripped of its stages the same replay gets other annotations: the stage reached the
    model (the phased team's next worker is certain given the chair call's stage)."""
    prep, cfg = phased
    arr = arrival_times(prep.workload, 0.05, 0)
    with_stage, _ = simulate(prep, "ours", cfg, arr)
    for c in prep.workload.calls:
        c.stage = None
    try:
        without, _ = simulate(prep, "ours", cfg, arr)
    finally:
        for c in prep.workload.calls:
            c.stage = recorded_stage(prep, c.request_id)
    assert all("stage" not in r.pred.meta for r in without.requests)
    a = {r.call.request_id: r.pred.ann.to_dict() for r in with_stage.requests}
    b = {r.call.request_id: r.pred.ann.to_dict() for r in without.requests}
    assert sum(a[k] != b[k] for k in a) > len(a) // 10
    assert sure(a) > sure(b) + 0.1


def test_finished_calls_report_the_tools_their_response_called(tmp_path):
    """Agent <-> user simulator (tool calls decide who speaks next): every finished call is
    observed with the names of the tools its response called ([] for none), the shape the
    gateway passes (``serving_hooks.gateway``: ``tool_names`` read off the response)."""
    prep, cfg = replay_of("agent_user", tmp_path)
    predictor = make_predictor(prep.profile)
    seen: list[dict] = []
    observe = predictor.observe

    def recording(completion):
        seen.append(completion)
        return observe(completion)
    predictor.observe = recording
    Simulator(prep.workload, build_ours(predictor), cfg, arrival_times(prep.workload, 0.05, 0)).run()
    tools = {c.request_id: list(c.tools) for c in prep.workload.calls}
    assert len(seen) == prep.workload.n_calls
    assert all(c["tool_names"] == tools[c["request_id"]] for c in seen)
    assert any(c["tool_names"] for c in seen) and any(not c["tool_names"] for c in seen)
