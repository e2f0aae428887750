"""The annotation contract: every shape of the per-call prediction is derived from one model."""
from __future__ import annotations

import json
from dataclasses import replace

from predictors import Predictor
from predictors.contract import FLAT_KEYS, Annotation, from_custom_params, to_sglang_custom_params
from serving_hooks.annotations import forward_body
from policies import KeepDropPolicy, PriorityPolicy


def _annotations(fitted_profile, n: int = 12) -> list[Annotation]:
    # agent_fallback=False: "nobody" (an agent the profile never saw) stays unknown
    p = Predictor(fitted_profile, agent_fallback=False)
    pol = PriorityPolicy()          # what the serving layer (PredictionService) adds
    agents = ["planner", "explorer", "engineer", "engineer", "reviewer", "nobody"]
    anns = [p.annotate_call({"workflow_type_id": "coding_assistant", "workflow_id": f"w{i % 2}",
                             "agent_id": agents[i % len(agents)]}, request_id=f"r{i}", input_tokens=500)
            for i in range(n)]
    return [replace(a, priority=pol.call_priority(a)) if a.known else a for a in anns]


def test_json_form_round_trips_and_is_plain_json(fitted_profile):
    anns = _annotations(fitted_profile)
    assert any(a.known for a in anns) and any(not a.known for a in anns)
    for ann in anns:
        d = ann.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False)) == d
        back = Annotation.from_dict(d)
        # the priority score travels as SGLang's integer (the wire form is unchanged)
        assert replace(back, priority=None) == replace(ann, priority=None)
        assert back.sglang_priority() == ann.sglang_priority()
        assert d.get("priority") == ann.sglang_priority()
        assert Annotation.from_dict(back.to_dict()) == back
        if not ann.known:
            assert set(d) <= {"profile_version", "known", "workflow_type_id", "workflow_id", "agent_id",
                              "reason", "detail", "latency_class"}


def test_flat_form_carries_what_the_policies_read(fitted_profile):
    for ann in _annotations(fitted_profile):
        flat = to_sglang_custom_params(ann)
        assert tuple(flat) == FLAT_KEYS
        assert all(v is None or isinstance(v, (str, int, float, bool)) for v in flat.values())
        back = from_custom_params(flat)      # what the SGLang plugin rebuilds
        assert back.sglang_priority() == ann.sglang_priority()    # the integer on the wire
        for f in ("known", "workflow_id", "output_lo", "output_hi", "expected_remaining_calls",
                  "next_agent_id", "next_agent_p", "tool_p95_s", "retain_s", "p_end", "session_age_s", "output_len_mean", "keep_alive_ttl_s"):
            assert getattr(back, f) == getattr(ann, f), f
        assert back.flat() == flat
        # the policies decide the same from either (no distances: the flat form has none)
        if not ann.expected_distance:
            assert PriorityPolicy().score_annotation(back) == PriorityPolicy().score_annotation(ann)
        assert KeepDropPolicy().decide_annotation(back, 1.0) == KeepDropPolicy().decide_annotation(ann, 1.0)


def test_gateway_body_carries_the_contracts_priority_and_flat_form(fitted_profile):
    ann = next(a for a in _annotations(fitted_profile) if a.known)
    body = {"model": "m", "messages": [], "app_metadata": {"workflow_id": ann.workflow_id}}
    raw = json.dumps(body).encode()
    out = json.loads(forward_body(raw, body, "top", ann.to_dict(), sglang_fields=True))
    assert isinstance(ann.priority, float)
    assert out["priority"] == ann.sglang_priority() == round(ann.priority * 1000)
    assert out["custom_params"]["priority"] == out["priority"]      # the same integer, both places
    assert out["custom_params"] == to_sglang_custom_params(ann, body["app_metadata"])
    assert out["sys_annotations"] == ann.to_dict()


# --------------------------------------------------------------------------- declared once
from dataclasses import dataclass, fields  # noqa: E402

from pydantic import TypeAdapter  # noqa: E402

from predictors.contract import contract_field, flat_keys, header_fields  # noqa: E402
from serving_hooks.dialects import hint_values, render  # noqa: E402


@dataclass(frozen=True, slots=True)
class _WithNewField(Annotation):
    """The contract with one more field, declared the one way a field is declared."""

    queue_hint_s: float | None = contract_field(flat="queue_hint", header="Queue-Hint")
    """seconds the call may wait in the queue (a field added for this test)"""


def test_a_new_field_is_declared_once_and_appears_in_every_shape():
    ann = _WithNewField(known=True, workflow_type_id="t", workflow_id="w", agent_id="a",
                        p_end=0.2, queue_hint_s=1.5)
    # JSON (sys_annotations) both ways
    assert ann.to_dict()["queue_hint_s"] == 1.5
    assert _WithNewField.from_dict(ann.to_dict()) == ann
    # flat custom_params both ways, and its key list
    assert ann.flat()["queue_hint"] == 1.5 and "queue_hint" in flat_keys(_WithNewField)
    assert _WithNewField.from_flat(ann.flat()).queue_hint_s == 1.5
    # header dialect, SGLang custom_params and vLLM xargs rendered from it
    assert ("Queue-Hint", "queue_hint") in header_fields(_WithNewField)
    v = hint_values(ann)
    assert render("headers", v, {})[1]["X-Agentprof-Queue-Hint"] == "1.5"
    assert render("sglang", v, {})[0]["custom_params"]["queue_hint"] == 1.5
    assert render("vllm", v, {})[0]["vllm_xargs"]["queue_hint"] == 1.5
    # OpenAPI (the sidecar's schema is the dataclass itself), with the attribute docstring
    props = TypeAdapter(_WithNewField).json_schema()["properties"]
    assert "seconds the call may wait" in props["queue_hint_s"]["description"]


def test_every_field_is_in_every_shape_it_declares():
    """Inspect every declared field: a value in it survives JSON, reaches the OpenAPI schema, and
    a flat field is in the flat form and (when it has one) the header dialect."""
    props = TypeAdapter(Annotation).json_schema()["properties"]
    for f in fields(Annotation):
        assert f.name in props and props[f.name].get("description"), f.name
        for key in f.metadata["flat"]:
            assert key in FLAT_KEYS, (f.name, key)
        for header, key in zip(f.metadata["headers"], f.metadata["flat"]):
            assert header is None or (header, key) in header_fields(Annotation)
    assert len(FLAT_KEYS) == len(set(FLAT_KEYS))


def test_session_end_travels_in_every_shape():
    ann = replace(Annotation(known=True, workflow_id="w", p_end=0.95), session_end=True)
    assert ann.to_dict()["session_end"] is True and Annotation.from_dict(ann.to_dict()) == ann
    assert ann.flat()["session_end"] is True
    assert from_custom_params(ann.flat()).session_end is True
    assert Annotation().to_dict().get("session_end") is None      # the predictor never sets it
    unknown_last = Annotation(known=False, workflow_id="w", session_end=True)
    assert unknown_last.to_dict()["session_end"] is True            # an unknown call may be the last
