"""One settings object for `profiler serve` and `profiler gateway` (issue 23, item 4).

The prediction-service knobs are the fields of :class:`ServiceSettings`; both commands' flags are
generated from them. Values come from flag > ``PROFILER_*`` environment > ``--config`` TOML >
default, with one-line errors naming the file, key or variable. ``simulate --scenario`` says which
of the given flags it overrides."""
from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

from profiler.cli import app
from profiler.commands.service_options import with_service_settings
from serving_hooks.settings import (GatewaySettings, ServiceSettings, SettingsError, knobs, setting_field, resolve_settings,
                                    settings_from_env)

ROOT = Path(__file__).resolve().parents[1]
CLI = get_command(app)
#: The minimum each command needs to reach its settings (nothing is served: --print-config exits).
BASE = {"serve": ["serve", "--profile", "p"],
        "gateway": ["gateway", "--upstream", "http://127.0.0.1:9", "--profile", "p"]}


def run(args: list[str], env: dict | None = None):
    # an empty PROFILER_* environment unless the test sets one (the developer's shell must not leak in)
    from simulator.settings import SimulateSettings

    clean = {k.env: "" for cls in (GatewaySettings, SimulateSettings) for k in knobs(cls)}
    return CliRunner().invoke(app, args, env={"COLUMNS": "400", **clean, **(env or {})})


def printed(args: list[str], env: dict | None = None) -> tuple[dict, dict]:
    """``--print-config`` output: (values, source of each value)."""
    out = run([*args, "--print-config"], env)
    assert out.exit_code == 0, out.output
    values = tomllib.loads(out.stdout)
    sources = dict(re.findall(r"^#? ?(\w+) .*# (\w+)$", out.stdout, re.M))
    return values, sources


def test_gateway_prints_its_config_without_an_upstream_and_refuses_to_run_without_one():
    values, sources = printed(["gateway"])
    assert values["routing"] == GatewaySettings.routing and sources["routing"] == "default"
    out = run(["gateway", "--profile", "p"])
    assert out.exit_code != 0 and "--upstream" in out.output


def test_precedence_flag_over_env_over_file_over_default(tmp_path):
    cfg = tmp_path / "service.toml"
    cfg.write_text('max_sessions = 5\nsession_idle = "2h"\ndrift_drop = 0.3\nlog_level = "debug"\n')
    env = {"PROFILER_MAX_SESSIONS": "7", "PROFILER_LOG_LEVEL": "warning"}
    got = resolve_settings(config=cfg, environ=env, flags={"max_sessions": 9})
    s = got.settings
    assert (s.max_sessions, s.log_level, s.session_idle, s.drift_drop, s.coverage_window) == \
        (9, "warning", "2h", 0.3, ServiceSettings.coverage_window)
    assert (got.sources["max_sessions"], got.sources["log_level"], got.sources["session_idle"],
            got.sources["coverage_window"]) == ("flag", "env", "file", "default")
    assert s.session_idle_s == 7200.0


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_the_command_line_applies_the_same_precedence(command, tmp_path):
    cfg = tmp_path / "service.toml"
    cfg.write_text('max_sessions = 5\nsession_idle = "2h"\nshadow_min_calls = 20\n')
    env = {"PROFILER_MAX_SESSIONS": "7", "PROFILER_SHADOW_MIN_CALLS": "30"}
    values, sources = printed([*BASE[command], "--config", str(cfg), "--max-sessions", "40"], env)
    assert (values["max_sessions"], values["session_idle"], values["shadow_min_calls"]) == (40, "2h", 30)
    assert (sources["max_sessions"], sources["session_idle"], sources["shadow_min_calls"],
            sources["reload_every"]) == ("flag", "file", "env", "default")
    # a flag typed at its default value is still a flag: it beats the environment
    values, sources = printed([*BASE[command], "--max-sessions", "100000"], env)
    assert (values["max_sessions"], sources["max_sessions"]) == (100_000, "flag")


def test_print_config_reads_back_and_never_prints_the_token(tmp_path):
    values, sources = printed([*BASE["serve"], "--max-sessions", "5"], {"PROFILER_ADMIN_TOKEN": "s3cret"})
    assert sources["admin_token"] == "env" and "admin_token" not in values
    assert "s3cret" not in run([*BASE["serve"], "--print-config"], {"PROFILER_ADMIN_TOKEN": "s3cret"}).output
    back = tmp_path / "back.toml"
    back.write_text(run([*BASE["serve"], "--max-sessions", "5", "--print-config"],
                        {"PROFILER_DRIFT_DROP": "0.2"}).stdout)
    assert resolve_settings(config=back, environ={}).settings == ServiceSettings(max_sessions=5, drift_drop=0.2)


@pytest.mark.parametrize("text, message", [
    ("max_sesions = 5\n", "unknown key 'max_sesions' (did you mean 'max_sessions'?)"),
    ("upstreams = 'http://x'\n", "unknown key 'upstreams'"),
    ('max_sessions = "5"\n', "key 'max_sessions' must be an integer, got '5' (str)"),
    ("max_sessions = true\n", "key 'max_sessions' must be an integer, got True (bool)"),
    ('drift_drop = "x"\n', "key 'drift_drop' must be a number"),
    ('reload_every = "soon"\n', "key 'reload_every': not a duration: 'soon'"),
    ("max_sessions = \n", "not valid TOML: Invalid value (at line 1, column 16)"),
])
@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_a_bad_config_file_is_one_line_naming_file_and_key(tmp_path, text, message, command):
    cfg = tmp_path / "service.toml"
    cfg.write_text(text)
    out = run([*BASE[command], "--config", str(cfg)])
    assert out.exit_code == 2
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: {cfg}: ") and message in lines[0], out.output
    assert "Traceback" not in out.output


def test_bad_environment_values_and_missing_files_name_their_source(tmp_path):
    for env, message in (
            ({"PROFILER_MAX_SESSIONS": "lots"}, "PROFILER_MAX_SESSIONS='lots': expected an integer"),
            ({"PROFILER_SESSION_IDLE": "soon"},
             "PROFILER_SESSION_IDLE: not a duration: 'soon' (examples: 30s, 10m, 1h, 250ms)")):
        out = run(BASE["serve"], env)
        assert out.exit_code == 2 and out.output.strip() == f"error: {message}", out.output
    out = run([*BASE["gateway"], "--refit-every", "soon"])
    assert out.exit_code == 2 and out.output.startswith("error: --refit-every: not a duration: 'soon'")
    out = run([*BASE["serve"], "--config", str(tmp_path / "absent.toml")])
    absent = tmp_path / "absent.toml"
    assert out.exit_code == 2 and out.output.strip() == f"error: {absent}: no such config file"


def test_every_setting_maps_from_its_environment_variable():
    non_default = {"str": "x1", "int": "17", "float": "0.25"}
    env, want = {}, {}
    for k in knobs():
        raw = "3m" if k.duration else ("on" if k.default is False else "off") if k.type is bool \
            else non_default[k.type.__name__]
        env[k.env] = raw
        want[k.name] = raw if k.type is str else (raw == "on") if k.type is bool else k.type(raw)
        assert want[k.name] != k.default, k.name
    env.update({"PROFILER_MAX_LINE_BYTES": "5", "UNRELATED": "1"})   # other variables are not settings
    assert settings_from_env(env) == want
    assert ServiceSettings(**settings_from_env(env)) == ServiceSettings(**want)
    # the variable documented before this object existed is the admin_token setting's
    assert settings_from_env({"PROFILER_ADMIN_TOKEN": "t"}) == {"admin_token": "t"}
    assert settings_from_env({"PROFILER_MAX_SESSIONS": ""}) == {}    # empty = unset


def _option(command: str, name: str):
    return next((p for p in CLI.commands[command].params if p.name == name), None)


def test_serve_and_gateway_take_every_setting_with_one_declaration():
    gateway_knobs = {k.name: k for k in knobs(GatewaySettings)}
    for k in knobs():
        serve, gateway = _option("serve", k.name), _option("gateway", k.name)
        if not k.flag_declared:        # a config key / environment variable only: no flag anywhere
            assert serve is None and gateway is None, k.name
            continue
        assert serve is not None and gateway is not None, k.name
        assert serve.opts == gateway.opts == [k.flag]
        # a bool can be turned off from the command line whatever its default
        assert serve.secondary_opts == gateway.secondary_opts == (
            [f"--no-{k.flag[2:]}"] if k.type is bool else [])
        assert serve.help == gateway.help == k.help
        assert (serve.default, gateway.default) == (k.default, gateway_knobs[k.name].default)
    for command, cls in (("serve", ServiceSettings), ("gateway", GatewaySettings)):
        text = run([command, "--help"]).output
        assert all(k.flag in text for k in knobs(cls) if k.flag_declared)
        assert "--config" in text and "--print-config" in text


@dataclasses.dataclass(frozen=True)
class _WithNewKnob(ServiceSettings):
    prefetch_budget: int = setting_field(3, "A knob added in one place.")


def test_a_knob_added_once_is_a_flag_of_every_command_and_reaches_each():
    """The mechanism serve and gateway use: one field, a flag (help, default), an env variable and
    a config key of every command built with it."""
    demo = typer.Typer()
    seen = {}
    def make(name: str):
        def command(workers: int = 1, *, settings: _WithNewKnob) -> None:
            seen[name] = settings
        return command

    for name in ("one", "two"):
        demo.command(name)(with_service_settings(make(name), cls=_WithNewKnob))
    runner = CliRunner()
    for name in ("one", "two"):
        assert "--prefetch-budget" in runner.invoke(demo, [name, "--help"], env={"COLUMNS": "400"}).output
        assert runner.invoke(demo, [name, "--prefetch-budget", "5"]).exit_code == 0
        assert seen[name].prefetch_budget == 5 and isinstance(seen[name], _WithNewKnob)
    assert runner.invoke(demo, ["one"], env={"PROFILER_PREFETCH_BUDGET": "8"}).exit_code == 0
    assert seen["one"].prefetch_budget == 8


def test_serve_and_gateway_build_their_service_from_the_same_settings(fitted_profile, tmp_path, monkeypatch):
    """Through the real commands (the server start itself is replaced, so no port is taken): a
    config file and the environment reach the shadow gate, the session table and uvicorn of both."""
    import uvicorn

    started = []
    monkeypatch.setattr(uvicorn, "run", lambda app_, **kw: started.append((app_, kw)))
    cfg = tmp_path / "service.toml"
    cfg.write_text('max_sessions = 1234\nsession_idle = "90s"\ndrift_drop = 0.2\nlog_level = "warning"\n'
                   'shadow_min_calls = 3\n')
    env = {"PROFILER_COVERAGE_WINDOW": "77", "PROFILER_HOST": "127.0.0.2"}
    for args in (["serve"], ["gateway", "--upstream", "http://127.0.0.1:9"]):
        out = run([*args, "--profile", str(fitted_profile), "--config", str(cfg), "--max-sessions", "1234"],
                  {**env, "PROFILER_RECOVER_DROP": "0.01"})
        assert out.exit_code == 0, out.output
    (sidecar, skw), (gateway, gkw) = started
    services = [sidecar.state.service, gateway.state.gateway.service]
    assert services[0].gate.options() == services[1].gate.options() == {
        "min_calls": 3, "window": 77, "min_window": 50, "drift_drop": 0.2, "recover_drop": 0.01,
        "max_unknown_types": 1000}
    tables = [s.predictor.sessions for s in services]
    assert [(t.max_sessions, t.session_idle_s) for t in tables] == [(1234, 90.0)] * 2
    assert [(kw["host"], kw["log_level"]) for kw in (skw, gkw)] == [("127.0.0.2", "warning")] * 2


def test_the_configuration_example_in_the_docs_loads(tmp_path):
    page = (ROOT / "docs" / "commands.md").read_text()
    section = page.split("## Configuration", 1)[1]
    example = re.search(r"```toml\n(.*?)```", section, re.S).group(1)
    cfg = tmp_path / "service.toml"
    cfg.write_text(example)
    got = resolve_settings(config=cfg, environ={})
    written = tomllib.loads(example)
    assert written and {k: getattr(got.settings, k) for k in written} == written
    assert all(got.sources[k] == "file" for k in written)
    # and every setting is a row of the page's table, its variable the prefix + its key
    for k in knobs(GatewaySettings):
        assert f"| `{k.name}` | {f'`{k.flag}`' if k.flag_declared else 'config / env only'} |" in section, k.name
        assert k.env == "PROFILER_" + k.name.upper() or k.env in page, k.env


def test_direct_construction_checks_durations():
    with pytest.raises(SettingsError, match="session_idle: not a duration"):
        ServiceSettings(session_idle="soon")


# --- simulate --scenario: every overridden flag is said, one line each ---------------------------

def test_scenario_announces_each_flag_it_overrides():
    args = ["simulate", "--scenario", "pythia-like", "--calibrate", "x.jsonl", "--replicas", "3",
            "--load", "low", "--seed", "1", "--policies", "no-such-policy"]
    out = run(args)
    assert out.exit_code == 2                      # stopped by the bad policy, after the notes
    notes = [ln for ln in out.output.splitlines() if ln.startswith("note:")]
    assert notes == [
        "note: --replicas is ignored by --scenario pythia-like (its cluster: 8 x llama-3.1-8b on "
        "h100-sxm tp1, pools code 4, explore 2, review 2, 150,000 KV tokens per replica, roofline "
        "step model)",
        "note: --calibrate is ignored by --scenario pythia-like (its cluster: 8 x llama-3.1-8b on "
        "h100-sxm tp1, pools code 4, explore 2, review 2, 150,000 KV tokens per replica, roofline "
        "step model)",
        "note: --load is ignored by --scenario pythia-like (a burst of 600 workflows in 60 s, all measured)",
    ]
    out = run(["simulate", "--scenario", "agent-platform-bursty", "--arrival-cv", "2",
               "--policies", "no-such-policy"],
              {"PROFILER_SIMULATE_WARMUP": "0.1", "PROFILER_SIMULATE_TRAIN_WORKFLOWS": "50"})
    notes = [ln for ln in out.output.splitlines() if ln.startswith("note:")]
    assert notes == ["note: train_workflows (env) is ignored by --scenario agent-platform-bursty (60 "
                     "generated train workflows per generated application)",
                     "note: --arrival-cv is ignored by --scenario agent-platform-bursty (CV 4)"]
    # a config key the scenario sets itself is announced too, with where it came from
    out = run(["simulate", "--scenario", "pythia-like", "--policies", "no-such-policy"],
              {"PROFILER_SIMULATE_HOST_RATIO": "4"})
    assert [ln for ln in out.output.splitlines() if ln.startswith("note: host_ratio")] == [
        "note: host_ratio (env) is ignored by --scenario pythia-like (its cluster: 8 x llama-3.1-8b on "
        "h100-sxm tp1, pools code 4, explore 2, review 2, 150,000 KV tokens per replica, roofline "
        "step model)"]
    # the old name is gone: --cv is eval's folds only
    out = run(["simulate", "--scenario", "agent-platform-bursty", "--cv", "2",
               "--policies", "no-such-policy"])
    assert out.exit_code == 2 and "No such option: --cv" in out.output
    # no scenario, no notes: --workload runs use every flag
    out = run(["simulate", "--workload", "coding-assistant", "--replicas", "3",
               "--policies", "no-such-policy"])
    assert out.exit_code == 2 and "note:" not in out.output


def test_every_overridden_name_is_a_simulate_option():
    """A renamed flag cannot drop out of the announcement unnoticed."""
    from simulator.scenarios import SCENARIOS

    from simulator.settings import SimulateSettings

    options = {p.name for p in CLI.commands["simulate"].params} | {k.name for k in knobs(SimulateSettings)}
    for sc in SCENARIOS.values():
        assert set(sc.overrides()) <= options, set(sc.overrides()) - options
        assert {"calibrate", "replicas", "workflows", "arrivals"} <= set(sc.overrides())


def test_gateway_only_settings_are_the_gateways_and_checked():
    """Issue 36: which engine API versions the upstreams speak is the gateway's alone."""
    own = {f.name for f in dataclasses.fields(GatewaySettings)} - \
        {f.name for f in dataclasses.fields(ServiceSettings)}
    assert {"dynamo_api", "sglang_sessions", "budget_ms", "routing", "session_end_p"} <= own
    for k in knobs(GatewaySettings):
        if k.name in own:
            assert (_option("gateway", k.name) is not None) is k.flag_declared, k.name
            assert _option("serve", k.name) is None, k.name
    got = resolve_settings(environ={"PROFILER_DYNAMO_API": "trajectory",
                                    "PROFILER_SGLANG_SESSIONS": "1"}, cls=GatewaySettings)
    assert (got.settings.dynamo_api, got.settings.sglang_sessions) == ("trajectory", True)
    assert got.sources["dynamo_api"] == "env"
    with pytest.raises(SettingsError, match="PROFILER_DYNAMO_API='sessions': expected one of session, "
                                            "trajectory, agent_context"):
        resolve_settings(environ={"PROFILER_DYNAMO_API": "sessions"}, cls=GatewaySettings)
    with pytest.raises(SettingsError, match="dynamo_api: 'sessions': expected one of session, "):
        GatewaySettings(dynamo_api="sessions")


def test_the_plugin_reads_its_awp_variables_through_the_same_mechanism():
    """Issue 38: the SGLang plugin's variables are settings fields with the prefix ``AWP_``; the
    names users set stay, each documented in docs/sglang.md with the default the field has."""
    from policies import KeepDropPolicy, PriorityPolicy
    from serving_hooks.sglang_plugin.settings import PLUGIN_ENV_VARS, PluginKnobs, PluginSettings

    assert set(PLUGIN_ENV_VARS) == {
        "AWP_SGLANG_PLUGIN", "AWP_PRIORITY_AGING_PER_S", "AWP_PRIORITY_AGING_PER_DURATION",
        "AWP_PRIORITY_SCALE", "AWP_KEEP_IDLE", "AWP_KEEP_MAX_TTL_S", "AWP_KEEP_MIN_REVISIT_P",
        "AWP_KEEP_LINEAGE", "AWP_PREFETCH", "AWP_PREFETCH_MIN_P", "AWP_PREFETCH_TRANSFER_TOK_S",
        "AWP_PREFETCH_DECODE_TOK_S", "AWP_DECISION_CLOCK", "AWP_STEP_S", "AWP_UNTAGGED",
        "AWP_LOG_EVERY_S", "AWP_SGLANG_DEBUG"}
    doc = (ROOT / "docs" / "sglang.md").read_text()
    assert all(f"| `{name}` |" in doc for name in PLUGIN_ENV_VARS)
    s = PluginSettings.from_env({})
    assert (s.enabled, s.priority, s.keep_drop) == (False, PriorityPolicy(), KeepDropPolicy())
    got = PluginSettings.from_env({"AWP_SGLANG_PLUGIN": "1", "AWP_PRIORITY_AGING_PER_DURATION": "0.03",
                                   "AWP_UNTAGGED": "off", "AWP_KEEP_LINEAGE": "agent", "AWP_STEP_S": ""})
    assert (got.enabled, got.priority.aging_per_duration, got.age_untagged, got.keep_drop.lineage,
            got.step_s) == (True, 0.03, False, "agent", PluginKnobs.step_s)
    assert PluginSettings.from_env({"AWP_PRIORITY_AGING_PER_DURATION": "off"}).priority.aging_per_duration is None
    for env, message in (({"AWP_KEEP_LINEAGE": "x"}, "AWP_KEEP_LINEAGE='x': expected one of session, agent"),
                         ({"AWP_STEP_S": "fast"}, "AWP_STEP_S='fast': expected a number"),
                         ({"AWP_PREFETCH": "maybe"}, "AWP_PREFETCH='maybe': expected true or false")):
        with pytest.raises(ValueError, match=re.escape(message)):
            PluginSettings.from_env(env)


def test_gateway_print_config_lists_every_gateway_setting_and_loads_back(tmp_path):
    """Issue 38: ``gateway --print-config`` is the whole gateway configuration (>= 35 keys), flags
    and config-only keys alike, as TOML that ``--config`` reads back to the same settings."""
    env = {"PROFILER_STRIP_METADATA": "1", "PROFILER_LOG_ROTATE_EVERY": "1m",
           "OTEL_EXPORTER_OTLP_ENDPOINT": ""}
    out = run([*BASE["gateway"], "--budget-ms", "7.5", "--routing", "capacity", "--refit-every", "10m",
               "--print-config"], env)
    assert out.exit_code == 0, out.output
    keys = set(re.findall(r"^#? ?(\w+)(?: =| unset)", out.stdout, re.M))
    assert keys == {k.name for k in knobs(GatewaySettings)} and len(keys) >= 35
    cfg = tmp_path / "gateway.toml"
    assert "allow_path = []" in out.stdout
    cfg.write_text(out.stdout.replace("allow_path = []", 'allow_path = ["/v1/rerank"]'))
    back = resolve_settings(config=cfg, environ={}, cls=GatewaySettings).settings
    want = resolve_settings(environ=env, cls=GatewaySettings,
                            flags={"budget_ms": 7.5, "routing": "capacity", "refit_every": "10m"}).settings
    assert back == dataclasses.replace(want, allow_path=("/v1/rerank",))
    assert (back.strip_metadata, back.log_rotate_every, back.budget_ms) == (True, "1m", 7.5)
    # config-only keys are no flags, and a list key reads from the environment comma-separated
    assert run([*BASE["gateway"], "--strip-metadata"]).exit_code == 2
    got = resolve_settings(environ={"PROFILER_ALLOW_PATH": "/v1/rerank, /v1/score"}, cls=GatewaySettings)
    assert got.settings.allow_path == ("/v1/rerank", "/v1/score")
    with pytest.raises(SettingsError, match="PROFILER_ROUTING='fastest': expected one of round-robin, capacity"):
        resolve_settings(environ={"PROFILER_ROUTING": "fastest"}, cls=GatewaySettings)


def test_gateway_options_take_their_defaults_from_the_settings():
    """One declaration per knob: the runtime options' defaults are the settings' (no twin literal)."""
    from serving_hooks.gateway import GatewayOptions
    from serving_hooks.retries import DEFAULT_WINDOW_S
    from serving_hooks.upstreams import DEFAULT_UPSTREAM_KEEPALIVE_S

    g, o = GatewaySettings(), GatewayOptions()
    assert (o.budget_s, o.upstream_timeout_s, o.upstream_keepalive_s, o.retry_window_s,
            o.max_request_bytes, o.body_timeout_s, o.stream_usage, o.dynamo_api) == \
        (g.budget_ms / 1000, g.upstream_timeout, g.upstream_keepalive, g.retry_window,
         g.max_request_bytes, g.body_timeout, g.stream_usage, g.dynamo_api)
    assert (DEFAULT_WINDOW_S, DEFAULT_UPSTREAM_KEEPALIVE_S) == (g.retry_window, g.upstream_keepalive)
    assert o.session_end.p_threshold == g.session_end_p


def test_every_command_settings_class_prints_and_reads_back_its_keys(tmp_path):
    """fit, simulate and replay keep their tuning knobs as config keys of the same mechanism:
    --print-config lists each, --config reads the print back, and the defaults are the runtime
    classes' (FitOptions is too heavy to import for --help: its defaults are held equal here)."""
    from fitting.profile_fit import FitOptions
    from profiler.commands.fit import FitSettings
    from serving_hooks.replay import ReplayOptions
    from serving_hooks.settings import ReplaySettings
    from simulator.autoscale import AutoscaleOptions
    from simulator.config import ClusterConfig
    from simulator.settings import SimulateSettings

    fo, fs = FitOptions(), FitSettings()
    assert (fs.prune, fs.seed, fs.max_output_tokens, fs.conditional, fs.forward_validation, fs.min_calls) == \
        (fo.prune, fo.seed, fo.max_output_tokens, fo.conditional, fo.forward_validation, fo.min_calls)
    ss, ao, cc = SimulateSettings(), AutoscaleOptions(), ClusterConfig()
    assert (ao.startup_delay_s, ao.interval_s, ao.scale_down_window_s, ao.queue_target, ao.horizon_calls) == \
        (ss.startup_delay, ss.autoscale_interval, ss.scale_down_window, ss.queue_target, ss.autoscale_horizon)
    assert (cc.host_ratio, cc.chunked_prefill_size, cc.max_running_requests) == \
        (ss.host_ratio, ss.chunked_prefill_size, ss.max_running_requests)
    ro, rs = ReplayOptions(), ReplaySettings()
    assert (ro.ignore_eos, ro.identity, ro.timeout_s) == (rs.ignore_eos, rs.identity, rs.timeout)
    for args, cls, env in ((["fit", "x.jsonl"], FitSettings, {"PROFILER_FIT_PRUNE": "0.1"}),
                           (["simulate", "--workload", "coding-assistant"], SimulateSettings,
                            {"PROFILER_SIMULATE_WARMUP": "0.3"}),
                           (["replay", "x.jsonl", "--target", "http://127.0.0.1:9"], ReplaySettings,
                            {"PROFILER_REPLAY_HEADERS": "a: 1,b: 2"})):
        out = run([*args, "--print-config"], env)
        assert out.exit_code == 0, out.output
        assert set(re.findall(r"^#? ?(\w+)(?: =| unset)", out.stdout, re.M)) == {k.name for k in knobs(cls)}
        cfg = tmp_path / f"{args[0]}.toml"
        cfg.write_text(out.stdout)
        assert resolve_settings(config=cfg, environ={}, cls=cls).settings == \
            resolve_settings(environ=env, cls=cls).settings
    out = run(["fit", "x.jsonl", "--print-config"], {"PROFILER_FIT_PRUNE": "0.9"})
    assert out.exit_code == 2 and "prune: 0.9 is not within [0, 0.5]" in out.output
