"""Where a simulation's calls and its profile come from — with no leakage between the two.

* **A log folder** (any format ``profiler fit`` reads): the records are ingested with the store's
  own validation into an in-memory DuckDB (:func:`load_logs`), then split *by workflow* with the
  rule of ``profiler split`` (``md5(seed:workflow_id) mod 10 000 < train × 10 000``). The profile
  is fit on the train side; the replay uses the test side only.
* **A generated workload** (``coding-assistant``, ``deep-research``): the train logs and the test
  logs come from ``store.workloads.generate`` with *different seeds*, so no replayed workflow
  was seen by the fit. The spec's per-agent ``system_tokens`` give the shared system prompts.

* **A mix of applications** (:func:`mixed`, ``--scenario agent-platform``): each application
  split on its own by the rules above; the profile is fit on the union of their train sides.

The profile is fit with the lead's path (``fitting.profile_fit.fit_profile``) into a folder (a temp
folder unless ``profile_dir`` is given; a later run on the same train split reuses it), and loaded
by a ``predictors.Predictor``.
"""
from __future__ import annotations

import atexit
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from predictors.predictor import Predictor
from fitting.profile_fit import fit_profile
from store.profile_artifact import CURRENT_FILE, load_profile
from store.ingest import discover_all, ingest
from store.duckdb_store import connect
from store.workloads import generate, load_spec
from synth.sequences import STAGE_SQL
from simulator.workload import renamed, replicate_records

#: Built-in generated workloads (command-line names → ``store.workloads`` spec names).
BUILTIN = {"coding-assistant": "coding_assistant", "deep-research": "deep_research",
           "coding_assistant": "coding_assistant", "deep_research": "deep_research",
           "claude-code-interactive": "claude_code_interactive",
           "codex-interactive": "codex_interactive"}

_CALL_SQL = """
SELECT request_id, workflow_type_id, workflow_id, agent_id, t_arrival, t_first_token, t_finish,
       input_tokens, output_tokens, parent_request_ids, tool_names, status,
       TRY_CAST(json_extract(extra, '$.num_workers') AS INTEGER) AS num_workers,
       TRY_CAST(json_extract(extra, '$.t_last_chunk') AS DOUBLE) AS t_last_chunk,
       """ + STAGE_SQL + """ AS stage
FROM calls {where} ORDER BY workflow_id, t_arrival, request_id
"""


@dataclass
class Source:
    """Train and test records of one workload, and what the replay needs to know about them."""

    name: str
    train: list[dict]
    test: list[dict]
    system_tokens: dict[str, int] = field(default_factory=dict)
    generated: bool = False
    notes: list[str] = field(default_factory=list)
    #: Workflow types replayed with conversation lineage (None: all when logged, none when
    #: generated; a mix sets its logged applications' types).
    lineage_types: set[str] | None = None
    #: A mix: per application, its workflow types and how many workflows it has on each side.
    parts: list[dict] = field(default_factory=list)


def _rows_to_records(rows: list[tuple], cols: list[str]) -> list[dict]:
    out = []
    for row in rows:
        rec = dict(zip(cols, row))
        rec["tool_calls"] = [{"name": n} for n in (rec.pop("tool_names") or [])]
        if rec.get("parent_request_ids") is None:
            rec.pop("parent_request_ids", None)
        for k in ("num_workers", "t_last_chunk", "t_first_token", "stage"):
            if rec.get(k) is None:
                rec.pop(k, None)
        out.append(rec)
    return out


def load_logs(paths: Sequence[str | Path], train: float = 0.7, seed: int = 0,
              progress: bool = False) -> Source:
    """Ingest log files/folders and split them by workflow (see the module docstring)."""
    con = connect(None)
    try:
        report = ingest(con, [str(p) for p in paths], progress=progress)
        cut = int(round(train * 10000))
        side = f"(md5_number({int(seed)} || ':' || workflow_id) % 10000 < {cut})"
        res = {}
        for name, cond in (("train", side), ("test", f"NOT {side}")):
            cur = con.execute(_CALL_SQL.format(where=f"WHERE {cond}"))
            cols = [d[0] for d in cur.description]
            res[name] = _rows_to_records(cur.fetchall(), cols)
    finally:
        con.close()
    name = ", ".join(Path(p).name or str(p) for p in paths)
    src = Source(name, res["train"], res["test"])
    if report.quarantined:
        src.notes.append(f"{report.quarantined} records quarantined at ingestion (not replayed)")
    if not src.train and not src.test:
        _, links = discover_all(paths)
        why = (f": {len(links)} symbolic link(s) lead outside the folder and are not followed (e.g. "
               f"{links[0][0]} -> {links[0][1]}); copy the files in or name them directly" if links
               else "; see `profiler fit` for what the ingest reported")
        raise ValueError(f"no call of {name} could be read{why}")
    if not src.test:
        raise ValueError(f"no workflow of {name} fell in the test split (train share {train}); "
                         "give more workflows or a smaller --train")
    return src


def generated(workload: str, n_train: int, n_test: int, seed: int = 0) -> Source:
    """Train/test records of a built-in generated workload (different seeds: no leakage)."""
    spec_name = BUILTIN[workload]
    spec = load_spec(spec_name)
    train = list(generate(spec, n_train, seed=seed, with_text=False, arrival_rate=1.0)) if n_train else []
    test = list(generate(spec, n_test, seed=seed + 1_000_003, with_text=False, arrival_rate=1.0)) if n_test else []
    sys_tokens = {f"{spec['workflow_type_id']}/{a}": int(v.get("system_tokens", 0))
                  for a, v in spec["agents"].items()}
    return Source(workload, train, test, sys_tokens, generated=True)


def _tag(records: Sequence[dict], app: str) -> list[dict]:
    """Copies of ``records`` with ``app:`` before every workflow and request id (parents too), so
    applications mixed on one cluster never share a session or a request id."""
    return [renamed(r, lambda x: f"{app}:{x}") for r in records]


def shares_to_counts(shares: Sequence[float], n: int) -> list[int]:
    """``n`` split in proportion to ``shares`` (largest remainder; each part at least 1)."""
    w = np.asarray(shares, dtype=float)
    if len(w) == 0 or (w <= 0).any():
        raise ValueError("a mix needs positive shares")
    exact = w / w.sum() * n
    counts = np.maximum(np.floor(exact).astype(int), 1)
    for i in np.argsort(-(exact - np.floor(exact)), kind="stable"):
        if counts.sum() >= n:
            break
        counts[i] += 1
    return counts.tolist()


def mixed(parts: Sequence[tuple[str, str, float]], n_workflows: int, seed: int = 0,
          train_share: float = 0.7, n_train_generated: int = 60) -> Source:
    """One cluster's traffic from several applications: ``parts`` is ``(app, workload, share)``
    with ``workload`` a built-in generated workload or a log file/folder.

    Each application is split on its own, as :func:`load_logs` and :func:`generated` do: a log's
    workflows by the ``profiler split`` rule at ``train_share`` (its test side resampled to the
    application's share of ``n_workflows``), a generated workload's train workflows
    (``n_train_generated``) and test workflows from different seeds. The profile is fit on the
    union of the train sides, so no replayed workflow of any application was seen by it. Ids get
    the application's name in front (``app:``)."""
    counts = shares_to_counts([p[2] for p in parts], n_workflows)
    train: list[dict] = []
    test: list[dict] = []
    sys_tokens: dict[str, int] = {}
    lineage: set[str] = set()
    notes: list[str] = []
    info: list[dict] = []
    for (app, workload, _), k in zip(parts, counts):
        if workload in BUILTIN:
            src = generated(workload, n_train=n_train_generated, n_test=k, seed=seed)
            rep = src.test
        else:
            src = load_logs([workload], train=train_share, seed=seed)
            rep = replicate_records(src.test, k, seed=seed)
            lineage |= {str(r.get("workflow_type_id", "")) for r in src.test}
        notes += [f"{app}: {n}" for n in src.notes]
        sys_tokens.update(src.system_tokens)
        train += _tag(src.train, app)
        test += _tag(rep, app)
        info.append({"app": app, "workload": workload,
                     "workflow_types": sorted({str(r.get("workflow_type_id", "")) for r in rep}),
                     "train_workflows": len({r["workflow_id"] for r in src.train}),
                     "test_workflows": len({r["workflow_id"] for r in src.test}),
                     "replayed_workflows": k})
    name = "mix(" + ", ".join(p[0] for p in parts) + ")"
    return Source(name, train, test, sys_tokens, notes=notes, lineage_types=lineage, parts=info)


def train_lines(records: Sequence[dict]) -> bytes:
    """The train split as the JSON lines the fit reads (one compact object per line)."""
    return b"".join(json.dumps(rec, separators=(",", ":"), default=str).encode() + b"\n"
                    for rec in records)


def fit_train_profile(records: list[dict], profile_dir: str | Path | None = None,
                      progress: bool = False) -> tuple[Any, bool]:
    """Fit a profile on ``records`` with ``fitting.profile_fit.fit_profile``, or reuse the one a
    previous run fit on the very same records; returns ``(profile, reused)``.

    Each train split gets its own folder, ``<dir>/split-<first 12 hex of the SHA-256 of its JSON
    lines>``, holding ``train/train.jsonl`` (the fit reads files) and the profile in ``profile``.
    A later run on the same split (same workload, seed and share) finds that folder's profile
    and reuses it; another split never shares a folder. That matters because a profile root is
    incremental: a fit adds its logs to the calls the root's store already holds, so a shared
    folder would fit one seed's profile on another seed's train split too, and those calls may be
    the workflows this run replays. ``CURRENT`` is written last, so a fit that did not finish is
    simply fit again."""
    if profile_dir is not None:
        root = Path(profile_dir)
    else:  # a throw-away profile: removed when the process ends
        root = Path(tempfile.mkdtemp(prefix="sim-profile-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
    lines = train_lines(records)
    split = root / f"split-{hashlib.sha256(lines).hexdigest()[:12]}"
    logs, out = split / "train", split / "profile"
    if (out / CURRENT_FILE).exists():
        return load_profile(out), True
    logs.mkdir(parents=True, exist_ok=True)
    (logs / "train.jsonl").write_bytes(lines)
    profile, _ = fit_profile([logs], out, progress=progress)
    return profile, False


def make_predictor(profile: Any) -> Any:
    """A ``predictors.Predictor`` over ``profile`` (a Profile or a profile folder)."""
    return Predictor(profile)
