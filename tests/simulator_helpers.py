"""Helpers shared by the simulator tests: a step model simple enough to do by hand, flat records."""
from __future__ import annotations

from typing import Any

from simulator.calibration import StepTimeModel

#: A prefill iteration costs 1 ms per prompt token, a decode iteration 10 ms, nothing else.
STEP = StepTimeModel(t0=0.01, a=0.001, a_ctx=0.0, c=0.0, source="test")


def rec(wf: str, n: int, t_arr: float, t_fin: float, inp: int, out: int, tool: str | None = None,
        **extra: Any) -> dict:
    """Flat record ``<wf>#<n>`` of agent ``a`` (workflow type ``t``); ``tool`` runs for 1 s after it."""
    r = {"request_id": f"{wf}#{n}", "workflow_type_id": "t", "workflow_id": wf, "agent_id": "a",
         "t_arrival": t_arr, "t_finish": t_fin, "input_tokens": inp, "output_tokens": out, **extra}
    if tool:
        r["tool_calls"] = [{"name": tool, "t_start": t_fin, "t_end": t_fin + 1}]
    return r
