"""Which logs a profile root was fitted on, so a second, different log is not merged silently.

``profiler fit LOGS --out ROOT`` ingests into ``ROOT``'s store, and every later fit of that root
fits on everything the store holds. That is what log rotation needs (the same folder gains new
files; refit folds in the gateway's new logs), and a trap when a user fits a second, unrelated
log into the same ``--out``: fitting ``split-b/train`` into the root of ``split-a/train`` merged
the two and put 15 of 18 test workflows of split b into its training data (issue 26).

The root therefore records its **sources**: the absolute paths the fits were given
(``ROOT/sources.json``). A new fit is of the *same* log when each path it is given is a recorded
source or lies inside a recorded folder (a rotated file, a re-run of the same command); any
other path is a *different* log and :func:`check_sources` refuses it unless the caller appends
on purpose (``profiler fit --append``), which then records it. A path that *contains* a recorded
source (``split/`` after ``split/train``) is different: it would add the rest of that folder.
A root written before this file existed is read from its store: the ingested files and their
folders stand for its sources.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import duckdb

#: The file in a profile root that lists the logs its fits were given.
SOURCES_FILE = "sources.json"


class DifferentLogError(ValueError):
    """A fit was given a log the profile root was not fitted on (and no ``--append``); ``root`` and
    ``path`` (the first different log) let the caller say what to type instead."""

    def __init__(self, message: str, root: Path, path: Path) -> None:
        super().__init__(message)
        self.root, self.path = root, path


def _abs(path: str | Path) -> Path:
    return Path(os.path.abspath(Path(path).expanduser()))


def recorded_sources(root: str | Path, db_path: str | Path) -> list[Path]:
    """The sources of ``root``: its ``sources.json``, else (a root written before it) the files
    its store ingested and their folders; [] for a root with neither."""
    f = Path(root) / SOURCES_FILE
    if f.exists():
        return [Path(p) for p in json.loads(f.read_text()).get("sources", [])]
    if not Path(db_path).exists():
        return []
    try:  # a store another process holds is not read here: the fit reports the lock itself
        con = duckdb.connect(str(db_path), read_only=True)
    except duckdb.Error:
        return []
    try:
        tables = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        if "ingested_files" not in tables:
            return []
        files = [Path(r[0]) for r in con.execute("SELECT DISTINCT path FROM ingested_files").fetchall()]
    finally:
        con.close()
    return sorted(set(files) | {p.parent for p in files})


def _covered(path: Path, sources: Sequence[Path]) -> bool:
    return any(path == s or s in path.parents for s in sources)


def check_sources(root: str | Path, db_path: str | Path, paths: Sequence[str | Path],
                  append: bool = False) -> list[Path]:
    """Refuse (:class:`DifferentLogError`, one line) a fit of ``paths`` into ``root`` when the
    root was already fitted on other logs and ``append`` is False; returns the sources to record
    once the fit succeeds (:func:`record_sources`): the recorded ones and the new paths."""
    sources = recorded_sources(root, db_path)
    new = [p for p in map(_abs, paths) if not _covered(p, sources)]
    if sources and new and not append:
        shown = ", ".join(str(s) for s in sources[:2]) + (f" (+{len(sources) - 2} more)" if len(sources) > 2 else "")
        raise DifferentLogError(
            f"{root} was fitted on {shown}; {new[0]} is a different log and fitting it here would merge "
            f"the two (a held-out split would leak into training): use another --out, or --append to add it on purpose",
            root=Path(root), path=new[0])
    return sources + [p for p in new if p not in sources]


def record_sources(root: str | Path, sources: Sequence[str | Path]) -> None:
    """Write ``sources`` (from :func:`check_sources`) as ``root``'s ``sources.json``, atomically."""
    root = Path(root)
    merged = list(dict.fromkeys(map(_abs, sources)))
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / (SOURCES_FILE + ".tmp")
    tmp.write_text(json.dumps({"sources": [str(p) for p in merged]}, indent=1) + "\n")
    tmp.replace(root / SOURCES_FILE)
