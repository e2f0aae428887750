"""Variable-order sequence model, remaining work, their CV choice and the eval baselines."""
from __future__ import annotations

import json

import numpy as np
import pytest

from synth.fit import fit_sequences
from synth.markov_baselines import BaselinePredictor, fit_baselines
from synth.remaining import RemainingWork, weighted_quantiles
from synth.sequence_select import fold_counts, select_models
from synth.sequences import sequences_from_symbols
from synth.session import WorkflowPaths
from synth.evaluation import score_sequences
from synth.vomm import END, START, VariableOrderMarkov


def test_witten_bell_by_hand():
    # one sequence "a b": contexts () -> {a:1, b:1, $:1}; (^,) -> {a:1}; (a,) -> {b:1};
    # (b,) -> {$:1}. Vocab [a, b, $] plus the novel-symbol slot: uniform 1/4.
    m = VariableOrderMarkov(max_order=1).fit([["a", "b"]])
    assert m.vocab_ == ["a", "b", END]
    # order 0: (c(y) + T·1/4) / (c + T) with c = 3, T = 3 -> (1 + 3/4) / 6 = 7/24 each, novel 1/8
    # after "a": (c(a,y) + T·P0(y)) / (c + T) with c = 1, T = 1 -> b: (1 + 7/24) / 2 = 31/48
    p = m.distribution(["a"])
    assert p["b"] == pytest.approx(31 / 48) and p["a"] == pytest.approx(7 / 48)
    assert p[END] == pytest.approx(7 / 48)
    assert m.novel_probability(["a"]) == pytest.approx(1 / 16)  # an agent never seen: > 0
    # after "b" END is the likely next symbol: p_end predicted
    assert max(m.distribution(["b"]).items(), key=lambda kv: kv[1])[0] == END


@pytest.mark.parametrize("escape", [0.5, 1.0, 2.0])
def test_backoff_probabilities_sum_to_one_for_any_history(escape):
    seqs = [list("abcabd"), list("abd"), list("ccab"), list("a")]
    m = VariableOrderMarkov(max_order=3, escape=escape).fit(seqs, [3, 1, 2, 1])
    for history in ([], ["a"], list("abca"), ["zzz"], list("cccccccc")):
        for level in m.levels(history):
            assert 0.5 < level.sum() < 1.0  # the rest: the novel-symbol slot
            assert (level > 0).all()  # unseen symbols keep escape mass
        assert m.predict_proba(history).sum() + m.novel_probability(history) == pytest.approx(1.0)
        assert 0 < m.novel_probability(history) < 0.5


def test_level_grid_is_levels_for_every_escape_and_floor_to_the_bit():
    """The selection scores the whole (min_context, escape) grid with one pass per history;
    each vector must be the one levels() gives that pair, bit for bit (same profile)."""
    rng = np.random.default_rng(3)
    seqs = [tuple(rng.choice(list("abcd"), size=rng.integers(1, 12))) for _ in range(60)]
    model = VariableOrderMarkov(max_order=8).fit(seqs, rng.integers(1, 5, size=len(seqs)).tolist())
    escapes, floors = (0.5, 1.0, 2.0), (1.0, 3.0, 10.0)
    for history in [(), ("a",), ("z", "a"), seqs[0], seqs[1][:3], ("b",) * 10]:
        grid = model.level_grid(history, 8, escapes, floors)
        for f, floor in enumerate(floors):
            for e, escape in enumerate(escapes):
                levels = list(model.levels(history, max_order=8, escape=escape, min_context=floor))
                assert len(levels) == grid.shape[2]
                for k, p in enumerate(levels):
                    assert np.array_equal(grid[f, e, k], p), (history, floor, escape, k)


def test_longer_context_wins_when_it_matters_and_serialization_round_trips():
    # after "x" comes "y" in one context and "z" in another: only order 2 tells them apart
    seqs = [["a", "x", "y"]] * 5 + [["b", "x", "z"]] * 5
    m1 = VariableOrderMarkov(max_order=1).fit(seqs)
    m2 = VariableOrderMarkov(max_order=2).fit(seqs)
    assert m1.distribution(["a", "x"])["y"] == pytest.approx(m1.distribution(["b", "x"])["y"])
    assert m2.distribution(["a", "x"])["y"] > 0.8 and m2.distribution(["b", "x"])["z"] > 0.8
    back = VariableOrderMarkov.from_dict(json.loads(json.dumps(m2.to_dict())))
    np.testing.assert_allclose(back.predict_proba(["b", "x"]), m2.predict_proba(["b", "x"]))


def test_pruning_bounds_the_table():
    rng = np.random.default_rng(0)
    seqs = [list(rng.choice(list("abcdefgh"), size=12)) for _ in range(200)]
    m = VariableOrderMarkov(max_order=8, max_contexts=500).fit(seqs)
    assert len(m.contexts_) <= 500 and m.min_count_ > 1
    assert m.predict_proba(seqs[0][:5]).sum() + m.novel_probability(seqs[0][:5]) == pytest.approx(1.0)


def test_remaining_work_quantiles_and_backoff():
    # "a" then 1 or 3 more calls; "b" then always 0
    seqs = [["a", "x"], ["a", "x", "x", "x"], ["a", "x", "x", "x"], ["b"]]
    rw = RemainingWork(order=1, position="none", min_n=1).fit(seqs)
    after_a = rw.predict(["a"], 0)
    assert after_a["p50"] == 3 and after_a["p90"] == 3 and after_a["mean"] == pytest.approx(7 / 3, abs=1e-4)
    assert rw.predict(["b"], 0)["p50"] == 0
    # an unseen context backs off to the position (first call: remaining 1, 3, 3, 0 -> 3)
    assert rw.predict(["never"], 0)["p50"] == weighted_quantiles(
        np.array([1, 3, 3, 0.0]), np.ones(4), (0.5,))[0]
    back = RemainingWork.from_dict(json.loads(json.dumps(rw.to_dict())))
    assert back.predict(["a"], 0) == after_a


def test_remaining_work_table_is_the_per_key_rows_statistics_to_the_bit():
    """fit groups every call's rows by key with one stable sort; each key's statistics must be
    those of its rows listed in call order (the plain per-key loop), bit for bit."""
    from collections import defaultdict

    from synth.remaining import remaining_rows
    rng = np.random.default_rng(5)
    seqs = [list(rng.choice(list("abc"), size=rng.integers(1, 15))) for _ in range(80)]
    weights = rng.uniform(0.2, 3.0, size=len(seqs)).tolist()
    timings = {"a": (0.31, 1.7), "b": (2.2, 0.05), "c": (0.9, 12.5)}
    for position, min_n in (("bucket", 3), ("none", 1), ("index", 10)):
        model = RemainingWork(order=4, position=position, min_n=min_n).fit(seqs, weights, timings)
        groups = defaultdict(list)
        for seq, i, r, r_s, w in remaining_rows(seqs, weights, timings):
            for key in model.keys(seq[:i + 1], i):
                groups[key].append((r, r_s, w))
        expected = {}
        for key, rows in groups.items():
            arr = np.asarray(rows, dtype=float)
            n = arr[:, 2].sum()
            if n < min_n and not key.startswith("|"):
                continue
            p50, p90 = weighted_quantiles(arr[:, 0], arr[:, 2], (0.5, 0.9))
            expected[key] = [round(float(n), 3), p50, p90,
                             round(float(np.average(arr[:, 0], weights=arr[:, 2])), 4),
                             round(float(np.average(arr[:, 1], weights=arr[:, 2])), 4)]
        assert list(model.table_) == list(expected)
        assert model.table_ == expected
        assert len(expected) > 20


def test_fold_counts_keep_every_workflow_once():
    split = fold_counts([5, 1, 3], folds=3, seed=1)
    assert split.sum(axis=1).tolist() == [5, 1, 3]
    assert sorted(split.sum(axis=0).tolist()) == [3, 3, 3]


def test_validation_picks_the_order_the_data_needs():
    # the agent after "x" depends on the agent two calls back: order >= 2 wins by log-loss
    seqs = [("a", "x", "y"), ("b", "x", "z")]
    chosen = select_models(seqs, [30, 30], folds=3)
    assert chosen["next"]["max_order"] >= 2
    # first-order data: a memoryless alternation; every order predicts it, the log-loss
    # of order 1 is already optimal, and remaining calls follow the position exactly
    chosen = select_models([("a", "b", "a", "b")], [40], folds=3)
    assert chosen["remaining"]["validation_mae"] == 0.0


def _section(symbol_lists, counts=None):
    seqs = sequences_from_symbols(symbol_lists)
    return fit_sequences(seqs, counts=counts), seqs


def test_a_session_off_the_automaton_still_gets_predictions():
    main = [["planner", "coder", "reviewer"]] * 40
    rare = [["planner", "reviewer", "coder", "reviewer"]]  # pruned at 5 %
    section, _ = _section(main + rare)
    paths = WorkflowPaths.from_section(section)
    states = paths.track(["planner", "reviewer", "coder"])
    assert states[-1] is None  # left the pruned automaton
    est = paths.predict(states[-1], ["planner", "reviewer", "coder"])
    assert est["on_path"] is False
    assert est["next_agents"][0]["agent_id"] == "reviewer"
    assert 0.0 <= est["p_end"] < 1.0 and est["remaining_calls_p50"] >= 0
    # on the automaton END is predicted after the reviewer
    on = paths.predict(paths.track(["planner", "coder", "reviewer"])[-1],
                       ["planner", "coder", "reviewer"])
    assert on["on_path"] is True and on["p_end"] > 0.5


def test_eval_scores_every_call_beside_the_baselines():
    train = [["p", "c", "r"]] * 30 + [["p", "c", "c", "r"]] * 10 + [["p", "r", "c", "r"]]
    section, _ = _section(train)
    test = sequences_from_symbols([["p", "r", "c", "r"], ["p", "c", "r"], ["p", "c", "c", "r"]])
    out = score_sequences(section, test).summary()
    na, rc = out["next_agent"], out["remaining_calls"]
    assert na["scored_share"] == 1.0 and rc["scored_share"] == 1.0
    assert set(na["baselines"]) == {"markov1", "markov_vo", "markov_wb"}
    assert set(na["baselines_log_loss"]) == {"markov1", "markov_vo", "markov_wb"}
    assert all(0 < v < 14 for v in na["baselines_log_loss"].values())
    assert na["log_loss"] > 0 and na["top1_accuracy"] >= na["baselines"]["markov1"]
    assert rc["mae"] is not None and "position_median" in rc["baselines"]


def test_baselines_by_hand():
    block = fit_baselines([("a", "b", "c"), ("a", "b", "d"), ("a", "b", "d")], [1, 1, 1])
    base = BaselinePredictor(json.loads(json.dumps(block)))
    assert base.markov1(["a", "b"]) == "d" and base.markov1([]) == "a"
    assert base.markov_vo(["a", "b"]) == "d" and base.markov_vo(["q"]) is not None
    assert [base.position_median(i) for i in range(4)] == [2.0, 1.0, 0.0, 0.0]
    # log-loss probabilities: add-one over the 4 training agents a, b, c, d and END
    assert base.markov1_probability(["a", "b"], "d") == pytest.approx((2 + 1) / (3 + 5))
    assert base.markov_vo_probability(["a", "b"], "c") == pytest.approx((1 + 1) / (3 + 5))
    assert base.markov_vo_probability(["a", "b"], "new") == pytest.approx(1 / (3 + 6))
    assert base.markov1_probability(["a", "b", "d"], "a") == pytest.approx(1 / (2 + 5))  # d -> END twice
    old = {**block, "markov_vo": {k: v for k, v in block["markov_vo"].items() if k != "counts"}}
    assert BaselinePredictor(old).markov_vo_probability(["a"], "b") is None  # older profile
    assert BaselinePredictor(old).markov_wb_probability(["a"], "b") is None


def test_witten_bell_baseline_by_hand():
    # contexts of (^ a b c $), (^ a b d $) x2: "" -> a3 b3 c1 d2 $3 (12 events, 5 distinct),
    # (b), (a b) and (^ a b) -> c1 d2 (3, 2 distinct); base: uniform over a b c d $ + unseen = 1/6
    block = fit_baselines([("a", "b", "c"), ("a", "b", "d"), ("a", "b", "d")], [1, 1, 1])
    base = BaselinePredictor(json.loads(json.dumps(block)))
    p = (2 + 5 / 6) / (12 + 5)
    for _ in range(3):
        p = (2 + 2 * p) / (3 + 2)
    assert base.markov_wb_probability(["a", "b"], "d") == pytest.approx(p)
    dist = base.markov_wb_distribution(["a", "b"])
    assert sum(dist.values()) == pytest.approx(1.0)
    assert base.markov_wb(["a", "b"]) == "d"
    # a never-seen agent gets only the smoothed unseen mass, never zero
    assert 0 < base.markov_wb_probability(["a", "b"], "new") < 1 / 6
    # sharper than add-one where the context has evidence
    assert base.markov_wb_probability(["a", "b"], "d") > base.markov_vo_probability(["a", "b"], "d")


def test_section_survives_json_and_records_the_choice():
    section, _ = _section([["p", "c", "r"]] * 20 + [["p", "c", "c", "r"]] * 10)
    back = WorkflowPaths.from_section(json.loads(json.dumps(section)))
    paths = WorkflowPaths.from_section(section)
    history = ["p", "c", "c"]
    assert back.predict(None, history) == paths.predict(None, history)
    sel = section["sequence_model"]["selection"]
    assert sel["max_order"] in (1, 2, 3, 4, 6, 8) and 0.0 <= section["sequence_model"]["mixture"] <= 1
    assert section["remaining_model"]["selection"]["position_median_mae"] >= \
        section["remaining_model"]["selection"]["validation_mae"]


def _single_agent_logs(path, n_workflows, seed):
    """One agent; tool "find" until the last 5 calls, which run "edit": the tool names tell how
    many calls are left, the agent sequence only the call index."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for w in range(n_workflows):
            n = int(rng.integers(8, 40))
            t = 1000.0 * w
            for i in range(n):
                tool = "edit" if i >= n - 5 else "find"
                f.write(json.dumps({
                    "request_id": f"w{seed}-{w}#{i}", "workflow_type_id": "solo",
                    "workflow_id": f"w{seed}-{w}", "agent_id": "main", "t_arrival": t,
                    "t_finish": t + 1.0, "input_tokens": 100, "output_tokens": 50,
                    "tool_calls": [{"name": tool, "t_start": t + 1.0, "t_end": t + 1.5, "status": "ok"}]}) + "\n")
                t += 2.0


@pytest.mark.slow
def test_single_agent_type_uses_tool_names_for_remaining_work(tmp_path):
    from profiler.evaluation import evaluate
    from fitting.profile_fit import fit_profile
    _single_agent_logs(tmp_path / "train.jsonl", 120, 0)
    _single_agent_logs(tmp_path / "test.jsonl", 60, 1)
    profile, _ = fit_profile([tmp_path / "train.jsonl"], tmp_path / "p")
    rm = profile.data["workflows"]["solo"]["remaining_model"]
    assert rm["alphabet"] == "tool" and rm["selection"]["tool_alphabet"]["chosen"] is True
    result, _ = evaluate(profile, [tmp_path / "test.jsonl"])
    rc = result["remaining_calls"]
    assert rc["scored_share"] == 1.0
    assert rc["mae"] < 0.8 * rc["baselines"]["position_median"], rc
    # serving without the tool history backs off to the call index (never fails)
    paths = WorkflowPaths.from_section(profile.data["workflows"]["solo"])
    # the tool context of call 12 is the tools of the 11 calls before it (what a session
    # knows when call 12 is annotated): the first "edit" at call 11 says 5 calls in all remain
    with_tools = paths.predict(None, ["main"] * 12, [START] + ["find"] * 10 + ["edit"])
    without = paths.predict(None, ["main"] * 12)
    assert with_tools["remaining_calls_p50"] == 3 and without["remaining_calls_p50"] is not None


def test_remaining_selection_uses_a_clear_context_gain_and_keeps_the_median_on_noise():
    """Issue 26 (c): on a small team (45 workflows) a context that validation finds clearly
    better is used; where the context is noise, the position median is kept."""
    rng = np.random.default_rng(3)
    team = [("lead", "dev", *["dev", "qa"] * int(rng.integers(1, 3)), "lead") if rng.random() < 0.5
            else ("lead", "writer", *["writer"] * int(rng.integers(6, 9)), "lead")
            for _ in range(45)]
    chosen = select_models(team, [1] * len(team), folds=3)["remaining"]
    assert chosen["order"] >= 1, chosen
    assert chosen["validation_mae"] < 0.7 * chosen["position_median_mae"], chosen
    assert chosen["families"] == 13 and 2.0 <= chosen["z"] < 3.0
    noise = [tuple(rng.choice(["a", "b", "c"], size=int(rng.geometric(0.15)) + 1))
             for _ in range(45)]
    kept = select_models(noise, [1] * len(noise), folds=3)["remaining"]
    assert kept["validation_mae"] <= kept["position_median_mae"] + 1e-9, kept
    assert kept["order"] == 0, kept
