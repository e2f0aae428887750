"""Prepare, here, everything an offline GPU host needs to run the real-engine bench on its GPU.

    python bench/gpu_bundle.py                       # -> build/gpu_bundle/ (parts <= 60 MiB)
    python bench/gpu_bundle.py --python-version 3.12 --out /tmp/bundle

The host this is for (issue 34): PyTorch 2.11 preinstalled with CUDA, no package index, and
files arrive in parts of at most 64 MiB. SGLang 0.5.23's own pins (torch 2.14.1, flashinfer,
the 511 MB ``sgl-kernel``) cannot go there, so the bundle carries what the CPU recipe runs
(docs/sglang.md, "SGLang on a CPU-only machine"): the ``sglang`` wheel without its pins, the
small runtime packages its modules import, the project's own dependencies and ``sglang-router``,
and the project's source (``bench/``, the plugin, the test launcher and the CPU stand-ins of
``tests/sglang/cpu_standins``). Attention runs on SGLang's ``triton`` backend (``--attention-
backend``), not flashinfer.

Which packages: the closure of :data:`ROOTS` over the ``Requires-Dist`` of the packages installed
in *this* environment (where that set is known to import and serve), minus the host's torch and
everything torch itself requires (:data:`HOST_HAS`), each pinned at the version installed here and
downloaded with ``pip download --no-deps --only-binary=:all:`` for the host's Python and platform.
Files over ``--part-mib`` are cut into ``NAME.partNN`` pieces; ``MANIFEST.json`` lists every file
with its SHA-256 and parts. ``run_gpu.sh`` (written beside them) is the one command on the host:
it joins and checks the parts, installs with ``pip install --no-index --no-deps`` into a venv
that sees the host's torch (``--system-site-packages``), and runs
``bench/bench_engine.py --gpu --model-config llama-8b`` (dummy weights) within 8 minutes.

``--site`` packs for a host that receives the repository itself in calls of at most 64 MiB (the
device tool's GPU machine, whose image lists its packages: ``--host-packages``): the packages
the host already has are left out (but SGLang's pinned ``transformers`` and ``huggingface-hub``
are kept), the wheels are unpacked into one folder, the parts a text-only LLM server never loads
are pruned (:data:`SITE_PRUNE`: multimodal generation, the Rust side servers, a second zstd
backend), the project's SGLang plugin entry point is added as a ``dist-info``, and the folder goes
as one ``site.tar.xz`` (router excluded; its size: docs/sglang.md) that ``bench/gpu_device_run.sh`` unpacks.

Downloads come from the package index this machine uses (``pip download``); a file already in the
output folder with the right name is reused. The folder is a build output (``build/`` is
gitignored).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PART_MIB = 60
#: what the host must get: SGLang's runtime imports (the CPU recipe's list in .ci/run and the
#: real server's extra modules), the router, and the project's own dependencies (pyproject)
ROOTS = ("sglang", "xgrammar", "sglang-router",
         "numpy", "orjson", "psutil", "pybase64", "requests", "pillow", "fastapi", "packaging", "msgspec", "pyzmq",
         "tqdm", "ipython", "aiohttp", "transformers", "dill", "apache-tvm-ffi", "sentencepiece",
         "compressed-tensors", "gguf", "openai", "partial-json-parser", "setproctitle", "einops", "uvicorn",
         "uvloop", "python-multipart", "jsonschema", "soundfile", "zstandard", "xxhash",
         "loguru")          # compressed-tensors' (installed without its requirements) import
#: packages whose own requirements are not followed (their pins are the GPU stack: torch 2.14.1,
#: flashinfer, sgl-kernel, a real triton) — the CPU recipe installs them with --no-deps too
NO_DEPS = frozenset({"sglang", "xgrammar", "compressed-tensors"})
#: on a stock torch host already: torch and its own requirements (and the CUDA wheels they pull)
HOST_HAS = frozenset({"torch", "triton", "filelock", "typing-extensions", "sympy", "mpmath", "networkx",
                      "jinja2", "markupsafe", "fsspec", "setuptools"})
#: the GPU host's run: one seed of the contention condition (one replica per arm) and the simulator
GPU_COMMAND = ("python bench/bench_engine.py --gpu --model-config llama-8b --condition contention --seeds 0 "
               "--workflows 24 --attention-backend triton --allow-load --out \"$HERE/engine-gpu.json\"")


#: kept from the bundle even where the host has its own (SGLang pins these exact versions)
KEEP_OURS = frozenset({"transformers", "huggingface-hub"})
#: paths (globs, relative to the unpacked site) a text-only LLM server never imports
SITE_PRUNE = ("sglang/multimodal_gen", "sglang/srt/rust_extensions/_bench.*", "sglang/srt/rust_extensions/_grpc.*",
              "sglang/srt/rust_extensions/_server.*", "zstandard/_cffi.*", "jedi", "*.data", "**/__pycache__")


def pyproject() -> dict:
    """The project's ``pyproject.toml`` ``[project]`` table (tomllib: Python 3.11+, imported here so
    the module still imports on 3.10)."""
    import tomllib

    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def project_roots() -> list[str]:
    """The project's own dependencies (pyproject ``[project] dependencies``), names only."""
    deps = pyproject()["dependencies"]
    return [Requirement(d).name for d in deps]


def closure(roots: list[str], skip: frozenset[str] = HOST_HAS, no_deps: frozenset[str] = NO_DEPS
            ) -> dict[str, str]:
    """``{name: installed version}`` of ``roots`` and everything they require here (markers
    evaluated for this interpreter, extras not followed), without ``skip`` and without following
    the requirements of ``no_deps``. A root or requirement not installed here is an error."""
    env = default_environment()
    out: dict[str, str] = {}
    todo = [canonicalize_name(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in out or name in skip:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError as e:
            raise SystemExit(f"gpu_bundle: {name} is not installed here, so its version is unknown "
                             "(install the CPU recipe first: .ci/run, docs/sglang.md)") from e
        out[name] = dist.version
        if name in no_deps:
            continue
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            todo.append(canonicalize_name(req.name))
    return dict(sorted(out.items()))


def platform_tags(platform: str) -> list[str]:
    """``manylinux_2_M_ARCH`` and every older manylinux tag the same host runs (``pip download
    --platform`` takes only the tags it is given): 2_M down to 2_5 and the legacy aliases."""
    m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", platform)
    if m is None:
        return [platform]
    top, arch = int(m.group(1)), m.group(2)
    return ([f"manylinux_2_{v}_{arch}" for v in range(top, 4, -1)]
            + [f"manylinux{legacy}_{arch}" for legacy in ("2014", "2010", "1")])


def download(pins: dict[str, str], wheels: Path, python_version: str, platform: str) -> None:
    """``pip download`` of every pin (no dependencies: the closure is already complete) for the
    host's interpreter and platform; files already there are kept."""
    wheels.mkdir(parents=True, exist_ok=True)
    req = wheels.parent / "requirements.txt"
    req.write_text("".join(f"{n}=={v}\n" for n, v in pins.items()))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
           "--python-version", python_version, *[a for t in platform_tags(platform) for a in ("--platform", t)],
           "--implementation", "cp",
           "-r", str(req), "-q"]
    subprocess.run(cmd, check=True)


def source_archive(dest: Path) -> Path:
    """The project's tracked files at HEAD (``git archive``), without the data sets the GPU run
    does not read."""
    out = dest / "awp-src.tar.gz"
    subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar.gz", "-o", str(out), "HEAD"], check=True)
    return out


def split(path: Path, part_bytes: int) -> list[str]:
    """Cut ``path`` into ``path.partNN`` files of at most ``part_bytes`` (removing ``path``) when
    it is larger; the part names (or ``[path.name]``)."""
    size = path.stat().st_size
    if size <= part_bytes:
        return [path.name]
    names = []
    with path.open("rb") as f:
        i = 0
        while chunk := f.read(part_bytes):
            part = path.with_name(f"{path.name}.part{i:02d}")
            part.write_bytes(chunk)
            names.append(part.name)
            i += 1
    path.unlink()
    return names


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def join_parts(folder: Path) -> list[Path]:
    """Undo :func:`split` in ``folder`` from its ``MANIFEST.json`` and check every SHA-256; the
    whole files. The same logic runs on the host (``run_gpu.sh``); here the test uses it."""
    manifest = json.loads((folder / "MANIFEST.json").read_text())
    out = []
    for entry in manifest["files"]:
        target = folder / entry["path"]
        if entry["parts"] != [target.name]:
            with target.open("wb") as w:
                for p in entry["parts"]:
                    w.write((target.parent / p).read_bytes())
        if sha256(target) != entry["sha256"]:
            raise SystemExit(f"{target}: SHA-256 differs from MANIFEST.json (a part is missing or damaged)")
        out.append(target)
    return out


RUN_GPU = r'''#!/usr/bin/env bash
# One command on the offline GPU host (written by bench/gpu_bundle.py): join the parts, install
# offline beside the host's torch, run the real-engine bench on the GPU with dummy 8B weights.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"
python3 - <<'PY'
import hashlib, json, pathlib
root = pathlib.Path(".")
for e in json.loads((root / "MANIFEST.json").read_text())["files"]:
    t = root / e["path"]
    if e["parts"] != [t.name]:
        with t.open("wb") as w:
            for p in e["parts"]:
                w.write((t.parent / p).read_bytes())
    if hashlib.sha256(t.read_bytes()).hexdigest() != e["sha256"]:
        raise SystemExit(f"{t}: SHA-256 differs from MANIFEST.json: a part is missing or damaged")
print("parts joined and checked")
PY
python3 -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print('torch', torch.__version__)"
[ -d venv ] || python3 -m venv --system-site-packages venv
. venv/bin/activate
pip install -q --no-index --no-deps --find-links wheels -r requirements.txt
mkdir -p src && tar xzf awp-src.tar.gz -C src
cd src
export PYTHONPATH="$PWD" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# no sgl-kernel on the host (511 MB, built for torch 2.14): the CPU recipe's stand-in module, whose
# every op but one raises by name when called, so a code path that needs a real kernel says which
python -c "import sgl_kernel" 2>/dev/null || export PYTHONPATH="$PYTHONPATH:$PWD/tests/sglang/cpu_standins"
python -c "import sglang.srt.server_args, bench.bench_engine; print('sglang imports')"
timeout 470 __GPU_COMMAND__ 2>&1 | tee "$HERE/engine-gpu.log"
'''


def build(out: Path, python_version: str, platform: str, part_mib: int = PART_MIB) -> dict:
    """Write the bundle into ``out`` (see the module doc); returns the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    pins = closure([*ROOTS, *project_roots()])
    wheels = out / "wheels"
    for stale in wheels.glob("*.part*"):          # a previous build's parts: rebuild the whole files
        stale.unlink()
    download(pins, wheels, python_version, platform)
    files = sorted(p for p in wheels.iterdir() if p.suffix in (".whl", ".gz", ".zip"))
    names = {canonicalize_name(re.split(r"-\d", p.name, maxsplit=1)[0]) for p in files}
    missing = sorted(n for n in pins if n not in names)
    if missing:
        raise SystemExit(f"gpu_bundle: pip downloaded no file for {', '.join(missing)}")
    files.append(source_archive(out))
    entries = []
    for f in files:
        digest = sha256(f)
        entries.append({"path": str(f.relative_to(out)), "sha256": digest, "size": f.stat().st_size,
                        "parts": split(f, part_mib << 20)})
    (out / "run_gpu.sh").write_text(RUN_GPU.replace("__GPU_COMMAND__", GPU_COMMAND))
    (out / "run_gpu.sh").chmod(0o755)
    manifest = {"python_version": python_version, "platform": platform, "part_mib": part_mib,
                "packages": pins, "files": entries}
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def host_packages(path: Path) -> frozenset[str]:
    """The host image's package names (one per line, or comma-separated), canonicalised."""
    text = "\n".join(line for line in path.read_text().splitlines() if not line.startswith("#"))
    names = re.split(r"[,\s]+", text)
    return frozenset(canonicalize_name(n) for n in names if n)


def entry_points_dist_info(site: Path) -> Path:
    """A ``dist-info`` in ``site`` that declares the project's SGLang plugin entry point (the host
    runs the project from its source folder, not installed), read from pyproject."""
    eps = pyproject()["entry-points"]
    d = site / "agent_workflow_profiler_entry_points-0.0.dist-info"
    d.mkdir(parents=True, exist_ok=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: agent-workflow-profiler-entry-points\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n" for group, items in eps.items()))
    return d


def prune_site(site: Path) -> list[str]:
    """Remove :data:`SITE_PRUNE` from an unpacked site folder; the paths removed (relative)."""
    gone = []
    for pattern in SITE_PRUNE:
        for path in sorted(site.glob(pattern)):
            if path.exists():
                gone.append(str(path.relative_to(site)))
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    return gone


def site_skip(host: frozenset[str], router: bool = False) -> frozenset[str]:
    """The packages ``--site`` leaves to the host: torch's own, the host image's (but
    :data:`KEEP_OURS`), and ``sglang-router`` unless ``router``."""
    return HOST_HAS | (host - KEEP_OURS) | (frozenset() if router else frozenset({"sglang-router"}))


def build_site(out: Path, python_version: str, platform: str, host: frozenset[str], router: bool = False) -> dict:
    """``--site``: ``out/site.tar.xz`` holding the unpacked, pruned closure without what the host has
    (module doc); returns what went in and its size."""
    out.mkdir(parents=True, exist_ok=True)
    pins = closure([*ROOTS, *project_roots()], skip=site_skip(host, router))
    wheels = out / "wheels"
    download(pins, wheels, python_version, platform)
    site = out / "site"
    shutil.rmtree(site, ignore_errors=True)
    for name, version in pins.items():
        found = [p for p in wheels.glob("*.whl")
                 if canonicalize_name(re.split(r"-\d", p.name, maxsplit=1)[0]) == name and f"-{version}-" in p.name]
        if not found:
            raise SystemExit(f"gpu_bundle: pip downloaded no wheel for {name}=={version}")
        with zipfile.ZipFile(found[0]) as z:
            z.extractall(site)
    prune_site(site)
    entry_points_dist_info(site)
    tar = out / "site.tar.xz"
    with tarfile.open(tar, "w:xz", preset=9) as t:
        t.add(site, arcname=".")
    return {"python_version": python_version, "packages": pins, "left_to_host": sorted(host & set(
        closure([*ROOTS, *project_roots()])) - KEEP_OURS), "site_tar": tar.name, "bytes": tar.stat().st_size}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "build" / "gpu_bundle",
                    help="bundle folder (default build/gpu_bundle, gitignored)")
    ap.add_argument("--python-version", default=f"{sys.version_info.major}.{sys.version_info.minor}",
                    help="the host's Python (default: this one's), for the binary wheels")
    ap.add_argument("--platform", default="manylinux_2_34_x86_64",
                    help="the host's wheel platform tag (default manylinux_2_34_x86_64, which the sglang 0.5.23 "
                         "wheel needs: glibc >= 2.34; pip also takes wheels for older glibc under it)")
    ap.add_argument("--part-mib", type=int, default=PART_MIB, help="largest part, MiB (default 60)")
    ap.add_argument("--clean", action="store_true", help="start from an empty folder (else reuse downloads)")
    ap.add_argument("--site", action="store_true",
                    help="one pruned site.tar.xz for bench/gpu_device_run.sh instead of wheels in parts (module doc)")
    ap.add_argument("--host-packages", type=Path,
                    help="with --site: the host image's package names (one per line); those are left out")
    ap.add_argument("--router", action="store_true", help="with --site: include sglang-router (+19 MiB)")
    args = ap.parse_args(argv)
    if args.clean and args.out.exists():
        shutil.rmtree(args.out)
    if args.site:
        host = host_packages(args.host_packages) if args.host_packages else frozenset()
        m = build_site(args.out, args.python_version, args.platform, host, args.router)
        (args.out / "SITE.json").write_text(json.dumps(m, indent=1))
        print(f"{args.out / m['site_tar']}: {len(m['packages'])} packages, {m['bytes'] / 2**20:.1f} MiB; "
              f"on the host: bash bench/gpu_device_run.sh {m['site_tar']} OUT_DIR")
        return
    m = build(args.out, args.python_version, args.platform, args.part_mib)
    parts = [p for e in m["files"] for p in e["parts"]]
    total = sum(e["size"] for e in m["files"])
    print(f"{args.out}: {len(m['packages'])} packages, {len(parts)} parts of <= {args.part_mib} MiB, "
          f"{total / 2**20:.0f} MiB in all; on the host: bash run_gpu.sh")


if __name__ == "__main__":
    main()
