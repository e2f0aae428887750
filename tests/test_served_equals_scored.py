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
from scoring.evaluation import evaluate
from fitting.profile_fit import fit_profile
from store.workloads import generate, write_jsonl
from synth.evaluation import served_predictions
from synth.sequences import sequences_from_symbols
from synth.session import WorkflowPaths
from synth.vomm import (NO_TOOL, VariableOrderMarkov, families_of, project, stage_symbol,
                        strip_tool_mark, tool_mark, unmark)

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

def _check_served_call(predictor, meta: dict, rec: dict, at_arrival: dict, after: dict,
                       where: tuple) -> None:
    """The serving Predictor's annotation of ``rec`` equals what eval scored at its arrival,
    and, once its response is fed back, what eval scored after it."""
    ann = predictor.annotate_call(meta, request_id=rec["request_id"],
                                  input_tokens=rec["input_tokens"])
    assert ann.known, ann
    assert [(n.agent_id, n.p) for n in ann.next_agents] == [
        (d["agent_id"], d["p"]) for d in at_arrival["next_agents"]], where
    assert ann.p_end == at_arrival["p_end"]
    assert ann.expected_remaining_calls == at_arrival["expected_remaining_calls"]
    assert ann.remaining_calls_p50 == at_arrival["remaining_calls_p50"]
    predictor.observe({"app_metadata": meta, "request_id": rec["request_id"],
                       "output_tokens": rec["output_tokens"], "tool_names": _tools(rec)})
    later = predictor.annotate_call(meta, advance=False)
    assert [(n.agent_id, n.p) for n in later.next_agents] == [
        (d["agent_id"], d["p"]) for d in after["next_agents"]], where



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
            _check_served_call(predictor, meta, rec, at_arrival, after, (wf, i))
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


# -- the stage label (app_metadata.stage) ------------------------------------------------------

PT = "phased_team"


def _strip_stage(src, dst):
    with open(src) as fin, open(dst, "w") as fout:
        for line in fin:
            rec = json.loads(line)
            rec.pop("stage", None)
            fout.write(json.dumps(rec) + "\n")


@pytest.fixture(scope="module")
def phased(tmp_path_factory):
    """The ChatDev-like phased team: the worker after a CTO call is certain given the CTO
    call's stage and a four-way guess from the agents."""
    root = tmp_path_factory.mktemp("phased")
    write_jsonl(generate("phased_team", 200, seed=0), root / "train.jsonl")
    write_jsonl(generate("phased_team", 60, seed=1), root / "test.jsonl")
    profile, _ = fit_profile([root / "train.jsonl"], root / "profile")
    return profile, root


def test_symbols_read_in_a_context_family():
    full = tool_mark(stage_symbol("cto", "coding"), ["run_tests"])
    assert stage_symbol("cto", None) == stage_symbol("cto", "") == stage_symbol("cto", 3) == "cto"
    assert project(full, "agent") == unmark(full) == "cto"
    assert project(full, "agent_stage") == stage_symbol("cto", "coding") == strip_tool_mark(full)
    assert project(full, "agent_tool") == tool_mark("cto", ["run_tests"])
    assert project(full, "agent_stage_tool") == full
    assert project("cto", "agent_stage_tool") == "cto"           # nothing reported: plain
    assert families_of("agent_tool") == ("agent", "agent_tool")  # as before stages existed
    assert families_of("agent_stage_tool") == ("agent", "agent_tool", "agent_stage",
                                               "agent_stage_tool")


def test_stage_context_is_chosen_and_reaches_the_bayes_bound(phased):
    profile, root = phased
    section = profile.data["workflows"][PT]
    assert section["sequence_model"]["context"] == "agent_stage", section["sequence_model"]["selection"]
    assert section["remaining_model"]["alphabet"] == "agent_stage"
    result, _ = evaluate(profile, [root / "test.jsonl"])
    na, rc = result["next_agent"], result["remaining_calls"]
    # given the stage every next agent is certain: top-1 1.0, log-loss 0 (Bayes bound)
    assert na["top1_accuracy"] == 1.0 and na["log_loss"] < 0.01, na
    assert na["baselines"]["markov_wb"] < 0.75 and na["baselines_log_loss"]["markov_wb"] > 0.5, na
    # the final phase's CTO call says one call is left
    assert rc["mae"] < 0.85 * rc["baselines"]["position_median"], rc


def test_a_log_without_stages_fits_the_agent_model(phased, tmp_path):
    """The same workflows without their stage field: nothing to choose, the agent model."""
    _, root = phased
    _strip_stage(root / "train.jsonl", tmp_path / "train.jsonl")
    profile, _ = fit_profile([tmp_path / "train.jsonl"], tmp_path / "profile")
    section = profile.data["workflows"][PT]
    assert section["sequence_model"]["context"] == "agent"
    assert "alphabet" not in section["remaining_model"]
    assert "alphabet" not in section["remaining_model"]["selection"]
    assert section["remaining_model"]["selection"]["families"] == 13
    assert "stage" not in json.dumps(section["sequence_model"]["vomm"]["contexts"])


def test_eval_per_call_prediction_equals_the_predictor_annotation_with_stage(phased):
    """Each held-out call annotated with its ``app_metadata.stage`` carries exactly the next
    agents, p_end and remaining calls ``profiler eval`` scores for it."""
    profile, root = phased
    predictor = Predictor(profile)
    paths = WorkflowPaths.from_section(profile.data["workflows"][PT])
    checked = 0
    for wf, recs in list(_workflows(root / "test.jsonl").items())[:20]:
        seq = sequences_from_symbols([[r["agent_id"] for r in recs]])[0]
        marks = [tool_mark(stage_symbol(r["agent_id"], r["stage"]), _tools(r)) for r in recs]
        scored = list(served_predictions(paths, seq, marks))
        for rec, (i, _state, _served, at_arrival, after) in zip(recs, scored):
            meta = {"workflow_type_id": PT, "workflow_id": wf, "agent_id": rec["agent_id"],
                    "stage": rec["stage"]}
            _check_served_call(predictor, meta, rec, at_arrival, after, (wf, i))
            checked += 1
    assert checked > 100


def test_a_request_without_its_stage_backs_off_to_the_agents(phased):
    """Without ``app_metadata.stage`` the sequence model reads the plain agents (the agent
    contexts it was also fit on), and so does the stage remaining-work model (its plain-agent
    backoff keys), not the call index alone."""
    profile, _ = phased
    paths = WorkflowPaths.from_section(profile.data["workflows"][PT])
    agents = ("cto", "programmer", "cto")

    def third(stages):
        p = Predictor(profile)
        meta = {"workflow_type_id": PT, "workflow_id": "w"}
        for agent, stage in zip(agents, stages):
            ann = p.annotate({**meta, "agent_id": agent, **({"stage": stage} if stage else {})})
        return ann
    staged = third(("coding", "coding", "testing"))
    plain = third((None, None, None))
    assert staged["next_agents"][0]["agent_id"] == "tester"
    assert staged["next_agents"][0]["p"] > 0.99
    expected = paths.predict(paths.track(agents)[-1], agents)
    assert plain["next_agents"] == [{"agent_id": a["agent_id"], "p": a["p"]}
                                   for a in expected["next_agents"]]
    assert plain["next_agents"][0]["p"] < 0.6
    by_agents, position = paths.remaining.predict(agents, 2), paths.remaining.predict((), 2)
    assert plain["remaining_calls_p50"] == by_agents["p50"]
    assert by_agents["n"] != position["n"]        # a plain-agent context key, not the index
    assert staged["remaining_calls_p50"] == paths.remaining.predict(
        tuple(stage_symbol(a, s) for a, s in zip(agents, ("coding", "coding", "testing"))),
        2)["p50"]
    # the final phase's CTO call: exactly one call left
    final = third(("coding", "coding", "documenting"))
    assert final["next_agents"][0]["agent_id"] == "writer"
    assert final["remaining_calls_p50"] == 1


def test_a_stage_that_says_nothing_is_not_chosen(agent_user, tmp_path):
    """The agent <-> user workload with a random stage on every call: the tool context is
    still chosen (the one-SE rule prefers it to agent + stage + tool mark), remaining work
    stays on the agents, and the held-out scores are those of the profile fit without stages."""
    import random
    profile, root = agent_user
    rng = random.Random(0)
    with open(root / "train.jsonl") as fin, open(tmp_path / "train.jsonl", "w") as fout:
        for line in fin:
            fout.write(json.dumps({**json.loads(line),
                                   "stage": rng.choice(["triage", "resolve"])}) + "\n")
    staged, _ = fit_profile([tmp_path / "train.jsonl"], tmp_path / "profile")
    section = staged.data["workflows"][WT]
    assert section["sequence_model"]["context"] == "agent_tool"
    assert section["remaining_model"]["selection"]["alphabet"] == "agent"
    assert section["remaining_model"]["selection"]["families"] == 25   # stages were offered
    assert section["sequence_model"]["vomm"] == profile.data["workflows"][WT]["sequence_model"]["vomm"]
    with_stage, _ = evaluate(staged, [root / "test.jsonl"])
    without, _ = evaluate(profile, [root / "test.jsonl"])
    assert with_stage["next_agent"] == without["next_agent"]


def test_a_cancelled_call_takes_its_stage_with_it(phased):
    """A call that failed upstream (``cancel``) is undone with its context symbol: the retry
    is annotated as if the failed attempt never happened."""
    profile, _ = phased
    meta = {"workflow_type_id": PT, "workflow_id": "w"}
    calls = [("cto", "coding", "r1"), ("programmer", "coding", "r2")]

    def session(with_failed_attempt: bool):
        p = Predictor(profile)
        for agent, stage, rid in calls:
            p.annotate_call({**meta, "agent_id": agent, "stage": stage}, request_id=rid)
        if with_failed_attempt:
            failed = {**meta, "agent_id": "cto", "stage": "documenting"}
            p.annotate_call(failed, request_id="r3")
            assert p.cancel(failed, "r3")
        return p.annotate_call({**meta, "agent_id": "cto", "stage": "testing"}, request_id="r3b")
    retried, clean = session(True), session(False)
    assert retried.next_agents == clean.next_agents
    assert retried.next_agents[0].agent_id == "tester"
    assert retried.remaining_calls_p50 == clean.remaining_calls_p50
