"""predictors.Predictor: annotations from a real fitted profile, session state, never-fail."""
from __future__ import annotations

import subprocess
import sys
import threading

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from predictors import Predictor
from fitting import profile_fit as fitting
from store.profile_artifact import load_profile, write_profile
from store.workloads import generate, write_jsonl
from serving_hooks.shadow import ShadowGate

WT = "coding_assistant"


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    """A real profile (with workflow automata) fit on 60 generated coding-assistant sessions."""
    root = tmp_path_factory.mktemp("pred")
    write_jsonl(generate(WT, 60, seed=3), root / "logs" / "ca.jsonl")
    profile, _ = fitting.fit_profile([root / "logs"], root / "profile",
                                     options=fitting.FitOptions(min_calls=20))
    con = duckdb.connect(str(root / "profile" / "store.duckdb"), read_only=True)
    sequences = [s for (s,) in con.execute(
        "SELECT list(agent_id ORDER BY call_index) FROM calls GROUP BY workflow_id ORDER BY workflow_id").fetchall()]
    con.close()
    return profile, sequences


def meta(wf: str, agent: str, wt: str = WT) -> dict:
    return {"workflow_type_id": wt, "workflow_id": wf, "agent_id": agent}


def test_known_call_carries_every_prediction(fitted):
    profile, sequences = fitted
    p = Predictor(profile)
    seq = next(s for s in sequences if p.profile.paths[WT].track(s)[-1] is not None)
    remaining = []
    for i, agent in enumerate(seq):
        ann = p.annotate(meta("w1", agent), request_id=f"r{i}", input_tokens=1000)
        assert ann["known"] is True, ann
        lo, hi = ann["predicted_output_len"]
        assert 0 <= lo <= hi
        assert ann["profile_version"] == profile.version
        assert ann["predicted_path_regex"] == profile.data["workflows"][WT]["regex"]
        assert "priority" not in ann          # the serving layer sets it (PredictionService)
        remaining.append(ann["expected_remaining_calls"])
        if i + 1 < len(seq):
            assert seq[i + 1] in {a["agent_id"] for a in ann["next_agents"]}
    assert remaining[-1] == pytest.approx(0.0, abs=1e-6)   # the last call ends the workflow
    assert remaining[0] > remaining[-1]
    engineer = p.annotate(meta("w2", "engineer"), advance=False)
    assert set(engineer["tool_latency"]) <= set(profile.data["agents"][WT]["engineer"]["tools"])
    assert all({"mu", "sigma", "p50_s", "p95_s"} <= set(v) for v in engineer["tool_latency"].values())
    counts = profile.data["agents"][WT]["engineer"]["tools"]
    most_used = max(counts, key=counts.get)
    assert next(iter(engineer["tool_latency"])) == most_used           # ordered by frequency
    assert engineer["retain_s"] == engineer["tool_latency"][most_used]["ttl_s"]


@pytest.mark.parametrize("app_metadata, reason", [
    (meta("w", "planner", wt="no_such_app"), "unknown_workflow_type"),
    ({"workflow_type_id": WT, "workflow_id": "w"}, "missing_app_metadata"),
    (None, "missing_app_metadata"),
    ("not a dict", "missing_app_metadata"),
])
def test_unknown_is_known_false_without_predictions(fitted, app_metadata, reason):
    ann = Predictor(fitted[0]).annotate(app_metadata)
    assert ann["known"] is False and ann["reason"] == reason
    assert "predicted_output_len" not in ann and "next_agents" not in ann


def test_unseen_agent_is_served_its_workflow_types_entry(fitted):
    """An agent the profile never saw (multi-agent apps name agents per task) gets the workflow
    type's band, TTL and the session's path fields; ``agent_fallback=False`` refuses it."""
    p = Predictor(fitted[0])
    p.annotate(meta("w", "planner"))
    ann = p.annotate(meta("w", "no_such_agent"))
    assert ann["known"] is True and ann["output_len_level"] in ("workflow_type", "global", "conditional")
    lo, hi = ann["predicted_output_len"]
    wt_band = p.profile.bands.lookup(WT, "no_such_agent")[0]
    assert 0 <= lo <= hi
    if not wt_band.get("conditional"):
        assert (lo, hi) == (int(wt_band["lo"]), int(wt_band["hi"]))
    assert ann["tool_latency"] == {} and "expected_remaining_calls" in ann
    strict = Predictor(fitted[0], agent_fallback=False).annotate(meta("w", "no_such_agent"))
    assert strict["known"] is False and strict["reason"] == "unknown_agent"
    assert "predicted_output_len" not in strict


def test_session_off_the_dominant_paths_still_gets_predictions(fitted):
    p = Predictor(fitted[0])
    assert p.annotate(meta("w", "planner"))["known"] is True
    ann = p.annotate(meta("w", "verifier"))  # a verifier right after the planner never happens
    assert p.session_view(WT, "w")["on_path"] is False
    # the variable-order sequence model keeps predicting off the automaton (issue 10)
    assert ann["known"] is True and ann["on_path"] is False
    assert ann["next_agents"] and 0.0 <= ann["p_end"] <= 1.0
    assert ann["expected_remaining_calls"] >= 0
    assert ann["remaining_calls_p90"] >= ann["remaining_calls_p50"] >= 0


def test_retried_request_id_advances_once(fitted):
    p = Predictor(fitted[0])
    a = p.annotate(meta("w", "planner"), request_id="r1")
    b = p.annotate(meta("w", "planner"), request_id="r1")
    assert a == b
    assert p.session_view(WT, "w")["agents"] == ["planner"]
    p.annotate(meta("w", "explorer"), advance=False)
    assert p.session_view(WT, "w")["agents"] == ["planner"]


def test_observe_scores_the_band_and_advances_unannotated_calls(fitted):
    p = Predictor(fitted[0])
    ann = p.annotate(meta("w", "planner"), request_id="r1")
    lo, hi = ann["predicted_output_len"]
    assert p.observe({"app_metadata": meta("w", "planner"), "request_id": "r1", "output_tokens": lo}) is True
    assert p.session_view(WT, "w")["last_output"] == {"planner": lo}
    # a completion the predictor never annotated still advances the session
    assert p.observe({"app_metadata": meta("w", "explorer"), "request_id": "r2",
                      "output_tokens": 10**9}) is False
    assert p.session_view(WT, "w")["agents"] == ["planner", "explorer"]
    assert p.observe({"request_id": "x"}) is None          # bad input: ignored, no exception


def test_sessions_are_bounded_by_lru_and_idle_timeout(fitted):
    now = [0.0]
    p = Predictor(fitted[0], max_sessions=3, session_idle_s=10.0, clock=lambda: now[0])
    for i in range(5):
        p.annotate(meta(f"w{i}", "planner"))
    assert p.session_count() == 3
    assert p.session_view(WT, "w0") is None and p.session_view(WT, "w4") is not None
    now[0] = 100.0
    assert p.expire_idle() == 0
    # a session id reused after its idle timeout starts from scratch
    p.annotate(meta("w9", "planner"))
    now[0] = 200.0
    p.annotate(meta("w9", "explorer"))
    assert p.session_view(WT, "w9")["agents"] == ["explorer"]


def test_concurrent_annotate_and_observe_keep_sessions_consistent(fitted):
    p = Predictor(fitted[0])
    errors: list[BaseException] = []

    def worker(t: int) -> None:
        try:
            for i in range(500):
                wf = f"w{i % 20}"
                p.annotate(meta(wf, "engineer"), request_id=f"{t}-{i}")
                p.observe({"app_metadata": meta(wf, "engineer"), "request_id": f"{t}-{i}",
                           "output_tokens": 100})
        except BaseException as exc:  # pragma: no cover - the assertion below reports it
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sum(p.session_view(WT, f"w{i}")["agent_calls"]["engineer"] for i in range(20)) == 2000
    assert p.annotations_total == 2000


def test_profile_swap_replays_live_sessions_on_the_new_automaton(fitted, tmp_path):
    profile, sequences = fitted
    p = Predictor(profile)
    seq = next(s for s in sequences if len(s) > 4 and p.profile.paths[WT].track(s)[-1] is not None)
    for agent in seq[:3]:
        p.annotate(meta("w", agent))
    before = p.annotate(meta("w", seq[3]), advance=False)
    data = dict(profile.data)
    data["workflow_types"] = {**data["workflow_types"], "marker": {"workflows": 0, "calls": 0}}
    new = write_profile(tmp_path / "root", data, {"sources": []})
    p.load(load_profile(new.path))
    after = p.annotate(meta("w", seq[3]), advance=False)
    assert after["profile_version"] == new.version != before["profile_version"]
    assert after["expected_remaining_calls"] == before["expected_remaining_calls"]


def test_shadow_gate_holds_new_types_until_live_coverage_recovers():
    gate = ShadowGate(min_calls=10, window=20, min_window=5, drift_drop=0.1, recover_drop=0.05)
    gate.on_profile({"a": 100, "thin": 3}, 0.99, first=True)
    assert not gate.is_shadowed("a") and gate.reason("thin") == "too_few_calls"
    gate.note_unknown("new")
    assert gate.reason("new") == "new_workflow_type"
    gate.on_profile({"a": 100, "thin": 3, "new": 50}, 0.99, first=False)
    for _ in range(4):
        gate.record("new", True)
    assert gate.is_shadowed("new")                    # window not judged yet
    gate.record("new", True)
    assert not gate.is_shadowed("new")                # 5/5 in band: promoted
    for _ in range(5):
        gate.record("thin", True)
    assert gate.is_shadowed("thin")                   # coverage fine, but too few calls
    for hit in [True] * 3 + [False] * 2:
        gate.record("a", hit)
    assert gate.reason("a") == "drift"                # 0.6 < 0.99 - 0.1
    assert gate.status()["a"]["demotions"] == 1


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.none(), st.integers(), st.text(), st.lists(st.integers()),
                 st.dictionaries(st.sampled_from(["workflow_type_id", "workflow_id", "agent_id", "x"]),
                                 st.one_of(st.none(), st.integers(), st.text(max_size=12),
                                           st.lists(st.integers(), max_size=2)))),
       st.one_of(st.none(), st.text(max_size=5)), st.one_of(st.none(), st.integers(-5, 10**7)))
def test_annotate_and_observe_never_raise(fitted, app_metadata, request_id, tokens):
    p = _shared_predictor(fitted)
    ann = p.annotate(app_metadata, request_id=request_id, input_tokens=tokens)
    assert isinstance(ann["known"], bool)
    p.observe({"app_metadata": app_metadata, "request_id": request_id, "output_tokens": tokens})


_PREDICTORS: dict = {}


def _shared_predictor(fitted) -> Predictor:
    key = fitted[0].version
    if key not in _PREDICTORS:
        _PREDICTORS[key] = Predictor(fitted[0], gate=ShadowGate())
    return _PREDICTORS[key]


def test_serving_path_imports_no_pandas_scipy_sklearn(fitted_profile):
    """The facade, the sidecar, the gateway and the capacity router, with a real profile
    compiled and a call annotated, load none of the fit-time libraries (a fresh interpreter)."""
    code = (
        "import sys\n"
        "from predictors import Predictor\n"
        "from serving_hooks.sidecar import create_sidecar_app\n"
        "from serving_hooks.gateway import create_gateway_app\n"
        "from serving_hooks.upstreams import CapacityRouting\n"
        "from dataclasses import replace\n"
        "from policies import PriorityPolicy\n"
        f"p = Predictor({str(fitted_profile)!r})\n"
        "c = p.annotate_call({'workflow_type_id': 'coding_assistant', 'workflow_id': 'w', 'agent_id': 'planner'})\n"
        "a = replace(c, priority=PriorityPolicy().call_priority(c)).to_dict()\n"
        "assert a['known'] and isinstance(a['priority'], int), a\n"
        "print(sorted(m for m in ('pandas', 'scipy', 'sklearn') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
