"""The served next-agent candidate (issue 37 item 1, ``synth.next_served``, ``synth.next_select``): ours, a Markov
baseline or a blend, chosen forward in time on rolling origins; whichever is served, the
Predictor serves what ``profiler eval`` scores, and a baseline served is scored level with
itself."""
from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest

from fitting.profile_fit import fit_profile
from predictors.predictor import Predictor
from scoring.evaluation import evaluate
from store.workloads import generate, write_jsonl
from synth.evaluation import served_predictions
from synth.markov_baselines import MARKOV_BASELINES, BaselinePredictor, fit_baselines
from synth.next_select import ROLLING_MIN, _choose, select_served
from synth.next_served import CANDIDATES, candidate_vector, ranked
from synth.sequences import sequences_from_symbols
from synth.session import WorkflowPaths
from synth.vomm import NO_TOOL, END, tool_mark

from test_served_equals_scored import WT, _check_served_call, _tools, _workflows


@pytest.fixture(scope="module")
def agent_user(tmp_path_factory):
    root = tmp_path_factory.mktemp("served_next")
    write_jsonl(generate("agent_user", 100, seed=0), root / "train.jsonl")
    write_jsonl(generate("agent_user", 30, seed=1), root / "test.jsonl")
    profile, _ = fit_profile([root / "train.jsonl"], root / "profile")
    return profile, root


def _serving(profile, candidate: str):
    """The profile with ``candidate`` served for the type (a new version string)."""
    data = copy.deepcopy(profile.data)
    data["workflows"][WT]["sequence_model"]["served"] = {"candidate": candidate}
    return dataclasses.replace(profile, data=data, version=f"{profile.version}-{candidate}")


def test_the_fit_records_its_choice_forward_in_time(agent_user):
    profile, _ = agent_user
    served = profile.data["workflows"][WT]["sequence_model"]["served"]
    assert served["candidate"] in CANDIDATES
    assert served["test_workflows"] >= ROLLING_MIN
    assert set(served["log_loss"]) == set(CANDIDATES) == set(served["top1"])
    assert served["candidate"] in served["behind_none"] or not served["behind_none"]


@pytest.mark.parametrize("candidate", ["markov1", "markov_vo", "markov_wb", "blend_0.5"])
def test_every_candidate_is_served_as_scored(agent_user, candidate):
    """Each held-out call's annotation (at arrival, and after its response) equals what eval
    scores for it, whichever candidate the type serves."""
    profile, root = agent_user
    chosen = _serving(profile, candidate)
    predictor = Predictor(chosen)
    paths = WorkflowPaths.from_section(chosen.data["workflows"][WT])
    assert paths.served_next == candidate
    checked = 0
    for wf, recs in list(_workflows(root / "test.jsonl").items())[:8]:
        seq = sequences_from_symbols([[r["agent_id"] for r in recs]])[0]
        marks = [tool_mark(r["agent_id"], _tools(r)) for r in recs]
        tools = [(_tools(r) or [NO_TOOL])[0] for r in recs]
        for rec, (i, _s, _v, at_arrival, after) in zip(recs, served_predictions(paths, seq, marks, tools)):
            meta = {"workflow_type_id": WT, "workflow_id": wf, "agent_id": rec["agent_id"]}
            _check_served_call(predictor, meta, rec, at_arrival, after, (wf, i))
            checked += 1
    assert checked > 20


def test_a_baseline_served_is_scored_level_with_itself(agent_user):
    """Serving markov1 / markov_vo / markov_wb, eval's ours − that baseline is exactly 0 on
    top-1 and log-loss: the served candidate is the baseline as eval computes it."""
    profile, root = agent_user
    for name in MARKOV_BASELINES:
        result, _ = evaluate(_serving(profile, name), [root / "test.jsonl"])
        vs = result["next_agent"]["vs_baselines"][name]
        assert vs["top1_diff"] == 0.0 and vs["log_loss_diff"] == 0.0, (name, vs)
        assert result["next_agent"]["baselines"][name] == result["next_agent"]["top1_accuracy"]


def test_candidate_vectors_are_distributions_and_baselines_rank_their_own_top1():
    seqs = [("a", "b", "c"), ("a", "c"), ("a", "b", "b", "c"), ("b", "a")]
    base = BaselinePredictor(fit_baselines(seqs, [1.0] * len(seqs)))
    vocab = ["a", "b", "c", END]
    ours = np.array([0.1, 0.5, 0.3, 0.05])
    for history in [("a",), ("c",), ("a", "b", "b"), ("z",)]:
        for name in CANDIDATES:
            vec = candidate_vector(name, ours, 0.05, vocab, base, history)
            assert vec.shape == (5,) and np.all(vec >= 0)
            if name in ("markov_wb", "ours") or name.startswith("blend_"):
                assert vec.sum() == pytest.approx(1.0)
            top = ranked(name, vec, vocab, base, history)
            if name in MARKOV_BASELINES:
                assert top[0][0] == base.top1(name, history)
    # after "c" only END followed in training: markov1's own top-1 (the overall most frequent
    # next agent) is listed first although every agent ties under add-one smoothing
    vec = candidate_vector("markov1", ours, 0.0, vocab, base, ("c",))
    assert vec[0] == vec[1] == vec[2]
    assert ranked("markov1", vec, vocab, base, ("c",))[0][0] == base.markov1(("c",))


def _rows(n: int, means: dict[str, float], spread: float, seed: int = 0) -> np.ndarray:
    """Per-workflow figures of every candidate: its mean plus one shared noise per workflow
    (candidates level in mean are then exactly level)."""
    noise = np.random.default_rng(seed).normal(0, spread, n)
    return np.column_stack([means[c] + noise for c in CANDIDATES])


def test_the_rule_takes_the_simplest_behind_no_other():
    n = 40
    w, events = np.ones(n), np.full(n, 10.0)
    level = {c: 5.0 for c in CANDIDATES}
    # all level: the simplest, markov1
    loss, hits = _rows(n, level, 0.5), _rows(n, level, 0.5, 1)
    assert _choose(loss, hits, w, events)["candidate"] == "markov1"
    # ours ahead of every other on log-loss beyond noise, level on top-1: ours
    ahead = {**level, "ours": 3.0}
    out = _choose(_rows(n, ahead, 0.2), _rows(n, level, 0.2, 1), w, events)
    assert out["candidate"] == "ours" and out["behind_none"] == ["ours"]
    # the baselines behind on log-loss, the blends level with ours: the simplest blend
    blends = {**level, "ours": 3.0, "blend_0.25": 3.0, "blend_0.5": 3.0, "blend_0.75": 3.0}
    out = _choose(_rows(n, blends, 0.2), _rows(n, level, 0.2, 1), w, events)
    assert out["candidate"] == "blend_0.25"


def test_when_the_figures_disagree_the_blend_of_least_log_loss_serves():
    n = 40
    w, events = np.ones(n), np.full(n, 10.0)
    # markov_vo best on log-loss, ours best on top-1: every candidate behind another; of the
    # blends of ours and markov_wb (both ends included) markov_wb has the least log-loss
    ll = {**{c: 5.0 for c in CANDIDATES}, "markov_vo": 2.0, "markov_wb": 4.0,
          "blend_0.25": 4.2, "blend_0.5": 4.5, "blend_0.75": 4.8, "ours": 5.0}
    top = {**{c: 5.0 for c in CANDIDATES}, "ours": 8.0, "blend_0.75": 8.0}
    out = _choose(_rows(n, ll, 0.1), _rows(n, top, 0.1, 1), w, events)
    assert out["behind_none"] == [] and out["candidate"] == "markov_wb"
    ll["blend_0.5"] = 3.9
    assert _choose(_rows(n, ll, 0.1), _rows(n, top, 0.1, 1), w, events)["candidate"] == "blend_0.5"


def test_too_few_workflows_forward_serve_ours():
    seqs = [("a", "b"), ("a", "c", "b")]
    chosen = {"context": "agent", "max_order": 2, "escape": 1.0, "min_context": 1.0, "mixture": 1.0}
    assert select_served(seqs, [3, 3], None, chosen)["candidate"] == "ours"
    few = select_served(seqs, [3, 3], [{0: 1, 2: 2}, {1: 1, 4: 2}], chosen)
    assert few["candidate"] == "ours" and few["test_workflows"] < ROLLING_MIN
