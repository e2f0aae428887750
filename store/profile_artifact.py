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
then replaces ``CURRENT`` with ``os.replace`` — both atomic on POSIX, each file fsynced before its
rename — so a crash mid-fit leaves the previous profile intact and readers never see a half-written
one. A crash can leave a ``versions/.tmp-<pid>-*`` folder behind: the next fit removes those whose
process is gone.

``CURRENT`` is validated when read: it must name a version folder (a plain name, no path) whose
``profile.json`` and ``manifest.json`` parse, with the manifest naming that version. Otherwise
:class:`ProfileError` says what is wrong and lists the valid versions there are — readers do **not**
fall back to another version on their own (a server keeps the profile it has; an operator points
``CURRENT`` at a version, or refits).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from store import faults

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


_VERSION_NAME = re.compile(r"[0-9A-Za-z_-][0-9A-Za-z_.-]*")


def _read_version(vdir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(manifest, data)`` of a version folder; :class:`ProfileError` when either file is
    missing or not a JSON object, or the manifest names another version."""
    parts = []
    for name in ("manifest.json", "profile.json"):
        try:
            obj = json.loads((vdir / name).read_text())
        except FileNotFoundError:
            raise ProfileError(f"{vdir}: {name} is missing") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ProfileError(f"{vdir}: {name} is damaged ({exc})") from None
        if not isinstance(obj, dict):
            raise ProfileError(f"{vdir}: {name} is not a JSON object")
        parts.append(obj)
    manifest, data = parts
    if vdir.parent.name == VERSIONS_DIR and manifest.get("version") != vdir.name:
        raise ProfileError(f"{vdir}: manifest.json names version {manifest.get('version')!r}, "
                           f"not {vdir.name!r}")
    return manifest, data


def valid_versions(root: str | Path) -> list[str]:
    """Versions under ``root`` a server would load, newest first: complete files whose profile has
    the shape a fit writes (:func:`check_profile_shape`; a ``format: 999`` version was named in
    the hint and then refused, issue 35)."""
    found = []
    for vdir in (Path(root) / VERSIONS_DIR).glob("*"):
        if vdir.name.startswith(".") or not vdir.is_dir():
            continue
        try:
            manifest, data = _read_version(vdir)
            check_profile_shape(data, vdir / "profile.json")
        except ProfileError:
            continue
        found.append((float(manifest.get("created_at_unix") or 0.0), vdir.name))
    return [name for _, name in sorted(found, reverse=True)]


def _version_dir(path: Path) -> Path:
    if (path / "profile.json").exists():
        return path
    version = current_version(path)
    if version is None:
        raise ProfileError(f"{path} is not a profile: no {CURRENT_FILE} file and no profile.json "
                           f"(create one with `profiler fit LOGS --out {path}`)")
    valid = valid_versions(path)
    hint = (f"; valid versions here, newest first: {', '.join(valid[:5])} (write one into "
            f"{path / CURRENT_FILE}, or refit)" if valid else "; refit with `profiler fit`")
    if not _VERSION_NAME.fullmatch(version) or version in (".", ".."):
        raise ProfileError(f"{path}: {CURRENT_FILE} does not name a version ({version[:60]!r}){hint}")
    vdir = path / VERSIONS_DIR / version
    if not (vdir / "profile.json").exists():
        raise ProfileError(f"{path}: {CURRENT_FILE} names version {version} but {vdir} is missing{hint}")
    try:
        _read_version(vdir)
    except ProfileError as exc:
        raise ProfileError(f"{exc} ({CURRENT_FILE} of {path} names it){hint}") from None
    return vdir


#: Top-level sections of a fitted ``profile.json`` (format 1) that must be JSON objects.
PROFILE_SECTIONS = ("agents", "workflow_types", "workflows", "output_length", "tool_latency")


def check_profile_shape(data: Any, where: str | Path = "profile.json") -> None:
    """Raise :class:`ProfileError` (one line) unless ``data`` has the shape a fit writes.

    A server compiles whatever a version holds: ``{}``, ``{"agents": []}`` or ``format: 999``
    compiled into a profile that knows no workflow type, so every prediction turned unknown and
    the shadow gate took the types for new ones when the good version came back (issue 24). A
    hot swap checks this first and keeps the active profile when it fails. Checked: the format
    number, each section a JSON object, at least one workflow type with agents, and each type's
    agents an object of objects.
    """
    if not isinstance(data, dict):
        raise ProfileError(f"{where}: profile is not a JSON object")
    if data.get("format") != FORMAT:
        raise ProfileError(f"{where}: profile format {data.get('format')!r} is not supported "
                           f"(this version reads format {FORMAT})")
    for key in PROFILE_SECTIONS:
        if not isinstance(data.get(key), dict):
            got = "missing" if key not in data else f"a {type(data[key]).__name__}"
            raise ProfileError(f"{where}: section {key!r} must be a JSON object, got {got}")
    if not data["workflow_types"] or not data["agents"]:
        raise ProfileError(f"{where}: profile holds no workflow type with agents")
    for wt, agents in data["agents"].items():
        if not isinstance(agents, dict) or not all(isinstance(a, dict) for a in agents.values()):
            raise ProfileError(f"{where}: agents of workflow type {wt!r} must be an object "
                               "{agent_id: {...}}")


def load_profile(path: str | Path) -> Profile:
    """Load the active version of a profile root (``CURRENT`` validated, see the module
    docstring), or a specific version folder."""
    vdir = _version_dir(Path(path))
    manifest, data = _read_version(vdir)
    if manifest.get("format") != FORMAT:
        raise ProfileError(f"{vdir}: profile format {manifest.get('format')} is not supported "
                           f"(this version reads format {FORMAT}); refit with `profiler fit`")
    return Profile(path=vdir, version=manifest["version"], manifest=manifest, data=data)


def _write_synced(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` and fsync it (a rename after it then publishes whole data)."""
    faults.point(f"write {path.name}")
    with open(path, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(src: Path, dst: Path) -> None:
    faults.point(f"rename {dst.name}")
    os.replace(src, dst)
    _fsync_dir(dst.parent)


def clean_stale_temps(versions: Path) -> list[Path]:
    """Remove ``versions/.tmp-*`` folders left by a crashed fit (their process is gone; folders
    of the old ``.tmp-XXXX`` naming, without a pid, are removed too). Returns what was removed."""
    removed = []
    for tmp in versions.glob(".tmp-*"):
        m = re.match(r"\.tmp-(\d+)-", tmp.name)
        if m:
            try:
                os.kill(int(m.group(1)), 0)
                continue  # a live fit (maybe this process, another thread) is writing it
            except ProcessLookupError:
                pass
            except PermissionError:
                continue  # alive, owned by someone else
        shutil.rmtree(tmp, ignore_errors=True)
        removed.append(tmp)
    return removed


def write_profile(root: str | Path, data: dict[str, Any], manifest_extra: dict[str, Any]) -> Profile:
    """Write ``data`` as a new version under ``root`` and make it current (atomically)."""
    root = Path(root)
    versions = root / VERSIONS_DIR
    versions.mkdir(parents=True, exist_ok=True)
    clean_stale_temps(versions)
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
    intact = False
    if final.exists():
        try:
            intact = (final / "profile.json").read_text() == body and bool(_read_version(final))
        except (OSError, ProfileError):
            intact = False
    if not intact:
        faults.point("mkdtemp")
        tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-", dir=versions))
        try:
            _write_synced(tmp / "profile.json", body)
            _write_synced(tmp / "manifest.json", _dumps(manifest))
            stale = None
            if final.exists():  # damaged folder of the same version: set it aside, then drop it
                stale = Path(tempfile.mkdtemp(prefix=f".tmp-{os.getpid()}-old-", dir=versions))
                os.replace(final, stale / version)
            _replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if stale is not None:
            shutil.rmtree(stale, ignore_errors=True)
    else:  # same content already there: refresh the manifest (sources, time) in place
        tmp_manifest = final / ".manifest.json.tmp"
        _write_synced(tmp_manifest, _dumps(manifest))
        _replace(tmp_manifest, final / "manifest.json")
    tmp_current = root / f".{CURRENT_FILE}.tmp"
    _write_synced(tmp_current, version + "\n")
    _replace(tmp_current, root / CURRENT_FILE)
    return Profile(path=final, version=version, manifest=manifest, data=data)
