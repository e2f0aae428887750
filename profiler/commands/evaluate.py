"""`profiler eval`: score a profile on held-out logs, or cross-validate fit + eval by workflow."""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from profiler.commands.common import (GroupByOption, GroupPatternOption, JsonOption, ProfileOption,
                                      StrictOption, app)
from profiler.commands.common import console, err_console, fail, print_json, report_ingest


@app.command("eval", no_args_is_help=True)
def eval_(
    logs: Annotated[list[Path], typer.Argument(help="Held-out log files or folders (with --cv: all the logs).")],
    profile: Annotated[Optional[Path], ProfileOption("Profile root (or one version folder). Not with --cv.")] = None,
    cv: Annotated[Optional[int], typer.Option("--cv", help="K-fold cross-validation by workflow: fit on K-1 folds, score the K-th, K times; report mean ± spread.", min=2)] = None,
    seed: Annotated[int, typer.Option(help="With --cv: seed of the workflow-to-fold assignment.")] = 0,
    json_out: Annotated[bool, JsonOption("Print one JSON object with every score.")] = False,
    strict: Annotated[bool, StrictOption("Exit non-zero if any held-out record (with --cv: any record) is quarantined.")] = False,
    group_by: Annotated[Optional[str], GroupByOption("With --cv: keep the workflows sharing this record field (a task or instance id) in one fold.")] = None,
    group_pattern: Annotated[Optional[str], GroupPatternOption()] = None,
    online: Annotated[bool, typer.Option("--online", help="Replay the held-out calls in arrival order through the serving Predictor, feeding each finished call back (online calibration on), and score the band served before each call vs the static band and the per-agent empirical band; with the drift alarm per type (docs/evaluation.md).")] = False,
) -> None:
    """Score a profile on logs it never saw: output-length band coverage and width (vs one global
    band), tool-latency p95 coverage and KS distance, and (when the profile has automata)
    next-agent accuracy, path acceptance and remaining-calls error — with an "ours vs baselines"
    table (n/a where a score is not computed).

    Split logs by workflow first so no session is on both sides:
    `profiler split logs/ --out split/ && profiler fit split/train --out p/ && profiler eval --profile p/ split/test --json`

    For small data, `--cv K` does the split itself: K folds by workflow, a profile fit on each
    K − 1 (as `profiler fit` does, in a temporary folder) and scored on the rest; every score is
    reported as its mean over folds (weighted by calls) ± its standard deviation:
    `profiler eval --cv 5 datasets/real/agentless_pr28.jsonl`
    """
    from profiler.baseline_table import baseline_table

    if cv is not None:
        if profile is not None:
            fail("--cv fits its own profiles: drop --profile (or drop --cv to score that profile)")
        _cross_validate(logs, cv, seed, json_out, strict, group_by, group_pattern)
        return
    if group_by is not None or group_pattern is not None:
        fail("--group-by and --group-pattern choose the --cv folds: add --cv K")
    if profile is None:
        fail("give --profile (the profile to score) or --cv K (fit and score by K-fold cross-validation)")
    if online:
        _online(profile, logs, json_out, strict)
        return
    from profiler.evaluation import evaluate

    scored = _score(evaluate, profile, logs, json_out, strict)
    if scored is None:
        return
    prof, result = scored
    from rich.table import Table

    ol, tl = result["output_len"], result["tool_latency"]
    console.print(f"[bold]profile {prof.version}[/] on {result['calls']:,} calls / "
                  f"{result['workflows']:,} workflows")
    console.print(f"output length: coverage {ol['coverage']:.3f} (nominal {ol['nominal']:.3f}), "
                  f"mean width {ol['mean_width']:.0f} tokens vs {ol['global_band_width']:.0f} for one global band")
    for name, b in (ol.get("baselines") or {}).items():
        console.print(f"  baseline {name}: coverage {b['coverage']:.3f}, mean width {b['mean_width']:.0f} tokens",
                      highlight=False)
    t = Table(title_justify="left")
    for col in ("agent", "calls", "coverage", "mean width", "served by"):
        t.add_column(col)
    for key, v in ol["per_agent"].items():
        t.add_row(key, f"{v['calls']:,}", f"{v['coverage']:.3f}", f"{v['mean_width']:.0f}", v["level"])
    console.print(t)
    console.print(f"tool latency: p95 coverage {tl['p95_coverage']:.3f} (nominal 0.95), "
                  f"max KS distance {tl['ks_max']:.3f}")
    rest = {k: v for k, v in result.items()
            if k not in ("profile_version", "calls", "workflows", "output_len", "tool_latency")}
    if rest:
        console.print(scores_table(rest))
    console.print(baseline_table({"held-out": result}, title="ours vs baselines (same held-out calls)"))


def _score(scorer, profile: Path, logs: list[Path], json_out: bool, strict: bool):
    """Load the profile, score ``logs`` with ``scorer(profile, logs, strict=, progress=)`` (the
    held-out or the online eval), report the ingest; with ``--json`` print the result and return
    None, else return ``(profile, result)`` for the tables. Bad input exits with one line."""
    from store.ingest import IngestError
    from store.profile_artifact import ProfileError, load_profile

    try:
        prof = load_profile(profile)
        result, report = scorer(prof, logs, strict=strict, progress=not json_out)
    except (ProfileError, IngestError, ValueError) as exc:
        fail(str(exc))
    report_ingest(report, quiet=json_out and not report.quarantined)
    if json_out:
        print_json(result)
        return None
    return prof, result


def _online(profile: Path, logs: list[Path], json_out: bool, strict: bool) -> None:
    """`profiler eval --online`: :func:`profiler.online_eval.evaluate_online`, printed."""
    from profiler.online_eval import evaluate_online

    scored = _score(evaluate_online, profile, logs, json_out, strict)
    if scored is None:
        return
    prof, result = scored
    console.print(f"[bold]profile {prof.version}[/] online on {result['scored']:,} of {result['calls']:,} calls "
                  f"in arrival order (nominal {result['nominal']:.3f})")
    rows = [("online (served, calibrated)", result["online"]), ("static (fitted band)", result["static"]),
            *((f"baseline {k}", v) for k, v in result["baselines"].items())]
    for name, v in rows:
        worst = v.get("worst_window_coverage")
        console.print(f"  {name}: coverage {_scalar(v.get('coverage'))}, mean width {_scalar(v.get('mean_width'))} "
                      f"tokens" + (f", worst {result['window']}-call window {worst:.3f}" if worst is not None else ""),
                      highlight=False)
    ratio = result["width_vs_per_agent_empirical"]
    if ratio is not None:
        console.print(f"  online width / per-agent empirical width: {ratio:.3f}", highlight=False)
    for wt, a in result["drift_alarm"].items():
        state = (f"fired after {a['first_after']:,} outcomes" if a["fired"] else "quiet") + \
            (", on at the end" if a.get("alarm_at_end") else "")
        console.print(f"  drift alarm {wt}: {state}", highlight=False)
    ka = result.get("keep_alive")
    if ka and ka["gaps"]:
        console.print(f"  keep-alive TTL on {ka['gaps']:,} idle gaps (nominal {ka['nominal']:.2f}):", highlight=False)
        for name, v in (("online (served, calibrated)", ka["online"]), ("static (fitted TTL)", ka["static"])):
            console.print(f"    {name}: coverage {_scalar(v.get('coverage'))}, mean TTL {_scalar(v.get('mean_ttl_s'))} s, "
                          f"KV-s per covered gap {_scalar(v.get('kv_s_per_covered_gap'))}", highlight=False)


def _cross_validate(logs: list[Path], k: int, seed: int, json_out: bool, strict: bool,
                    group_by: str | None = None, group_pattern: str | None = None) -> None:
    """`profiler eval --cv K`: run :func:`profiler.cross_validation.cross_validate` and print it."""
    from profiler.baseline_table import baseline_table
    from profiler.cross_validation import cross_validate
    from store.ingest import IngestError

    try:
        if group_pattern is not None and group_by is None:
            raise ValueError("--group-pattern needs --group-by FIELD")
        result = cross_validate(logs, k, seed=seed, strict=strict, progress=True, group_by=group_by,
                                group_pattern=group_pattern)
    except (IngestError, ValueError) as exc:
        fail(str(exc))
    un = result["unassigned"]
    if un["records"]:
        err_console.print(f"[yellow]cv:[/] {un['records']:,} record(s) without a readable workflow_id left "
                          f"out of every fold, first: {', '.join(un['first'][:3])}", markup=True, highlight=False)
    bad = sum(f["quarantined"]["test"] for f in result["folds"])
    if bad:
        err_console.print(f"[yellow]ingest:[/] {bad:,} record(s) quarantined across the held-out folds "
                          "(`profiler ingest` on the logs says why; --strict makes this an error)")
    if json_out:
        print_json(result)
        return
    from rich.table import Table

    unit = f"group ({group_by}{' ~ ' + group_pattern if group_pattern else ''})" if group_by else "workflow"
    console.print(f"[bold]{k}-fold cross-validation by {unit}[/] (seed {seed}): "
                  f"{result['workflows']:,} workflows, {result['calls']:,} held-out calls")
    folds = Table(title="folds", title_justify="left")
    for col in ("fold", "train wf", "test wf", "test calls", "band coverage", "band width", "next-agent top-1"):
        folds.add_column(col, justify="right")
    for f in result["folds"]:
        r = f["result"]
        na = (r.get("next_agent") or {}).get("top1_accuracy")
        folds.add_row(str(f["fold"]), str(f["train_workflows"]), str(f["test_workflows"]), f"{r['calls']:,}",
                      f"{r['output_len']['coverage']:.3f}", f"{r['output_len']['mean_width']:,.0f}",
                      f"{na:.3f}" if isinstance(na, (int, float)) else "n/a")
    console.print(folds)
    s = result["summary"]
    tl = s.get("tool_latency.p95_coverage")
    if tl:
        console.print(f"tool latency: p95 coverage {tl['weighted_mean']:.3f} ± {tl['std']:.3f} (nominal 0.95)")
    console.print(baseline_table({f"mean ± std over {k} folds": result},
                                 title="ours vs baselines (same held-out calls in every fold)"))


def _scalar(v: Any) -> str:
    """A leaf value as people read it: 3 decimals for rates and small reals, thousands separators."""
    if isinstance(v, bool) or v is None:
        return str(v).lower() if isinstance(v, bool) else "n/a"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != v:
            return "n/a"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3f}"
    return str(v)


def score_rows(value: Any, path: tuple[str, ...] = ()) -> list[tuple[str, str, str]]:
    """(section, score, value) rows of a nested result: the section is the path of dict keys
    above the score (``keep_alive / by_workflow_type / agentless_repair``)."""
    if not isinstance(value, dict):
        return [(" / ".join(path[:-1]), path[-1] if path else "", _scalar(value))]
    if not value:
        return [(" / ".join(path), "(none)", "")]
    rows: list[tuple[str, str, str]] = []
    leaves = [(k, v) for k, v in value.items() if not isinstance(v, dict)]
    rows.extend((" / ".join(path), str(k), _scalar(v)) for k, v in leaves)
    for k, v in value.items():
        if isinstance(v, dict):
            rows.extend(score_rows(v, (*path, str(k))))
    return rows


def scores_table(sections: dict[str, Any]) -> Any:
    """Every other score of an eval result as one table (section, score, value), each section
    named once above its rows."""
    from rich.table import Table

    t = Table(title="scores by section", title_justify="left")
    t.add_column("section", overflow="fold")
    t.add_column("score", no_wrap=True)
    t.add_column("value", justify="right", overflow="fold")
    last = None
    for section, score, value in score_rows(sections):
        t.add_row(section if section != last else "", score, value)
        last = section
    return t


def readable_lines(key: str, value: Any, indent: int = 0) -> list[str]:
    """An eval result's section as indented ``key: value`` lines (the JSON is ``--json``): a
    mapping whose values are all scalars goes on one line, deeper ones nest below their key."""
    pad = "  " * indent
    if not isinstance(value, dict):
        return [f"{pad}{key}: {_scalar(value)}"]
    if not value:
        return [f"{pad}{key}: (none)"]
    if all(not isinstance(v, dict) for v in value.values()):
        return [f"{pad}{key}: " + ", ".join(f"{k} {_scalar(v)}" for k, v in value.items())]
    lines = [f"{pad}{key}:"]
    scalars = {k: v for k, v in value.items() if not isinstance(v, dict)}
    if scalars:
        lines.append(f"{pad}  " + ", ".join(f"{k} {_scalar(v)}" for k, v in scalars.items()))
    for k, v in value.items():
        if isinstance(v, dict):
            lines.extend(readable_lines(k, v, indent + 1))
    return lines

