"""K-fold cross-validation *by workflow* (``profiler eval --cv K``).

One 70/30 split of a small data set is noisy: with 40 workflows the test side holds 12, and one
odd session moves every score. K-fold cross-validation uses every workflow once as held-out data:

1. the distinct workflow ids are ordered by ``md5(seed:workflow_id)`` (deterministic, independent
   of file order) and dealt round-robin into K folds, so folds differ in size by at most one
   workflow and every call of a workflow lands in the same fold (no session on both sides);
2. for fold k, a profile is fit on the other K − 1 folds exactly as ``profiler fit`` does
   (:func:`fitting.profile_fit.fit_profile`, a fresh store in a temporary folder) and scored on fold
   k exactly as ``profiler eval`` does (:func:`scoring.evaluation.evaluate`);
3. every numeric leaf of the K eval results is aggregated (:func:`aggregate`): mean, sample
   standard deviation, min, max, and a *weighted* mean

   m_w = Σ_k w_k x_k / Σ_k w_k,

   where w_k is the count that the leaf is a rate over: the ``calls`` (or ``n``, ``n_workflows``…) of
   the nearest enclosing object that has one, else the fold's held-out calls. For a rate such as
   coverage this is the pooled rate over all held-out calls. Aggregation walks whatever keys
   ``evaluate`` returns, so keys added to the eval later are aggregated too.

**Grouped folds** (``group_by``/``group_pattern``, ``profiler eval --cv K --group-by FIELD``):
the unit dealt into folds is a group of workflows (the trials of one task), so no task is both
trained on and scored; the rule is :mod:`store.split`'s.

Records without a readable workflow id (invalid JSON, no ``workflow_id``) belong to no fold: they
are left out, counted and named by file and line (:func:`store.split.write_folds`); ``strict`` makes them an
error. Every other record is held out exactly once, so the quarantine counts of the K held-out
folds add up to the records the ingest rejected.
"""
from __future__ import annotations

import math
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from scoring.evaluation import evaluate
from fitting.profile_fit import FitOptions, fit_profile
from store.split import write_folds

#: Keys whose value, in an object, weighs that object's numeric leaves (first found wins).
WEIGHT_KEYS = ("calls", "n", "n_calls", "n_workflows", "n_prompts")


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
        and math.isfinite(float(v))


def numeric_leaves(obj: Any, weight: float, prefix: str = "") -> dict[str, tuple[float, float]]:
    """``{"a.b.c": (value, weight)}`` for every finite number in nested dicts (lists skipped).

    An object with a numeric ``calls``/``n``/``n_calls`` key passes that count down as the weight
    of its leaves; otherwise the parent's weight is inherited."""
    out: dict[str, tuple[float, float]] = {}
    if not isinstance(obj, dict):
        return out
    for key in WEIGHT_KEYS:
        if _is_number(obj.get(key)):
            weight = float(obj[key])
            break
    for key, value in obj.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(numeric_leaves(value, weight, path + "."))
        elif _is_number(value):
            out[path] = (float(value), weight)
    return out


def aggregate(fold_results: Sequence[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per numeric leaf (dotted path): ``mean``, ``std`` (ddof = 1; 0 for one fold),
    ``min``, ``max``, ``weighted_mean`` (see the module docstring) and ``folds`` (how many folds
    had a finite value there)."""
    leaves = [numeric_leaves(r, float(r.get("calls") or 1.0)) for r in fold_results]
    keys = sorted({k for leaf in leaves for k in leaf})
    summary: dict[str, dict[str, float]] = {}
    for key in keys:
        pairs = np.array([leaf[key] for leaf in leaves if key in leaf])
        x, w = pairs[:, 0], pairs[:, 1]
        summary[key] = {
            "mean": float(x.mean()),
            "std": float(x.std(ddof=1)) if len(x) > 1 else 0.0,
            "min": float(x.min()), "max": float(x.max()),
            "weighted_mean": float(np.average(x, weights=w)) if w.sum() > 0 else float(x.mean()),
            "folds": int(len(x)),
        }
    return summary


def nest(flat: dict[str, float]) -> dict[str, Any]:
    """``{"a.b": 1}`` → ``{"a": {"b": 1}}`` (the inverse of flattening the leaves)."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        node = out
        *head, last = key.split(".")
        for part in head:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):  # a leaf and an object at one path: keep the leaf
                break
        else:
            node[last] = value
    return out


def cross_validate(paths: Sequence[str | Path], k: int = 5, *, seed: int = 0,
                   options: FitOptions | None = None, strict: bool = False, progress: bool = False,
                   on_fold: Callable[[int], None] | None = None, group_by: str | None = None,
                   group_pattern: str | None = None) -> dict[str, Any]:
    """K-fold cross-validation by workflow of ``profiler fit`` + ``profiler eval`` on ``paths``
    (by group of workflows with ``group_by``/``group_pattern``, see the module docstring).

    ``strict`` as in ``profiler fit``/``eval``: a quarantined record fails the run.
    Returns ``{"k", "seed", "workflows", "calls", "folds": [{"fold", "train_workflows",
    "test_workflows", "train_records", "test_records", "quarantined": {"train", "test"}, "result"}],
    "unassigned": {"records", "first"} (records in no fold: no readable workflow id), "summary": {leaf: stats},
    "mean": <weighted means, nested like one eval result>}``."""
    folds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="profiler-cv-") as tmp:
        work = Path(tmp)
        unassigned: list[str] = []
        counts = write_folds(paths, work / "folds", k, seed, unassigned, group_by, group_pattern)
        if unassigned and strict:
            raise ValueError(f"{len(unassigned)} record(s) without a readable workflow_id (strict mode): "
                             + ", ".join(unassigned[:5]) + (" …" if len(unassigned) > 5 else ""))
        bar = _Bar(k, progress)
        with bar:
            for row in counts:
                i = row["fold"]
                fold_dir = work / "folds" / f"fold{i}"
                bar.update(f"fold {i + 1}/{k}: fit on {row['train_workflows']} workflows")
                try:
                    profile, fit_report = fit_profile([fold_dir / "train"], work / f"profile{i}", options=options,
                                             strict=strict)
                    bar.update(f"fold {i + 1}/{k}: eval on {row['test_workflows']} workflows")
                    result, eval_report = evaluate(profile, [fold_dir / "test"], strict=strict)
                except ValueError as exc:
                    raise ValueError(f"cross-validation fold {i + 1}/{k}: {exc}") from None
                except Exception as exc:  # a crash of fit/eval itself: say which fold, keep the type
                    exc.add_note(f"in cross-validation fold {i + 1}/{k} (fit on {fold_dir / 'train'})")
                    raise
                row["quarantined"] = {"train": fit_report.quarantined, "test": eval_report.quarantined}
                folds.append({**row, "result": result})
                bar.advance()
                if on_fold is not None:
                    on_fold(i)
    summary = aggregate([f["result"] for f in folds])
    return {
        "k": k, "seed": seed, "group_by": group_by, "group_pattern": group_pattern,
        "workflows": sum(f["test_workflows"] for f in folds),
        "calls": sum(int(f["result"]["calls"]) for f in folds),
        "folds": folds,
        "unassigned": {"records": len(unassigned), "first": unassigned[:10]},
        "summary": summary,
        "mean": nest({key: s["weighted_mean"] for key, s in summary.items()}),
    }


class _Bar:
    """A rich progress bar over folds on stderr (nothing when ``enabled`` is false)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total, self.enabled = total, enabled

    def __enter__(self) -> "_Bar":
        if self.enabled:
            self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TimeElapsedColumn(), console=Console(stderr=True), transient=True)
            self._progress.__enter__()
            self._task = self._progress.add_task("cross-validation", total=self.total)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.enabled:
            self._progress.__exit__(*exc)

    def update(self, description: str) -> None:
        if self.enabled:
            self._progress.update(self._task, description=description)

    def advance(self) -> None:
        if self.enabled:
            self._progress.advance(self._task)
