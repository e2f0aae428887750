"""NVIDIA NeMo Agent Toolkit's prediction trie as an eval baseline (``baselines.nat_trie``)."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from predictors.nat_trie import PredictionTrie, agent_call_index, lookup_frame, trie_from_section, trie_to_section
from scoring.baseline_table import baseline_rows
from scoring.evaluation import evaluate
from fitting.profile_fit import fit_profile
from tests.simulator_helpers import rec


def chain(wf: str, n: int, gap: float, outs: list[int], agent: str = "a") -> list[dict]:
    """``n`` sequential 1 s calls of ``agent`` in workflow ``wf``, ``gap`` s apart, the k-th
    writing ``outs[k]`` tokens (real times, so the idle-gap and TTL models are fit)."""
    t0 = 1000.0 * abs(hash(wf) % 997)
    return [rec(wf, k, t0 + k * (1 + gap), t0 + k * (1 + gap) + 1.0, 100, outs[k], agent_id=agent,
                call_index=k) for k in range(n)]


def write(path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def test_section_round_trips_through_json_and_answers_as_the_fitted_trie():
    train = chain("W1", 3, 2.0, [10, 20, 30]) + chain("W2", 3, 2.0, [30, 40, 50]) + chain("W3", 2, 4.0, [5, 6], "b")
    trie = PredictionTrie().fit(train)
    back = trie_from_section(json.loads(json.dumps(trie_to_section(trie))))
    for key in (("t", "a", 1), ("t", "a", 3), ("t", "a", 9), ("t", "b", 1), ("t", "zz", 1)):
        assert back.find(*key) == trie.find(*key)
    assert back.find("unseen_type", "a", 1) is None      # the section is keyed by type: no root row
    # NAT's call index counts the agent's own calls in its workflow
    idx = agent_call_index(["t"] * 5, ["W", "W", "W", "V", "W"], ["a", "b", "a", "a", "a"])
    assert idx.tolist() == [1, 1, 2, 1, 3]
    nat = lookup_frame(back, ["t", "t"], ["a", "a"], [1, 3])
    assert nat["remaining_calls"].tolist() == [2.0, 0.0]
    assert nat["ttl_s"][0] == pytest.approx(2.0 * 2.0)            # remaining calls × inter-arrival
    assert np.isnan(nat["ttl_s"][1])                            # the last call has no inter-arrival


@pytest.fixture(scope="module")
def nat_eval(tmp_path_factory):
    """Fit on 24 four-call workflows (outputs spread per position), score 12 more."""
    tmp = tmp_path_factory.mktemp("nat")
    rng = np.random.default_rng(0)

    def logs(prefix: str, n: int) -> list[dict]:
        out = []
        for w in range(n):
            out += chain(f"{prefix}{w}", 4, 2.0, [int(x) for x in rng.integers(50, 400, size=4)])
        return out

    write(tmp / "train" / "logs.jsonl", logs("tr", 24))
    write(tmp / "test" / "logs.jsonl", logs("te", 12))
    profile, _ = fit_profile([tmp / "train"], tmp / "profile")
    result, _ = evaluate(profile, [tmp / "test"])
    return profile, result


def test_eval_scores_nats_hints_beside_ours(nat_eval):
    profile, result = nat_eval
    trie = trie_from_section(profile.data["nat_trie"])
    # remaining calls: every workflow has 4 calls, so NAT's mean remaining is exact
    rc = result["remaining_calls"]["baselines"]["nat_trie"]
    assert rc["mae"] == 0.0 and rc["found_share"] == 1.0 and rc["n"] == 48
    # keep-alive: TTL = remaining × 2 s inter-arrival = 6, 4, 2 s after calls 1–3: every 2 s gap covered
    ka = result["keep_alive"]
    assert ka["baselines"]["nat_trie"] == 1.0
    assert ka["baseline_mean_ttl_s"]["nat_trie"] == pytest.approx(4.0, abs=0.01)
    # output length: the band [0, p95] of the call's (type, agent, index) node
    ol = result["output_len"]["baselines"]["nat_trie"]
    p95 = np.mean([trie.find("t", "a", i).output_tokens.p95 for i in (1, 2, 3, 4)])
    assert ol["mean_width"] == pytest.approx(p95)
    assert 0.5 < ol["coverage"] <= 1.0 and ol["osl_p90_coverage"] <= ol["coverage"]
    # remaining tokens: p50 output × (mean remaining + 1)
    assert result["remaining_work"]["baselines"]["nat_trie"]["mae_tokens"] is not None
    methods = {(r["metric"], r["method"]) for r in baseline_rows(result) if r["value"] is not None}
    for metric in ("output-length coverage", "remaining-calls MAE", "keep-alive idle-gap coverage",
                   "keep-alive mean TTL (s)", "remaining-tokens MAE"):
        assert (metric, "nat_trie") in methods
    assert ("next-agent log-loss", "markov_wb") in methods


def test_a_profile_without_the_section_reports_no_nat_row(nat_eval):
    profile, _ = nat_eval
    older = dataclasses.replace(profile, data={k: v for k, v in profile.data.items() if k != "nat_trie"})
    result, _ = evaluate(older, [profile.root.parent / "test"])
    assert "nat_trie" not in result["output_len"]["baselines"]
    assert "nat_trie" not in result["remaining_calls"]["baselines"]
    assert result["keep_alive"]["baselines"]["nat_trie"] is None
    assert result["remaining_work"]["baselines"]["nat_trie"]["mae_tokens"] is None


def test_the_profile_section_is_fit_on_a_seeded_sample_of_at_most_max_workflows(tmp_path, monkeypatch):
    from predictors import nat_trie
    from store import ingest
    from store.duckdb_store import connect
    write(tmp_path / "logs.jsonl", [r for w in range(6) for r in chain(f"w{w}", 3, 2.0, [10, 20, 30])])
    con = connect(None)
    ingest.ingest(con, [tmp_path / "logs.jsonl"])
    full = trie_from_section(nat_trie.build_nat_trie_section(con, {}))
    assert full.find("t", "a", 1).remaining_calls.sample_count == 6
    monkeypatch.setattr(nat_trie, "MAX_WORKFLOWS", 2)
    small = nat_trie.build_nat_trie_section(con, {"seed": 0})
    assert trie_from_section(small).find("t", "a", 1).remaining_calls.sample_count == 2
    assert nat_trie.build_nat_trie_section(con, {"seed": 0}) == small      # deterministic
