"""Served = scored: ``profiler eval``'s per-call predictions are the Predictor's annotations.

The agent <-> user-simulator workload (``profiler generate --workload agent_user``) makes the
call after an agent call depend on whether the agent's response called a tool; the sequence
model reads that mark once the response is observed (issue 26).
"""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from predictors.predictor import Predictor
from profiler.evaluation import evaluate
from fitting.profile_fit import fit_profile
from store.workloads import generate, write_jsonl
from synth.evaluation import served_predictions
from synth.sequences import sequences_from_symbols
from synth.session import WorkflowPaths
from synth.vomm import NO_TOOL, VariableOrderMarkov, tool_mark

WT = "airline_support"


def _workflows(path):
    """workflow id -> its records in arrival order."""
    by_wf = defaultdict(list)
    for line in open(path):
        rec = json.loads(line)
        by_wf[rec["workflow_id"]].append(rec)
    return {wf: sorted(recs, key=lambda r: (r["t_arrival"], r["request_id"]))
            for wf, recs in sorted(by_wf.items())}


def _tools(rec):
    return [t["name"] for t in rec.get("tool_calls") or []]


@pytest.fixture(scope="module")
def agent_user(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent_user")
    write_jsonl(generate("agent_user", 160, seed=0), root / "train.jsonl")
    write_jsonl(generate("agent_user", 40, seed=1), root / "test.jsonl")
    profile, _ = fit_profile([root / "train.jsonl"], root / "profile")
    return profile, root


def test_tool_context_is_chosen_and_reaches_the_bayes_bound(agent_user):
    profile, root = agent_user
    model = profile.data["workflows"][WT]["sequence_model"]
    assert model["context"] == "agent_tool", model["selection"]
    result, _ = evaluate(profile, [root / "test.jsonl"])
    na = result["next_agent"]
    # once the agent's response is known the next call is certain (Bayes bound 1.0);
    # at its arrival it is not, and agent names alone cannot do better than Markov
    assert na["top1_after_response"] == 1.0, na
    assert na["log_loss_after_response"] < 0.5 * na["baselines_log_loss"]["markov1"], na
    assert na["top1_accuracy"] < 0.95


def test_eval_per_call_prediction_equals_the_predictor_annotation(agent_user):
    """For every held-out call: the annotation at its arrival and the one after its response
    (``annotate(advance=False)`` once ``observe`` reported its tool names) carry exactly the
    next agents and remaining calls that ``profiler eval`` scores for that call."""
    profile, root = agent_user
    predictor = Predictor(profile)
    paths = WorkflowPaths.from_section(profile.data["workflows"][WT])
    checked = 0
    for wf, recs in list(_workflows(root / "test.jsonl").items())[:15]:
        seq = sequences_from_symbols([[r["agent_id"] for r in recs]])[0]
        marks = [tool_mark(r["agent_id"], _tools(r)) for r in recs]
        tools = [(_tools(r) or [NO_TOOL])[0] for r in recs]
        scored = list(served_predictions(paths, seq, marks, tools))
        for rec, (i, _state, _served, at_arrival, after) in zip(recs, scored):
            meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": rec["agent_id"]}
            ann = predictor.annotate_call(meta, request_id=rec["request_id"],
                                          input_tokens=rec["input_tokens"])
            assert ann.known, ann
            assert [(n.agent_id, n.p) for n in ann.next_agents] == [
                (d["agent_id"], d["p"]) for d in at_arrival["next_agents"]], (wf, i)
            assert ann.p_end == at_arrival["p_end"]
            assert ann.expected_remaining_calls == at_arrival["expected_remaining_calls"]
            assert ann.remaining_calls_p50 == at_arrival["remaining_calls_p50"]
            predictor.observe({"app_metadata": meta, "request_id": rec["request_id"],
                               "output_tokens": rec["output_tokens"],
                               "tool_names": _tools(rec)})
            later = predictor.annotate_call(meta, advance=False)
            assert [(n.agent_id, n.p) for n in later.next_agents] == [
                (d["agent_id"], d["p"]) for d in after["next_agents"]], (wf, i)
            checked += 1
    assert checked > 50


def test_tool_names_in_app_metadata_mark_the_previous_call(agent_user):
    """A caller without observe can pass the previous response's tool names with the next
    call: the same annotation as when observe reported them."""
    profile, _ = agent_user

    def third_call(report: str) -> dict:
        p = Predictor(profile)
        meta = {"workflow_type_id": WT, "workflow_id": "m1"}
        p.annotate({**meta, "agent_id": "user"})
        p.annotate({**meta, "agent_id": "agent"})
        extra = {}
        if report == "observe":
            p.observe({"app_metadata": {**meta, "agent_id": "agent"}, "output_tokens": 10,
                       "tool_names": ["book_reservation"]})
        elif report == "metadata":
            extra = {"tool_names": ["book_reservation"]}
        return p.annotate({**meta, "agent_id": "agent", **extra})
    by_observe, by_metadata, unreported = (third_call(r) for r in ("observe", "metadata", ""))
    assert by_metadata["next_agents"] == by_observe["next_agents"]
    assert by_metadata["next_agents"] != unreported["next_agents"]


def test_sparse_context_backs_off_to_a_shorter_one():
    # "a b" is followed by "x" 50 times; the long context "c a b" once by "y"
    seqs = [("a", "b", "x")] * 50 + [("c", "a", "b", "y")]
    vomm = VariableOrderMarkov(max_order=3).fit(seqs)
    dense = vomm.distribution(("c", "a", "b"))
    assert dense["y"] > dense["x"]  # the one observation of the long context dominates
    sparse = VariableOrderMarkov(max_order=3, min_context=3).fit(seqs).distribution(("c", "a", "b"))
    assert sparse["x"] > 0.9  # skipped: backs off to "a b"


def test_a_tool_model_fit_on_each_calls_own_tool_is_served_as_the_position_median():
    """Profiles fit before the tool context was aligned with serving (no ``tool_context``)
    read call i's own tool, unknown at its annotation: they get no tools, as served before."""
    from synth.fit import fit_sequences
    from synth.remaining import RemainingWork
    agents = sequences_from_symbols([["main"] * 9] * 12 + [["main"] * 6] * 8)
    tools = [("find",) * 6 + ("edit",) * 3] * 12 + [("find",) * 3 + ("edit",) * 3] * 8
    section = fit_sequences(agents)
    rm = RemainingWork(order=1, position="none", min_n=1).fit(tools)
    history, seen = ["main"] * 4, ["find", "find", "find", "edit"]
    results = {}
    for context in (None, "previous"):
        section["remaining_model"] = {**rm.to_dict(), "alphabet": "tool",
                                      **({"tool_context": context} if context else {})}
        paths = WorkflowPaths.from_section(section)
        results[context] = (paths.predict(None, history, seen)["remaining_calls_p50"],
                            paths.predict(None, history)["remaining_calls_p50"])
    with_tools, without = results[None]
    assert with_tools == without            # old alignment: the position median
    assert results["previous"][0] != results["previous"][1]   # aligned: the tools are read
