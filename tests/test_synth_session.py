"""WorkflowPaths (CONTRACTS §6): tracking, absorbing-chain estimates, projections."""
from __future__ import annotations

import json
import random

import numpy as np
import pytest

from synth.fit import fit_sequences
from synth.sequences import sequences_from_symbols
from synth.session import WorkflowPaths

TIMINGS = {"planner": (2.0, 1.0), "coder": (4.0, 3.0), "reviewer": (1.0, 0.5),
           "explorer": (1.5, 0.5), "engineer": (3.0, 1.0)}


def paths_of(train, timings=TIMINGS) -> WorkflowPaths:
    section = fit_sequences(sequences_from_symbols(train), timings)
    # the section survives a strict JSON round trip (no NaN, no tuples as keys)
    return WorkflowPaths.from_section(json.loads(json.dumps(section, allow_nan=False)))


def coder_loops(seed: int, n: int, p_again: float) -> list[list[str]]:
    """planner, then coder repeated geometrically (another coder with ``p_again``), reviewer."""
    rng = random.Random(seed)
    train = []
    for _ in range(n):
        seq = ["planner", "coder"]
        while rng.random() < p_again:
            seq.append("coder")
        train.append(seq + ["reviewer"])
    return train


def test_deterministic_chain_estimates_are_exact():
    paths = paths_of([["planner", "coder", "reviewer"]] * 20)
    s0 = paths.start()
    est = paths.estimates(s0)
    assert est["next_agents"] == [{"agent_id": "planner", "p": 1.0}]
    assert est["expected_remaining_calls"] == pytest.approx(3.0)
    # whole workflow: planner 2+1, coder 4+3, reviewer 1 (no tool time after the last call)
    assert est["expected_remaining_s"] == pytest.approx(11.0)
    assert est["expected_distance"] == {"planner": 1.0, "coder": 2.0, "reviewer": 3.0}
    s1 = paths.advance(s0, "planner")
    est = paths.estimates(s1)
    assert est["expected_remaining_calls"] == pytest.approx(2.0)
    assert est["expected_remaining_s"] == pytest.approx(11.0)  # from this call's arrival
    assert est["expected_distance"] == {"coder": 1.0, "reviewer": 2.0}
    s3 = paths.advance(paths.advance(s1, "coder"), "reviewer")
    assert paths.estimates(s3)["p_end"] == 1.0
    assert paths.estimates(s3)["expected_remaining_calls"] == 0.0
    assert paths.estimates(s3)["next_agents"] == []


def test_leaving_the_automaton_gives_none_not_an_exception():
    paths = paths_of([["planner", "coder", "reviewer"]] * 20)
    s1 = paths.advance(paths.start(), "planner")
    assert paths.advance(s1, "reviewer") is None
    assert paths.advance(s1, "unknown-agent") is None
    assert paths.advance(None, "coder") is None
    assert paths.advance(10**6, "coder") is None


def test_geometric_loop_remaining_calls_match_the_fundamental_matrix():
    paths = paths_of(coder_loops(0, 3000, 0.5))
    s = paths.advance(paths.advance(paths.start(), "planner"), "coder")
    est = paths.estimates(s)
    # after a coder call: geometric number of further coders (mean 1) plus the reviewer
    assert est["expected_remaining_calls"] == pytest.approx(2.0, abs=0.25)
    assert est["expected_distance"]["reviewer"] == pytest.approx(2.0, abs=0.25)
    probs = {n["agent_id"]: n["p"] for n in est["next_agents"]}
    assert probs["coder"] == pytest.approx(0.5, abs=0.05)
    assert [n["p"] for n in est["next_agents"]] == sorted(probs.values(), reverse=True)


def test_fan_out_siblings_are_tracked_inside_the_group():
    rng = random.Random(1)
    train = [["planner", ["explorer"] * rng.randint(1, 4), "engineer"] for _ in range(400)]
    paths = paths_of(train)
    states = paths.track(["planner", "explorer", "explorer", "explorer", "explorer", "engineer"])
    assert None not in states
    assert paths.estimates(states[-1])["p_end"] == 1.0
    # after four explorers the group is complete: the engineer is certain
    after4 = paths.estimates(states[4])["next_agents"]
    assert after4 == [{"agent_id": "engineer", "p": 1.0}]
    # after the first explorer: another sibling with P(width > 1) ≈ 3/4
    after1 = {n["agent_id"]: n["p"] for n in paths.estimates(states[1])["next_agents"]}
    assert after1["explorer"] == pytest.approx(0.75, abs=0.06)
    # a fan-out group costs one call's time, not one per sibling
    start_s = paths.estimates(paths.start())["expected_remaining_s"]
    assert start_s == pytest.approx(2.0 + 1.0 + 1.5 + 0.5 + 3.0)
    assert paths.track(["planner"] + ["explorer"] * 5 + ["engineer"])[5] is None


def test_project_calls_sums_expected_calls_over_live_sessions():
    paths = paths_of([["planner", "coder", "reviewer"]] * 20)
    s0 = paths.start()
    s1 = paths.advance(s0, "planner")
    one = paths.project_calls([s0, s1, None], horizon=1)
    assert one == pytest.approx({"planner": 1.0, "coder": 1.0, "reviewer": 0.0})
    many = paths.project_calls([s0, s1], horizon=10)
    assert many == pytest.approx({"planner": 1.0, "coder": 2.0, "reviewer": 2.0})
    remaining = [paths.estimates(s)["expected_remaining_calls"] for s in (s0, s1)]
    assert sum(many.values()) == pytest.approx(sum(remaining))
    assert paths.project_calls([], 5) == {"coder": 0.0, "planner": 0.0, "reviewer": 0.0}


def test_estimates_are_precomputed_for_every_reachable_state():
    rng = random.Random(2)
    train = [["planner", ["explorer"] * rng.randint(1, 3)] + ["engineer"] * rng.randint(2, 4)
             + ["reviewer"] for _ in range(300)]
    section = fit_sequences(sequences_from_symbols(train), TIMINGS)
    paths = WorkflowPaths.from_section(section)
    table = section["session"]
    assert len(table["next"]) == len(table["estimates"]) == section["states"]["session"]
    for nxt in table["next"]:
        for target in nxt.values():
            est = paths.estimates(target)
            assert set(est) >= {"next_agents", "expected_remaining_calls", "expected_remaining_s",
                                "expected_distance"}
            assert np.isfinite(est["expected_remaining_calls"])
            assert sum(n["p"] for n in est["next_agents"]) + est["p_end"] == pytest.approx(1.0)
    assert paths.regex.startswith("planner (explorer){1,3}")


def test_counting_automaton_uses_the_empirical_loop_hazard_and_falls_back_beyond_bounds():
    rng = random.Random(3)
    lengths = [rng.randint(5, 15) for _ in range(400)]
    train = [["planner"] + ["coder"] * n + ["reviewer"] for n in lengths]
    section = fit_sequences(sequences_from_symbols(train), TIMINGS, alpha=0.01)
    assert section["regex"] == "planner (coder){5,15} reviewer"
    assert section["states"]["counting"] > section["states"]["pruned"]  # counts loop rounds
    paths = WorkflowPaths.from_section(section)
    states = paths.track(["planner"] + ["coder"] * 15)
    for k in (5, 10, 14):
        # calls still to come after k coders: E[n - k | n >= k] coders + the reviewer
        expected = np.mean([n - k for n in lengths if n >= k]) + 1
        assert paths.estimates(states[k])["expected_remaining_calls"] == pytest.approx(
            expected, abs=0.3)
    assert paths.estimates(states[15])["next_agents"][0]["agent_id"] == "reviewer"
    assert PFA_has_loop(section)  # alpha=0.01 merged the coder states into one loop ...
    # ... so beyond the regex bound the session continues on the (memoryless) PFA
    longer = paths.track(["planner"] + ["coder"] * 20 + ["reviewer"])
    assert None not in longer and paths.is_accepting(longer[-1])


def PFA_has_loop(section) -> bool:
    from synth.pfa import PFA
    pfa = PFA.from_dict(section["pfa"])
    return any(t == q for q in pfa.states for t in pfa.trans[q].values())


def test_fallback_keeps_sessions_known_on_the_pruned_automaton():
    section = fit_sequences(sequences_from_symbols(coder_loops(4, 600, 0.7)), TIMINGS)
    assert "(coder)*" not in section["regex"]  # the regex is bounded ...
    paths = WorkflowPaths.from_section(section)
    very_long = ["planner"] + ["coder"] * 60 + ["reviewer"]
    assert not paths.regex_accepts(very_long)
    states = paths.track(very_long)  # ... but the session stays on the pruned PFA's loop
    assert None not in states and paths.is_accepting(states[-1])
    assert paths.estimates(states[40])["expected_remaining_calls"] == pytest.approx(
        1 / 0.3, abs=0.6)  # memoryless: geometric coders (mean 0.7/0.3) + the reviewer
