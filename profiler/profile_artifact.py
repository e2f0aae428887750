"""The versioned profile artifact.

Layout of a profile root::

    profile/
      store.duckdb              the trace store (default location; ``--db`` elsewhere)
      CURRENT                   name of the active version, replaced atomically
      versions/<version>/
        manifest.json           version, creation time, the data it came from, fit options
        profile.json            the fitted models (see README "Profile artifact")

``version`` is the first 12 hex digits of the SHA-256 of ``profile.json``: the same data and
options give the same version. A fit writes into ``versions/.tmp-*`` and renames it into place,
then replaces ``CURRENT`` with ``os.replace`` — both atomic on POSIX — so a crash mid-fit leaves
the previous profile intact and readers never see a half-written one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

FORMAT = 1
CURRENT_FILE = "CURRENT"
VERSIONS_DIR = "versions"
DEFAULT_STORE = "store.duckdb"


class ProfileError(Exception):
    """A path that is not a (complete) profile."""


@dataclass
class Profile:
    path: Path          # the version folder
    version: str
    manifest: dict[str, Any]
    data: dict[str, Any]

    @property
    def root(self) -> Path:
        return self.path.parent.parent


def store_path(root: str | Path, db: str | Path | None = None) -> Path:
    """The DuckDB store of a profile root: ``db`` when given, else ``<root>/store.duckdb``."""
    return Path(db) if db is not None else Path(root) / DEFAULT_STORE


def _dumps(obj: Any) -> str:
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=False)


def current_version(root: str | Path) -> str | None:
    """The active version name under ``root`` (cheap: one small file read), or None."""
    try:
        return (Path(root) / CURRENT_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def _version_dir(path: Path) -> Path:
    if (path / "profile.json").exists():
        return path
    version = current_version(path)
    if version is None:
        raise ProfileError(f"{path} is not a profile: no {CURRENT_FILE} file and no profile.json "
                           f"(create one with `profiler fit LOGS --out {path}`)")
    vdir = path / VERSIONS_DIR / version
    if not (vdir / "profile.json").exists():
        raise ProfileError(f"{path}: {CURRENT_FILE} names version {version} but {vdir} is missing")
    return vdir


def load_profile(path: str | Path) -> Profile:
    """Load the active version of a profile root, or a specific version folder."""
    vdir = _version_dir(Path(path))
    manifest = json.loads((vdir / "manifest.json").read_text())
    if manifest.get("format") != FORMAT:
        raise ProfileError(f"{vdir}: profile format {manifest.get('format')} is not supported "
                           f"(this version reads format {FORMAT}); refit with `profiler fit`")
    data = json.loads((vdir / "profile.json").read_text())
    return Profile(path=vdir, version=manifest["version"], manifest=manifest, data=data)


def write_profile(root: str | Path, data: dict[str, Any], manifest_extra: dict[str, Any]) -> Profile:
    """Write ``data`` as a new version under ``root`` and make it current (atomically)."""
    root = Path(root)
    versions = root / VERSIONS_DIR
    versions.mkdir(parents=True, exist_ok=True)
    data = {"format": FORMAT, **data}
    body = _dumps(data)
    version = hashlib.sha256(body.encode()).hexdigest()[:12]
    now = time.time()
    manifest = {
        "format": FORMAT,
        "version": version,
        "created_at": datetime.fromtimestamp(now, timezone.utc).isoformat(timespec="seconds"),
        "created_at_unix": now,
        **manifest_extra,
    }
    final = versions / version
    if not final.exists():
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=versions))
        try:
            (tmp / "profile.json").write_text(body)
            (tmp / "manifest.json").write_text(_dumps(manifest))
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    else:  # same content already there: refresh the manifest (sources, time) in place
        tmp_manifest = final / ".manifest.json.tmp"
        tmp_manifest.write_text(_dumps(manifest))
        os.replace(tmp_manifest, final / "manifest.json")
    tmp_current = root / f".{CURRENT_FILE}.tmp"
    tmp_current.write_text(version + "\n")
    os.replace(tmp_current, root / CURRENT_FILE)
    return Profile(path=final, version=version, manifest=manifest, data=data)
