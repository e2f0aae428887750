"""`profiler fit`: logs → DuckDB store → profile."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, ClassVar, Optional

import typer

from profiler.commands.common import (DbOption, GroupByOption, GroupPatternOption, JsonOption,
                                      StrictOption, app)
from profiler.commands.common import err_console, fail, print_json, report_ingest
from profiler.commands.service_options import with_service_settings
from serving_hooks.settings import SettingsError, check_settings, setting_field


def _fresh_root_command(logs: list[Path], out: Path, different: Path) -> str:
    """The command that fits ``logs`` into a new root beside ``out``, named after the different
    log (``profile`` + ``split/train`` → ``profile-train``), one that does not exist yet."""
    import shlex

    stem = f"{out.name}-{different.name}" if different.name else f"{out.name}-2"
    candidate, n = out.parent / stem, 2
    while candidate.exists():
        candidate, n = out.parent / f"{stem}-{n}", n + 1
    return shlex.join(["profiler", "fit", *map(str, logs), "--out", f"{candidate}/"])


PANEL_FIT = "Fit tuning (--config keys, PROFILER_FIT_* env; --print-config)"


@dataclass(frozen=True)
class FitSettings:
    """``profiler fit``'s tuning knobs: config keys (``fit --config FILE``) and ``PROFILER_FIT_*``
    variables, not flags. Their defaults are ``fitting.profile_fit.FitOptions``' (a test holds the
    two equal: that module is too heavy to import for ``--help``)."""

    env_prefix: ClassVar[str] = "PROFILER_FIT_"
    config_panel: ClassVar[str] = PANEL_FIT

    prune: float = setting_field(0.05, "Drop automaton transitions rarer than this probability (0-0.5).",
                                 panel=PANEL_FIT, flag=False)
    seed: int = setting_field(0, "Seed of the calibration splits.", panel=PANEL_FIT, flag=False)
    max_output_tokens: Optional[int] = setting_field(
        None, "Hard cap on any output length (the requests' max_tokens or the context limit): the "
              "ceiling of every band and U(alpha); unset: twice the largest observed length.",
        panel=PANEL_FIT, flag=False)
    conditional: bool = setting_field(
        True, "Use the history-conditioned (CQR) length model where validation picks it (false: never).",
        panel=PANEL_FIT, flag=False)
    forward_validation: bool = setting_field(
        True, "Check the next-agent and remaining-calls choices on the latest fifth of each type's "
              "training workflows by start time (fitted on the rest); the CV choice gives way where "
              "that slice shows it behind beyond noise; the keep-alive TTL likewise gives way to the "
              "pooled per-type quantile, and the remaining-tokens ranking to the position median or mrl "
              "where they rank concurrent sessions better forward in time. false: shuffled folds alone.",
        panel=PANEL_FIT, flag=False)
    min_calls: int = setting_field(
        50, "No effect on a new profile: each band is chosen by held-out validation, not by a call "
            "count (recorded in the profile's parameters).", panel=PANEL_FIT, flag=False)
    ray_address: Optional[str] = setting_field(
        None, "With --engine ray: address of a running Ray cluster (unset: start a local one).",
        panel=PANEL_FIT, flag=False)

    def __post_init__(self) -> None:
        check_settings(self)
        if not 0.0 <= self.prune <= 0.5:
            raise SettingsError(f"prune: {self.prune!r} is not within [0, 0.5]")
        if self.max_output_tokens is not None and self.max_output_tokens < 1:
            raise SettingsError(f"max_output_tokens: {self.max_output_tokens!r} is below 1")


@app.command(no_args_is_help=True)
@with_service_settings(cls=FitSettings)
def fit(
    logs: Annotated[list[Path], typer.Argument(help="Log files or folders (JSONL, JSONL.gz, Parquet, CSV; flat or gateway records).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile root folder (created; new versions are added to it).")] = Path("profile"),
    db: Annotated[Optional[Path], DbOption("DuckDB store to load into (default: OUT/store.duckdb).")] = None,
    coverage: Annotated[float, typer.Option(help="Target coverage of the output-length bands.", min=0.5, max=0.9999)] = 0.99,
    order_only: Annotated[bool, typer.Option("--order-only", help="Fit from token counts and call order alone: no time model (tool latency, keep-alive TTLs, call latency). Chosen by itself when no call has real times (timing: synthetic_order).")] = False,
    log_format: Annotated[Optional[str], typer.Option("--format", help="Read traces of another tool instead of our log format: auto, otel, swe-agent, mini-swe-agent, openhands, dynamo, atif, claude-code, codex or tracelab (converted into OUT/imported/FORMAT/ first; see `profiler import`).")] = None,
    engine: Annotated[str, typer.Option(help="local (DuckDB in this process) or ray (ingest and per-workflow-type fits as Ray tasks; needs `pip install -e .[ray]`).")] = "local",
    strict: Annotated[bool, StrictOption("Exit non-zero if any record is quarantined.")] = False,
    group_by: Annotated[Optional[str], GroupByOption("Keep the workflows sharing this record field (a task or instance id) in one fold of the fit's own selection CVs (remaining work, output-length bands); default: fold by workflow.")] = None,
    group_pattern: Annotated[Optional[str], GroupPatternOption()] = None,
    append: Annotated[bool, typer.Option("--append", help="Add LOGS to a profile root fitted on other logs (without it such a fit is refused: the two would merge).")] = False,
    json_out: Annotated[bool, JsonOption("Print the new profile's manifest as JSON.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress output.")] = False,
    *,
    settings: FitSettings,
) -> None:
    """Ingest request logs and fit a **profile**: per-agent output-length bands, per-tool latency
    lognormals, per-agent timings and the workflow automata.

    Logs accumulate in the DuckDB store: re-running on the same files adds nothing, new files add
    their calls, and the new profile version is fit on everything in the store. A log other than
    the ones the root was fitted on (another path, not inside their folders) is refused unless
    `--append`: two splits fitted into one `--out` would otherwise merge.

    Example: `profiler fit logs/ --out profile/ && profiler show --profile profile/`
    """
    from rich.markup import escape

    from store.data_limits import summary_lines
    from fitting.profile_fit import FitOptions, NoValidCallsError, fit_profile
    import duckdb

    from store.ingest import IngestError
    from store.duckdb_store import StoreError, one_line_error

    st = settings
    options = FitOptions(coverage=coverage, prune=st.prune, seed=st.seed, min_calls=st.min_calls,
                         conditional=st.conditional, max_output_tokens=st.max_output_tokens,
                         order_only=order_only, forward_validation=st.forward_validation)
    if group_pattern is not None and group_by is None:
        fail("--group-pattern needs --group-by FIELD")
    if group_by is not None:
        from store.split import call_group_sql
        try:
            call_group_sql(group_by, group_pattern)
        except ValueError as exc:
            fail(str(exc))
        if engine == "ray":
            fail("--group-by works with --engine local only")
        options.group_by, options.group_pattern = group_by, group_pattern
    if engine not in ("local", "ray"):
        fail(f"--engine must be local or ray, got {engine!r}")
    from store.log_sources import DifferentLogError, check_sources, record_sources
    from store.profile_artifact import store_path

    try:
        sources = check_sources(out, store_path(out, db), logs, append=append)
    except DifferentLogError as exc:
        fail(f"{exc}: type `{_fresh_root_command(logs, out, exc.path)}`, or the same command with --append")
    try:
        if log_format is not None:
            from store.importers import ImportFormatError, convert

            target = out / "imported" / log_format
            try:
                conversion = convert(log_format, logs, target, strict=strict, progress=not quiet)
            except ImportFormatError as exc:
                fail(str(exc))
            if not quiet:
                err_console.print(f"converted {conversion.records:,} {log_format} records into {target}"
                                  + (f" ({len(conversion.errors)} problems skipped)" if conversion.errors else ""))
            logs = [target]
        if engine == "ray":
            try:
                from fitting.distributed import fit_profile_ray
            except ImportError as exc:
                fail(f"--engine ray needs Ray: pip install -e '.[ray]' ({exc})")
            profile, report = fit_profile_ray(logs, out, db=db, options=options, strict=strict,
                                              progress=not quiet, address=st.ray_address)
        else:
            profile, report = fit_profile(logs, out, db=db, options=options, strict=strict,
                                          progress=not quiet)
    except NoValidCallsError as exc:  # every record refused: say why, like a partial ingest does
        reasons = exc.report.first_reasons
        if reasons:
            err_console.print(f"  first reasons ({min(len(reasons), 5)} of {exc.report.quarantined} refused records):")
            for reason in reasons[:5]:
                err_console.print(f"    {reason}", markup=False, highlight=False)
        fail(str(exc))
    except (IngestError, ValueError, KeyError) as exc:
        fail(str(exc))
    except (StoreError, OSError, duckdb.Error) as exc:  # lock conflict, read-only store or folder, full disk
        message = one_line_error(exc, db or out)
        if message is None:
            raise
        fail(message)
    record_sources(out, sources)
    report_ingest(report, quiet)
    if json_out:
        print_json(profile.manifest)
    elif not quiet:
        c = profile.manifest["counts"]
        err_console.print(
            f"[green]profile {profile.version}[/] written to {profile.path} "
            f"({c['calls']:,} calls, {c['workflows']:,} workflows, {c['workflow_types']} workflow types)")
        limits = profile.data.get("limitations") or {}
        if limits.get("timing") == "order_only":
            err_console.print("[yellow]order-only fit[/] (token counts and call order; no real times"
                              + (", --order-only" if order_only else "") + ")")
        for line in summary_lines(limits):
            err_console.print(f"  [yellow]{escape(line)}[/]", highlight=False)
