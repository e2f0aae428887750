"""`profiler simulate`: replay agent workflows on a simulated serving cluster, policy by policy."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from profiler.commands.common import JsonOption, ProfileOption, app
from profiler.commands.common import console, err_console, fail, print_json
from profiler.commands.service_options import with_service_settings
from serving_hooks.settings import Resolved
from simulator.settings import SimulateSettings


@app.command(no_args_is_help=True)
@with_service_settings(cls=SimulateSettings, resolved=True)
def simulate(
    ctx: typer.Context,
    workload: Annotated[Optional[str], typer.Option(
        help="coding-assistant, deep-research (generated), or a log file/folder (replayed).")] = None,
    scenario: Annotated[Optional[str], typer.Option(
        help="A named scenario instead of --workload: pythia-like (multi-model pools, a burst "
             "of 600 workflows), agent-platform (six applications from the bundled real sets "
             "and the generators on one cluster, a burst of 720 workflows), "
             "agent-platform-bursty (the same mix, open-loop gamma arrivals with CV 4 at "
             "low load) or agent-platform-interactive (the mix plus 20 % interactive Claude "
             "Code / Codex sessions with human waits: their TTFT against the ttft_slo config key); see "
             "docs/simulator.md.")] = None,
    load: Annotated[str, typer.Option(
        help="low, medium, peak: 0.5 / 1.0 / 1.5 × the rate a KV-saturated cluster drains "
             "(see README); a number; or a comma list (e.g. low,medium,peak).")] = "peak",
    policies: Annotated[Optional[str], typer.Option(
        help="Comma list of policies (default: sglang-default, least-load, autellix-plas, "
             "continuum-ttl, mori-idleness, belady, ours). Also: the session baselines "
             "sglang-sticky, sglang-session-close, thunderagent, and every name of the policy "
             "table in docs/simulator.md.")] = None,
    ablation: Annotated[bool, typer.Option(
        "--ablation", help="Also run ours with each part switched off (and ours-sticky, ours-belady).")] = False,
    autoscale: Annotated[str, typer.Option(
        help="Autoscaling of the model pools: off, reactive (Kubernetes HPA rule on waiting calls "
             "per replica), predictive (Pythia alg. 4 on the live sessions' projected calls, the "
             "sidecar's GET /v1/autoscale), or a comma list: each policy then runs once per mode "
             "(rows NAME+reactive, NAME+predictive). A policy name may carry its own, e.g. "
             "--policies ours+predictive. Replicas move between pools (a start-up delay, drains) "
             "within the cluster's replicas; without a --scenario every replica is one pool. "
             "See docs/simulator.md.")] = "off",
    as_json: Annotated[bool, JsonOption("Print one JSON object instead of tables.")] = False,
    plot: Annotated[Optional[Path], typer.Option(help="Write a PNG of JCT vs load per policy here.")] = None,
    markdown: Annotated[Optional[Path], typer.Option(help="Also write the tables as Markdown here.")] = None,
    workflows: Annotated[Optional[int], typer.Option(
        help="Workflows replayed (generated: test workflows; logs: the test split resampled to "
             "this many sessions). Default: 2 × the sessions of the highest load (≥ 100).", min=1)] = None,
    profile: Annotated[Optional[Path], ProfileOption(
        help="Folder for the train-split profiles: a `profiler fit` output is used as is; else "
             "each train split is fit in its own sub-folder there and reused by a later run on "
             "the same split (default: a temporary folder).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the split, generation and arrivals.")] = 0,
    arrivals: Annotated[str, typer.Option(
        help="poisson, gamma (bursty: --arrival-cv), trace (recorded spacing), closed (a fixed "
             "population of sessions), or burst (a scenario's burst).")] = "poisson",
    arrival_cv: Annotated[float, typer.Option(
        help="--arrivals gamma: coefficient of variation of inter-arrivals (0 fixed, 1 Poisson, "
             "4 bursty).", min=0.0)] = 1.0,
    seeds: Annotated[Optional[str], typer.Option(
        help="Comma list of arrival seeds (e.g. 0,1,2): one replay per seed; the JSON's `seeds` "
             "holds every seed's figures and the spread of the ratio vs sglang-default.")] = None,
    replicas: Annotated[int, typer.Option(help="Engine replicas.", min=1)] = 4,
    gpu: Annotated[str, typer.Option(help="GPU of a replica: h100-sxm or h200 (roofline step model).")] = "h100-sxm",
    model: Annotated[str, typer.Option(help="Served model: llama-3.1-8b or llama-3.1-70b.")] = "llama-3.1-8b",
    tp: Annotated[int, typer.Option(help="GPUs per replica (tensor parallel).", min=1)] = 1,
    kv_capacity_tokens: Annotated[Optional[int], typer.Option(
        help="GPU KV capacity per replica, tokens (default: from --gpu/--model).", min=1000)] = None,
    calibrate: Annotated[Optional[Path], typer.Option(
        help="Fit the step-time model on these logs (needs t_first_token) instead of the bundled "
             "SWE-agent/GLM-4.5 fit.")] = None,
    slo_search: Annotated[bool, typer.Option(
        "--slo-search",
        help="Also search, per policy, the most concurrent sessions it holds with >= 99 % of "
             "interactive calls within ttft_slo (the same workflows at 1x the arrival rate, "
             "doubled while the target holds or halved while it does not, 1/16x..8x, then two "
             "bisections): interactive.max_sessions_in_slo, and each rate factor tried with "
             "its attainment and concurrency in interactive.slo_search. Several extra runs "
             "per policy.")] = False,
    *,
    settings: Resolved,
) -> None:
    """Compare serving policies on the same workflows, arrivals and cluster, in one run.

    A discrete-event simulator of an SGLang-like cluster (continuous batching, chunked prefill,
    a radix prefix cache per replica with a GPU and a host tier, preemption with recompute)
    replays the workflows closed-loop: each call is issued when its parents finish plus the tool
    gap. The profile that drives `ours` is fit on a train split (logs) or on workflows generated
    with another seed, and the replay uses only the test side. `ours` drives the policy objects
    of `policies`, exactly as the SGLang plugin does.

    Example: `profiler simulate --workload coding-assistant --load low,medium,peak --plot jct.png`

    Prints one table per load (JCT, throughput, TTFT, prefix hits per tier, recomputed prefill
    and its ratio to Bélády, preemptions, GPU idle time); `--json` prints one object whose
    `policies` holds the highest load's figures per policy.
    """
    from dataclasses import replace

    from rich.progress import Progress

    from policies import CapacityPolicy, PriorityPolicy
    from simulator.autoscale import AutoscaleOptions
    from simulator.calibration import fit_step_time
    from simulator.config import glm45_fit_config, hardware_config
    from simulator.ours import OursOptions
    from simulator.report import json_view, markdown as to_markdown, plot_jct_vs_load, tables
    from simulator.runner import (compare, compare_seeds, parse_load, parse_policies, prepare,
                                  prepare_scenario)
    from simulator.scenarios import get_scenario

    cv, sources, st = arrival_cv, settings.sources, settings.settings
    train_share, warmup, tail, gaps, step_model = (st.train_share, st.warmup, st.tail, st.gaps,
                                                   st.step_model)
    if (workload is None) == (scenario is None):
        fail("give --workload or --scenario (one of them)")
    if scenario is not None:   # every flag the scenario sets itself, given anyway: said, not dropped
        try:
            overrides = get_scenario(scenario).overrides()
        except ValueError as exc:
            fail(str(exc))
        for name, instead in overrides.items():
            if getattr(ctx.get_parameter_source(name), "name", None) == "COMMANDLINE":
                given = f"--{name.replace('_', '-')}"
            elif sources.get(name, "default") != "default":     # a config key, set by env or file
                given = f"{name} ({sources[name]})"
            else:
                continue
            err_console.print(f"[yellow]note:[/] {given} is ignored by --scenario {scenario} "
                              f"({instead})", soft_wrap=True)
    try:
        names = parse_policies(policies, ablation, autoscale)
        levels = [v.strip() for v in load.split(",") if v.strip()]
        for level in levels:
            parse_load(level)
    except ValueError as exc:
        fail(str(exc))
    knobs = dict(replicas=replicas, kv_capacity_tokens=kv_capacity_tokens, host_ratio=st.host_ratio,
                 pcie_s_per_token=st.pcie_s_per_token, chunked_prefill_size=st.chunked_prefill_size,
                 max_running_requests=st.max_running_requests)
    try:
        if scenario is not None:
            cfg = None                # the scenario's own (prepare_scenario below)
        elif step_model == "glm45-fit":
            cfg = glm45_fit_config(**{k: v for k, v in knobs.items() if v is not None})
        elif step_model == "roofline":
            cfg = hardware_config(gpu, model, tp, **knobs)
        else:
            raise ValueError(f"--step-model {step_model!r}: use roofline or glm45-fit")
    except ValueError as exc:
        fail(str(exc))
    if calibrate is not None and scenario is None:
        from simulator.sources import load_logs

        try:
            src = load_logs([calibrate], train=0.5)   # the split is irrelevant here: all records
            cfg = replace(cfg, step=fit_step_time(src.train + src.test, source=str(calibrate)))
        except ValueError as exc:
            fail(f"--calibrate {calibrate}: {exc}")
        err_console.print(f"step model fit on {calibrate}: {cfg.step}")
    scale = AutoscaleOptions(startup_delay_s=st.startup_delay, interval_s=st.autoscale_interval,
                             scale_down_window_s=st.scale_down_window, queue_target=st.queue_target,
                             horizon_calls=st.autoscale_horizon)
    ours = OursOptions()
    if st.ours_epsilon is not None:
        ours = replace(ours, capacity_policy=CapacityPolicy(epsilon=st.ours_epsilon))
    if st.ours_aging_per_s is not None:
        ours = replace(ours, priority_policy=PriorityPolicy(aging_per_s=st.ours_aging_per_s))

    with err_console.status("preparing the workload (split, fit the train profile)"):
        try:
            if scenario is not None:
                prep, cfg = prepare_scenario(scenario, seed=seed, n_train=st.train_workflows,
                                             profile_dir=profile)
                arrivals = prep.scenario.arrivals
                if arrivals != "burst":       # an open-loop scenario: its own load and CV
                    levels, cv = [prep.scenario.load], prep.scenario.cv
            else:
                prep = prepare(workload, workflows, seed=seed, profile_dir=profile,
                               train_share=train_share, n_train=st.train_workflows, cfg=cfg,
                               max_load=max(parse_load(v) for v in levels))
        except ValueError as exc:
            fail(str(exc))
    for note in prep.notes:
        err_console.print(f"[yellow]note:[/] {note}")

    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task("simulating", total=len(levels) * len(names))

        def done(level: str, name: str, row: dict) -> None:
            bar.update(task, advance=1, description=f"{level}: {name} avg JCT {row['avg_jct_s']:.0f}s")

        try:
            kw = dict(arrivals_mode=arrivals, gaps_mode=gaps, on_result=done, ours=ours, cv=cv,
                      warmup=warmup, tail=tail, autoscale=scale, ttft_slo=st.ttft_slo,
                      slo_search=slo_search)
            if seeds:
                seed_list = [int(x) for x in seeds.split(",") if x.strip()]
                bar.update(task, total=len(levels) * len(names) * len(seed_list))
                result = compare_seeds(prep, names, levels, cfg, seed_list, **kw)
            else:
                result = compare(prep, names, levels, cfg, **kw)
        except ValueError as exc:
            fail(str(exc))
    if plot is not None:
        plot_jct_vs_load([result], plot)
        err_console.print(f"plot written to {plot}")
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(to_markdown(result))
    if as_json:
        print_json(json_view(result))
        return
    tables(result, console)
    console.print(f"{result['saturating_sessions']:.0f} sessions fill the GPU KV (a session holds "
                  f"{result['session']['session_kv_tokens']:,.0f} KV tokens on average); profile "
                  f"{result['profile_version']} fit on the train split only.")
