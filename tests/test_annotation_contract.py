"""The annotation contract: every shape of the per-call prediction is derived from one model."""
from __future__ import annotations

import json

from predictors import Predictor
from predictors.contract import FLAT_KEYS, Annotation, from_custom_params, to_sglang_custom_params
from serving_hooks.annotations import forward_body
from serving_hooks.policies import AnnotationPriority, CallView


def _annotations(fitted_profile, n: int = 12) -> list[Annotation]:
    # agent_fallback=False: "nobody" (an agent the profile never saw) stays unknown
    p = Predictor(fitted_profile, priority_policy=AnnotationPriority(), agent_fallback=False)
    agents = ["planner", "explorer", "engineer", "engineer", "reviewer", "nobody"]
    return [p.annotate_call({"workflow_type_id": "coding_assistant", "workflow_id": f"w{i % 2}",
                             "agent_id": agents[i % len(agents)]}, request_id=f"r{i}", input_tokens=500)
            for i in range(n)]


def test_json_form_round_trips_and_is_plain_json(fitted_profile):
    anns = _annotations(fitted_profile)
    assert any(a.known for a in anns) and any(not a.known for a in anns)
    for ann in anns:
        d = ann.to_dict()
        assert json.loads(json.dumps(d, allow_nan=False)) == d
        assert Annotation.from_dict(d) == ann
        if not ann.known:
            assert set(d) <= {"profile_version", "known", "workflow_type_id", "workflow_id", "agent_id",
                              "reason", "detail"}


def test_flat_form_carries_what_the_policies_read(fitted_profile):
    for ann in _annotations(fitted_profile):
        flat = to_sglang_custom_params(ann)
        assert tuple(flat) == FLAT_KEYS
        assert all(v is None or isinstance(v, (str, int, float, bool)) for v in flat.values())
        back = CallView.from_custom_params(flat)
        nested = CallView.from_annotation(ann)
        for f in ("known", "wf_id", "pred_out_lo", "pred_out_hi", "priority", "exp_remaining_calls",
                  "next_agent", "next_agent_p", "tool_p95_s", "retain_s", "p_end", "session_age_s",
                  "pred_out_mean", "keep_alive_ttl_s"):
            assert getattr(back, f) == getattr(nested, f), f
        assert from_custom_params(flat).flat() == flat


def test_gateway_body_carries_the_contracts_priority_and_flat_form(fitted_profile):
    ann = next(a for a in _annotations(fitted_profile) if a.known)
    body = {"model": "m", "messages": [], "app_metadata": {"workflow_id": ann.workflow_id}}
    raw = json.dumps(body).encode()
    out = json.loads(forward_body(raw, body, "top", ann.to_dict(), sglang_fields=True))
    assert out["priority"] == ann.sglang_priority() == ann.priority
    assert out["custom_params"] == to_sglang_custom_params(ann, body["app_metadata"])
    assert out["sys_annotations"] == ann.to_dict()
