"""The ``online_calibration`` service setting (issue 26 item 5): ``profiler serve`` and
``profiler gateway`` built by their real commands, served on real ports. Misses fed back move
the served output-length band when it is on (the default) and leave the fitted band in place when
it is off (``--no-online-calibration``, ``PROFILER_ONLINE_CALIBRATION=false`` or the TOML key)."""
from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from typer.testing import CliRunner

from profiler.cli import app
from serving_hooks.server_thread import serve_in_thread
from serving_hooks.settings import knobs, resolve_settings
from tests.serving_helpers import fit_generated_profile, wait_for

META = {"workflow_type_id": "coding_assistant", "agent_id": "planner"}
MISSES = 5


@pytest.fixture(scope="module")
def profile(tmp_path_factory) -> Path:
    return fit_generated_profile(tmp_path_factory.mktemp("oncal"), 60, 0)


@contextmanager
def launched(args: list[str], monkeypatch, env: dict | None = None):
    """The app the real command builds from ``args``, served on a real port (the command's own
    ``uvicorn.run`` is swapped for a background server, so the test can stop it)."""
    built = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: built.append(app_))
    clean = {k.env: "" for k in knobs()}
    out = CliRunner().invoke(app, args, env={**clean, **(env or {})})
    assert out.exit_code == 0 and len(built) == 1, out.output
    with serve_in_thread(built[0]) as server:
        yield built[0], server.url


def band(ann: dict) -> tuple[int, int]:
    lo, hi = ann["predicted_output_len"]
    return lo, hi


@pytest.mark.parametrize("how", ["default", "flag-off", "env-off", "file-off"])
def test_sidecar_band_moves_with_misses_only_when_calibration_is_on(profile, tmp_path, monkeypatch, how):
    args = ["serve", "--profile", str(profile)]
    env = {}
    if how == "flag-off":
        args.append("--no-online-calibration")
    elif how == "env-off":
        env["PROFILER_ONLINE_CALIBRATION"] = "false"
    elif how == "file-off":
        cfg = tmp_path / "serve.toml"
        cfg.write_text("online_calibration = false\n")
        args += ["--config", str(cfg)]
    on = how == "default"
    with launched(args, monkeypatch, env) as (app_, url), httpx.Client(base_url=url) as c:
        assert (app_.state.service.predictor.calibrator is not None) is on
        meta = {**META, "workflow_id": "w1"}
        fitted = band(c.post("/v1/annotate", json={"app_metadata": meta, "request_id": "r0"})
                      .json()["sys_annotations"])
        for i in range(MISSES):                      # outcomes ten times above the band: misses
            rid = f"m{i}"
            c.post("/v1/annotate", json={"app_metadata": meta, "request_id": rid}).raise_for_status()
            r = c.post("/v1/observe", json={"app_metadata": meta, "request_id": rid,
                                            "output_tokens": 10 * fitted[1]})
            assert r.status_code == 200 and r.json()["in_band"] is False, r.text
        after = band(c.post("/v1/annotate", json={"app_metadata": meta, "request_id": "next"})
                     .json()["sys_annotations"])
    if on:
        assert after[1] > fitted[1] and after[0] <= fitted[0]
    else:
        assert after == fitted


@pytest.mark.parametrize("on", [True, False])
def test_gateway_band_moves_with_misses_only_when_calibration_is_on(profile, upstream, monkeypatch, on):
    args = ["gateway", "--upstream", upstream.url, "--profile", str(profile),
            "--online-calibration" if on else "--no-online-calibration"]
    with launched(args, monkeypatch) as (app_, url), httpx.Client(base_url=url, timeout=60) as c:
        predictor = app_.state.gateway.service.predictor
        assert (predictor.calibrator is not None) is on

        def call(workflow: str, tokens: int) -> tuple[int, int]:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                    "app_metadata": {**META, "workflow_id": workflow}}
            c.post("/v1/chat/completions", json=body,
                   headers={"x-fake-tokens": str(tokens)}).raise_for_status()
            return band(upstream.received[-1].body["sys_annotations"])

        fitted = call("g0", 1)
        observed = lambda: predictor.coverage_monitor.status().get("coding_assistant", {}).get("calls", 0)
        for i in range(MISSES):
            assert call(f"g{i + 1}", 10 * fitted[1]) == fitted or on   # the band before each miss
        # the gateway observes after the client has its answer: wait for the misses to be scored
        assert wait_for(lambda: observed() >= MISSES + 1)
        after = call("g-next", 1)
    if on:
        assert after[1] > fitted[1]
    else:
        assert after == fitted


def test_the_setting_reads_from_every_source(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text("online_calibration = false\n")
    assert resolve_settings(environ={}).settings.online_calibration is True
    assert resolve_settings(config=cfg, environ={}).settings.online_calibration is False
    got = resolve_settings(config=cfg, environ={"PROFILER_ONLINE_CALIBRATION": "on"})
    assert got.settings.online_calibration is True and got.sources["online_calibration"] == "env"
    assert resolve_settings(environ={}, flags={"online_calibration": False}).settings.online_calibration is False


# ------------------------------------------- remaining_selection (on by default), end to end
@pytest.mark.parametrize("on", [True, False])
def test_sidecar_remaining_selection_scores_a_session_its_client_ends(profile, monkeypatch, on):
    """``--remaining-selection``: a call observed with ``app_metadata.last_call`` ends its session
    and hands its figures to the selector (shown under ``online`` in ``/v1/profile``); off
    (``--no-remaining-selection``) the session stays and ``online.remaining_selection`` is null."""
    args = ["serve", "--profile", str(profile)] + ([] if on else ["--no-remaining-selection"])
    with launched(args, monkeypatch) as (app_, url), httpx.Client(base_url=url) as c:
        predictor = app_.state.service.predictor
        assert (predictor.remaining_selector is not None) is on
        meta = {**META, "workflow_id": "ended"}
        ann = c.post("/v1/annotate", json={"app_metadata": meta, "request_id": "r0"}).json()
        assert ann["sys_annotations"]["expected_remaining_output_tokens"] is not None
        c.post("/v1/observe", json={"app_metadata": {**meta, "last_call": True}, "request_id": "r0",
                                    "output_tokens": 50}).raise_for_status()
        online = c.get("/v1/profile").json()["online"]
        assert predictor.session_count() == (0 if on else 1)
    if on:
        assert META["workflow_type_id"] in online["remaining_selection"]
    else:
        assert online["remaining_selection"] is None


def test_gateway_passes_last_call_to_the_remaining_selection(profile, upstream, monkeypatch):
    args = ["gateway", "--upstream", upstream.url, "--profile", str(profile), "--remaining-selection"]
    with launched(args, monkeypatch) as (app_, url), httpx.Client(base_url=url, timeout=60) as c:
        predictor = app_.state.gateway.service.predictor
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                "app_metadata": {**META, "workflow_id": "gw-ended", "last_call": True}}
        c.post("/v1/chat/completions", json=body, headers={"x-fake-tokens": "40"}).raise_for_status()
        # the gateway observes after the client has its answer: wait for the session to end
        assert wait_for(lambda: META["workflow_type_id"] in predictor.remaining_selector.status())
        assert predictor.session_view(META["workflow_type_id"], "gw-ended") is None
