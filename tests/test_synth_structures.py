"""Known automata are learned back: chain, bounded loop, fan-out, optional rework loop."""
from __future__ import annotations

import random

import pytest

from synth.fit import fit_sequences
from synth.pfa import PFA, hoeffding_different, learn_pfa, prune
from synth.regex_synth import RegexMatcher
from synth.sequences import sequences_from_symbols


def sample(make, n: int, seed: int) -> list:
    rng = random.Random(seed)
    return [make(rng) for _ in range(n)]


def chain(rng):
    return ["planner", "coder", "reviewer", "verifier"]


def bounded_loop(rng):
    return ["planner"] + ["engineer"] * rng.randint(3, 6) + ["reviewer"]


def fan_out(rng):
    return ["planner", ["explorer"] * rng.randint(1, 4), "chronicler", "engineer"]


def rework(rng):
    seq = ["planner", "engineer", "reviewer"]
    if rng.random() < 0.3:
        seq += ["engineer", "reviewer"]
    return seq + ["verifier"]


def flatten(items) -> list[str]:
    return [a for item in items for a in ([item] if isinstance(item, str) else item)]


def test_hoeffding_test_separates_only_clear_differences():
    assert hoeffding_different(90, 100, 10, 100, alpha=0.05)
    assert not hoeffding_different(50, 100, 55, 100, alpha=0.05)
    assert not hoeffding_different(1, 0, 5, 10, alpha=0.05)  # no evidence: compatible


def test_chain_is_learned_exactly():
    section = fit_sequences(sequences_from_symbols(sample(chain, 50, 0)))
    assert section["regex"] == "planner coder reviewer verifier"
    assert section["train_acceptance"] == 1.0
    m = RegexMatcher(section["regex"])
    assert m.accepts(["planner", "coder", "reviewer", "verifier"])
    assert not m.accepts(["planner", "reviewer", "verifier"])


def test_bounded_loop_gets_observed_bounds():
    train = sample(bounded_loop, 400, 1)
    section = fit_sequences(sequences_from_symbols(train))
    assert section["regex"] == "planner (engineer){3,6} reviewer"
    m = RegexMatcher(section["regex"])
    for k in range(3, 7):
        assert m.accepts(["planner"] + ["engineer"] * k + ["reviewer"])
    assert not m.accepts(["planner"] + ["engineer"] * 2 + ["reviewer"])
    assert not m.accepts(["planner"] + ["engineer"] * 7 + ["reviewer"])


def test_fan_out_group_keeps_width_and_no_order():
    train = sample(fan_out, 300, 2)
    seqs = sequences_from_symbols(train)
    assert {s.steps[1].width for s in seqs} == {1, 2, 3, 4}
    section = fit_sequences(seqs)
    assert section["regex"] == "planner (explorer){1,4} chronicler engineer"
    assert section["fanout"]["explorer"]["width_range"] == [1, 4]
    m = RegexMatcher(section["regex"])
    assert m.accepts(["planner"] + ["explorer"] * 4 + ["chronicler", "engineer"])
    assert not m.accepts(["planner"] + ["explorer"] * 5 + ["chronicler", "engineer"])


def test_mixed_fan_out_group_accepts_any_member_order():
    rng = random.Random(3)
    train = [["lead", rng.sample(["reader", "reader", "searcher"], 3), "writer"]
             for _ in range(100)]
    section = fit_sequences(sequences_from_symbols(train))
    assert section["regex"] == "lead (reader | searcher){3} writer"
    m = RegexMatcher(section["regex"])
    assert m.accepts(["lead", "searcher", "reader", "reader", "writer"])
    assert m.accepts(["lead", "reader", "searcher", "reader", "writer"])


def test_optional_rework_loop_is_optional():
    train = sample(rework, 400, 4)
    section = fit_sequences(sequences_from_symbols(train))
    m = RegexMatcher(section["regex"])
    assert m.accepts(["planner", "engineer", "reviewer", "verifier"])
    assert m.accepts(["planner", "engineer", "reviewer", "engineer", "reviewer", "verifier"])
    assert not m.accepts(["planner", "engineer", "reviewer", "engineer", "verifier"])
    assert section["train_acceptance"] == 1.0


def test_sampled_language_is_recovered_on_dominant_paths():
    """Every dominant path of the generator is accepted, and nothing outside its language."""
    def program(rng):
        seq = ["planner", ["explorer"] * rng.randint(1, 3)]
        seq += ["engineer"] * rng.randint(2, 4) + ["reviewer"]
        if rng.random() < 0.25:
            seq += ["engineer", "reviewer"]
        return seq + ["verifier"]
    train = sample(program, 600, 5)
    section = fit_sequences(sequences_from_symbols(train))
    m = RegexMatcher(section["regex"])
    dominant = {tuple(flatten(s)) for s in sample(program, 300, 6)}
    assert all(m.accepts(list(s)) for s in dominant)
    outside = [["planner", "engineer", "reviewer", "verifier"],            # no explorer
               ["planner", "explorer", "engineer", "engineer", "verifier"],  # no review
               ["planner", "explorer", "engineer", "engineer", "reviewer"]]  # no verifier
    assert not any(m.accepts(s) for s in outside)


def test_alergia_generalizes_a_geometric_loop():
    rng = random.Random(7)
    train = []
    for _ in range(500):
        k = 1
        while rng.random() < 0.6:
            k += 1
        train.append(["a"] + ["b"] * k + ["c"])
    pta = PFA.prefix_tree(train)
    pfa = learn_pfa(train, alpha=0.05)
    assert len(pfa.states) < len(pta.states) // 3
    # the loop generalizes beyond the longest training sequence
    longest = max(len(s) for s in train)
    assert pfa.accepts(["a"] + ["b"] * (longest + 5) + ["c"])
    assert not pfa.accepts(["a", "c"])


def test_pruning_drops_rare_transitions_and_reports_acceptance():
    rng = random.Random(8)
    train = [["a", "b", "c"] if rng.random() > 0.02 else ["a", "x", "c"] for _ in range(500)]
    pfa = learn_pfa(train)
    assert pfa.accepts(["a", "x", "c"])
    pruned = prune(pfa, 0.05)
    assert not pruned.accepts(["a", "x", "c"])
    assert pruned.prob(pruned.run(["a"]), "b") == pytest.approx(1.0)  # renormalized
    section = fit_sequences(sequences_from_symbols(train), prune=0.05)
    rare = sum(s[1] == "x" for s in train) / len(train)
    assert section["train_acceptance"] == pytest.approx(1 - rare)
    assert fit_sequences(sequences_from_symbols(train), prune=0.0)["train_acceptance"] == 1.0
