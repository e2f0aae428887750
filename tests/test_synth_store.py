"""Sequences from a real DuckDB ``calls`` table, the profile section and the eval extension."""
from __future__ import annotations

import json

import duckdb
import pytest

from synth.profile_section import agent_timings, build_workflows_section, evaluate_workflows
from synth.sequences import NO_TOOL, load_sequence_counts, load_sequences
from synth.session import WorkflowPaths


def make_calls_table(con, rows: list[dict]) -> None:
    """The subset of the store's ``calls`` columns (CONTRACTS §1) that synth reads."""
    con.execute("""
        CREATE TABLE calls (request_id VARCHAR, workflow_type_id VARCHAR, workflow_id VARCHAR,
            agent_id VARCHAR, t_arrival DOUBLE, t_finish DOUBLE, parent_request_ids VARCHAR[],
            tool_names VARCHAR[], latency_s DOUBLE, gap_after_s DOUBLE, messages JSON,
            response_text VARCHAR)""")
    for r in rows:
        con.execute("INSERT INTO calls VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            r["id"], r.get("wt", "app"), r["wf"], r["agent"], r["t0"], r["t1"],
            r.get("parents"), r.get("tools", []), r["t1"] - r["t0"], r.get("gap"),
            json.dumps(r["messages"]) if "messages" in r else None, r.get("response")])


def workflow(wf: str, t: float, n_explorers: int, sibling_only: bool = False) -> list[dict]:
    """planner → n parallel explorers → engineer. With ``sibling_only`` the explorers do not
    overlap in time and are grouped only by their shared parent."""
    rows = [{"id": f"{wf}-p", "wf": wf, "agent": "planner", "t0": t, "t1": t + 1, "gap": 0.5,
             "tools": ["plan_tool"]}]
    for k in range(n_explorers):
        t0 = t + 1.5 + (k * 3.0 if sibling_only else k * 0.01)
        rows.append({"id": f"{wf}-e{k}", "wf": wf, "agent": "explorer", "t0": t0, "t1": t0 + 2,
                     "parents": [f"{wf}-p"], "gap": 0.2})
    t_eng = t + 1.5 + 3.0 * n_explorers + 5
    rows.append({"id": f"{wf}-g", "wf": wf, "agent": "engineer", "t0": t_eng, "t1": t_eng + 3,
                 "parents": [f"{wf}-e{k}" for k in range(n_explorers)]})
    return rows


@pytest.fixture()
def con():
    c = duckdb.connect()
    rows = []
    for i in range(40):
        rows += workflow(f"w{i}", 1000.0 * i, 1 + i % 3, sibling_only=(i % 2 == 1))
    make_calls_table(c, rows)
    yield c
    c.close()


def test_overlap_and_siblings_form_fan_out_groups(con):
    seqs = {s.workflow_id: s for s in load_sequences(con)["app"]}
    overlapping, siblings = seqs["w2"], seqs["w5"]  # 3 explorers each
    for seq in (overlapping, siblings):
        assert seq.step_symbols == ("planner", "explorer", "engineer")
        assert seq.step_widths == (1, 3, 1)
        assert seq.calls == ("planner", "explorer", "explorer", "explorer", "engineer")


def test_tool_alphabet_reads_the_first_tool(con):
    seq = load_sequences(con, "app", alphabet="tool")["app"][0]
    assert seq.calls[0] == "plan_tool" and seq.calls[-1] == NO_TOOL
    with pytest.raises(ValueError, match="alphabet"):
        load_sequences(con, alphabet="agents")


def test_agent_timings_average_latency_and_gap(con):
    timings = agent_timings(con)["app"]
    assert timings["planner"] == pytest.approx((1.0, 0.5))
    assert timings["engineer"] == pytest.approx((3.0, 0.0))  # no gap after the last call


def test_section_builder_and_eval_extension(con):
    sections = build_workflows_section(con, {"prune": 0.05, "seed": 0})
    section = sections["app"]
    json.dumps(sections, allow_nan=False)
    assert section["regex"] == "planner (explorer){1,3} engineer"
    assert section["train_acceptance"] == 1.0
    paths = WorkflowPaths.from_section(section)
    assert paths.estimates(paths.start())["expected_remaining_s"] == pytest.approx(
        1.0 + 0.5 + 2.0 + 0.2 + 3.0)
    result = evaluate_workflows({"workflows": sections}, con)
    assert result["path"] == {"regex_acceptance": 1.0, "pfa_acceptance": 1.0,
                              "session_acceptance": 1.0, "n_workflows": 40}
    assert result["next_agent"]["step_top1_accuracy"] == 1.0
    assert 0.5 < result["next_agent"]["top1_accuracy"] < 1.0  # siblings of random width
    assert result["remaining_calls"]["known_share"] == 1.0
    assert "prompt_composition" not in result  # no text in these logs


def test_eval_counts_unknown_workflow_types_as_misses(con):
    result = evaluate_workflows({"workflows": {}}, con)
    assert result["next_agent"]["top1_accuracy"] == 0.0
    assert result["path"]["regex_acceptance"] == 0.0
    assert result["remaining_calls"]["mae"] is None
    assert result["workflows_by_type"]["app"]["known"] is False


@pytest.mark.slow
def test_profile_fit_and_eval_through_the_cli_layer(fitted_profile, coding_test_logs):
    """The lead's fit registers the section; eval merges our keys (generated coding logs)."""
    from scoring.evaluation import evaluate
    from store.profile_artifact import load_profile

    profile = load_profile(fitted_profile)
    section = profile.data["workflows"]["coding_assistant"]
    assert section["regex"].startswith("planner (explorer){1,4} chronicler architect")
    assert section["train_acceptance"] >= 0.95
    result, _ = evaluate(profile, [coding_test_logs])
    assert result["path"]["regex_acceptance"] >= 0.95
    assert result["path"]["pfa_acceptance"] >= 0.95
    assert result["next_agent"]["top1_accuracy"] > 0.75
    assert result["remaining_calls"]["mae"] < result["remaining_calls"]["baseline_mae"]


# -- set-based sequence building and the training sample ---------------------------------------

def random_workflows(n: int, seed: int) -> list[dict]:
    """Workflows built to hit every corner of fan-out grouping: times on a coarse grid (ties in
    arrival, arrivals exactly at a finish and at finish − tolerance), zero-length calls,
    overlapping and non-overlapping siblings, sibling sets listed in different orders, empty
    parent lists, and a second workflow type."""
    import random

    rng = random.Random(seed)
    rows = []
    for w in range(n):
        wf, t = f"r{w:03d}", 0.0
        earlier: list[str] = []
        for k in range(rng.randint(1, 9)):
            rid = f"{wf}-{k}"
            t += rng.choice([0.0, 0.0005, 0.001, 0.002, 0.5, 1.0, 2.0])
            latency = rng.choice([0.0, 0.001, 0.5, 1.0, 3.0])
            parents = None
            if earlier and rng.random() < 0.6:
                parents = rng.sample(earlier, rng.randint(1, min(2, len(earlier))))
            elif rng.random() < 0.1:
                parents = []
            rows.append({"id": rid, "wt": "app" if w % 4 else "other", "wf": wf,
                         "agent": rng.choice(["a", "b", "c", "Zed", "éclair"]), "t0": t,
                         "t1": t + latency, "parents": parents,
                         "tools": rng.choice([[], ["x"], ["y", "x"], [""]])})
            earlier.append(rid)
    return rows


def python_sequences(rows: list[dict], alphabet: str = "agent") -> dict[str, list]:
    """The reference: per workflow, :func:`build_sequence` (sweep + union-find in Python)."""
    from collections import defaultdict

    from synth.sequences import CallRow, build_sequence

    per_wf = defaultdict(list)
    for r in rows:
        symbol = r["agent"] if alphabet == "agent" else ((r["tools"] or [None])[0] or NO_TOOL)
        per_wf[(r["wt"], r["wf"])].append(
            CallRow(r["id"], symbol, r["t0"], r["t1"], tuple(r["parents"] or ()) or None))
    out = defaultdict(list)
    for (wt, wf), calls in sorted(per_wf.items()):
        out[wt].append(build_sequence(wt, wf, calls))
    return dict(out)


def as_tuples(seqs) -> list[tuple]:
    return [(s.workflow_id, tuple(st.agents for st in s.steps), s.calls, s.request_ids)
            for s in seqs]


@pytest.mark.slow
@pytest.mark.parametrize("alphabet", ["agent", "tool"])
def test_sql_fan_out_groups_equal_the_python_union_find(alphabet):
    rows = random_workflows(300, seed=5)
    c = duckdb.connect()
    make_calls_table(c, rows)
    expected = python_sequences(rows, alphabet)
    got = load_sequences(c, alphabet=alphabet)
    assert got.keys() == expected.keys()
    for wt in expected:
        assert as_tuples(got[wt]) == as_tuples(expected[wt])
    # the corners were hit: fan-out groups, and siblings that do not overlap in time (the
    # workflows SQL hands to the union-find): grouping them needs the parents
    steps = [st for seqs in expected.values() for s in seqs for st in s.steps]
    assert any(st.width > 1 for st in steps)
    overlap_only = python_sequences([dict(r, parents=None) for r in rows], alphabet)
    assert any(len(a.steps) < len(b.steps) for wt in expected
               for a, b in zip(expected[wt], overlap_only[wt]))


@pytest.mark.slow
def test_distinct_sequence_counts_expand_to_the_workflows():
    rows = random_workflows(300, seed=6)
    rows += [dict(r, id=r["id"] + "'", wf=r["wf"] + "'") for r in rows[:200]]  # duplicates
    c = duckdb.connect()
    make_calls_table(c, rows)
    full = load_sequences(c)
    for wt, (seqs, counts) in load_sequence_counts(c).items():
        first_seen: dict = {}
        for s in full[wt]:
            key = (s.steps, s.calls)
            first_seen.setdefault(key, [s.workflow_id, 0])[1] += 1
        assert [((s.steps, s.calls), s.workflow_id, n) for s, n in zip(seqs, counts)] == \
            [(k, wf, n) for k, (wf, n) in first_seen.items()]
        assert sum(counts) == len(full[wt]) and max(counts) > 1


@pytest.mark.slow
def test_fit_with_counts_equals_fit_of_repeated_sequences():
    from synth.fit import fit_sequences

    rows = random_workflows(200, seed=7)
    c = duckdb.connect()
    make_calls_table(c, rows)
    seqs, counts = load_sequence_counts(c)["app"]
    assert len(seqs) < sum(counts)
    weighted = fit_sequences(seqs, counts=counts, prune=0.05)
    repeated = fit_sequences(load_sequences(c)["app"], prune=0.05)
    assert weighted == repeated
    with pytest.raises(ValueError, match="counts"):
        fit_sequences(seqs, counts=counts[:-1])


def test_training_sample_is_seeded_bounded_and_recorded(con):
    """40 workflows of one type: a cap of 10 fits 10 of them (a seeded choice, the same for
    the same seed), and a cap above the count changes nothing."""
    sample = load_sequences(con, max_workflows=10, seed=3)["app"]
    assert len(sample) == 10
    assert [s.workflow_id for s in sample] == sorted(s.workflow_id for s in sample)
    assert as_tuples(load_sequences(con, max_workflows=10, seed=3)["app"]) == as_tuples(sample)
    other = load_sequences(con, max_workflows=10, seed=4)["app"]
    assert {s.workflow_id for s in other} != {s.workflow_id for s in sample}
    everything = {s.workflow_id: s for s in load_sequences(con)["app"]}
    assert all(as_tuples([everything[s.workflow_id]]) == as_tuples([s]) for s in sample)

    capped = build_workflows_section(con, {"prune": 0.05, "seed": 3,
                                           "synth_max_workflows": 10})["app"]
    assert capped["workflows"] == 10
    assert capped["training_sample"] == {"workflows_used": 10, "workflows_total": 40,
                                         "distinct_paths": capped["training_sample"]["distinct_paths"],
                                         "max_workflows": 10, "seed": 3}
    assert capped["training_sample"]["distinct_paths"] <= 10
    whole = build_workflows_section(con, {"prune": 0.05, "seed": 0, "synth_max_workflows": 0})
    roomy = build_workflows_section(con, {"prune": 0.05, "seed": 0,
                                          "synth_max_workflows": 1000})
    assert whole["app"]["training_sample"]["max_workflows"] is None
    for section in (whole["app"], roomy["app"]):
        section.pop("training_sample")
    assert whole == roomy
