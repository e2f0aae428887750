"""bench/gpu_bundle.py: the offline GPU host's bundle. Fast: the parts and the manifest, and the
package closure (the host's torch and its own requirements left out). Slow: the real bundle built
here (``pip download`` from the index), joined from its parts, installed with ``--no-index`` into
an empty target, and ``import sglang.srt.server_args`` from that target beside this venv's torch
alone (no other site-packages on the path)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import gpu_bundle as gb


def _installed(dist: str) -> bool:
    from importlib import metadata
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


#: the bundle is pinned to what this venv holds: without the SGLang stack (the README's install,
#: no CPU recipe) there is nothing to bundle
needs_stack = pytest.mark.skipif(not (_installed("sglang") and _installed("torch")),
                                 reason="needs the SGLang stack installed here (the CPU recipe of .ci/run)")


def test_split_and_join_round_trip_with_checksums(tmp_path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    big, small = wheels / "big-1.0-py3-none-any.whl", wheels / "small-1.0-py3-none-any.whl"
    big.write_bytes(os.urandom(2500))
    small.write_bytes(b"abc")
    want = {p.name: p.read_bytes() for p in (big, small)}
    entries = [{"path": f"wheels/{p.name}", "sha256": gb.sha256(p), "size": p.stat().st_size,
                "parts": gb.split(p, 1000)} for p in (big, small)]
    assert entries[0]["parts"] == [f"{big.name}.part00", f"{big.name}.part01", f"{big.name}.part02"]
    assert not big.exists() and all((wheels / n).stat().st_size <= 1000 for n in entries[0]["parts"])
    assert entries[1]["parts"] == [small.name]
    (tmp_path / "MANIFEST.json").write_text(json.dumps({"files": entries}))
    joined = gb.join_parts(tmp_path)
    assert {p.name: p.read_bytes() for p in joined} == want
    (wheels / f"{big.name}.part01").write_bytes(b"x" * 1000)               # a damaged part
    with pytest.raises(SystemExit, match="SHA-256"):
        gb.join_parts(tmp_path)


@needs_stack
def test_closure_leaves_out_the_hosts_torch_and_follows_no_gpu_pins() -> None:
    pins = gb.closure([*gb.ROOTS, *gb.project_roots()])
    assert {"sglang", "xgrammar", "sglang-router", "transformers", "duckdb", "scikit-learn", "httpx"} <= set(pins)
    assert not set(pins) & gb.HOST_HAS                                    # torch, triton, sympy, ...
    assert not {"flashinfer-python", "sgl-kernel", "torchvision", "torchaudio"} & set(pins)
    assert not any(n.startswith("nvidia-") for n in pins)
    from importlib import metadata
    assert pins["sglang"] == metadata.version("sglang")


def test_run_gpu_script_installs_offline_and_runs_the_gpu_bench() -> None:
    script = gb.RUN_GPU.replace("__GPU_COMMAND__", gb.GPU_COMMAND)
    assert "pip install -q --no-index --no-deps --find-links wheels -r requirements.txt" in script
    assert "--system-site-packages" in script                              # the host's torch
    assert "bench/bench_engine.py --gpu --model-config llama-8b" in script and "timeout 470" in script


def host_like(host: Path) -> None:
    """A folder with what a stock torch host has: this venv's torch and what torch itself requires
    (every top-level entry their installed files name), and pytest for the stand-ins; nothing else
    of this venv."""
    from importlib import metadata

    host.mkdir()
    for name in (*gb.HOST_HAS, "pytest", "pluggy", "iniconfig"):
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "bin")}:
            src = Path(dist.locate_file(top))
            if src.exists() and not (host / top).exists():
                (host / top).symlink_to(src)


@needs_stack
@pytest.mark.slow
def test_the_bundle_installs_offline_into_an_empty_target_and_sglang_imports(tmp_path) -> None:
    out = gb.REPO / "build" / "gpu_bundle"                  # reused between runs (downloads kept)
    manifest = gb.build(out, f"{sys.version_info.major}.{sys.version_info.minor}", "manylinux_2_34_x86_64")
    assert all((out / "wheels" / p).stat().st_size <= gb.PART_MIB << 20
               for e in manifest["files"] for p in e["parts"] if e["path"].startswith("wheels/"))
    gb.join_parts(out)
    target = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--find-links",
                    str(out / "wheels"), "--target", str(target), "-r", str(out / "requirements.txt")], check=True)
    host = tmp_path / "host"
    host_like(host)
    assert import_check(target, host, tmp_path).returncode == 0


def import_check(target: Path, host: Path, home: Path) -> subprocess.CompletedProcess:
    """``import sglang.srt.server_args`` in ``python -S`` (no site-packages) with only ``target``,
    ``host`` and the CPU stand-ins on the path (``sitecustomize`` imported by hand: ``-S`` skips
    it), as the CPU recipe runs SGLang; asserts it worked, naming what failed."""
    standins = gb.REPO / "tests" / "sglang" / "cpu_standins"
    code = ("import sitecustomize, sys, sglang, sglang.srt.server_args as sa; "
            f"assert sglang.__file__.startswith({str(target)!r}), sglang.__file__; "
            "assert not any('site-packages' in p for p in sys.path), sys.path; print('ok', sa.ServerArgs.__name__)")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": os.pathsep.join(map(str, (target, host, standins))),
           "HOME": str(home), "AWP_TEST_CPU_STANDINS": "1", "SGLANG_USE_CPU_ENGINE": "1"}
    r = subprocess.run([sys.executable, "-S", "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "ok ServerArgs" in r.stdout, r.stderr[-3000:]
    return r


def test_platform_tags_include_every_older_manylinux() -> None:
    tags = gb.platform_tags("manylinux_2_34_x86_64")
    assert tags[0] == "manylinux_2_34_x86_64" and "manylinux_2_28_x86_64" in tags and "manylinux2014_x86_64" in tags
    assert gb.platform_tags("linux_x86_64") == ["linux_x86_64"]


def test_site_leaves_the_host_images_packages_but_keeps_sglangs_pins(tmp_path) -> None:
    listed = tmp_path / "host.txt"
    listed.write_text("# a comment line\nNumPy\npandas, Transformers\nhuggingface_hub\n")
    host = gb.host_packages(listed)
    assert host == {"numpy", "pandas", "transformers", "huggingface-hub"}
    skip = gb.site_skip(host)
    assert {"numpy", "pandas", "torch", "sglang-router"} <= skip
    assert not {"transformers", "huggingface-hub"} & skip                   # SGLang pins these
    assert "sglang-router" not in gb.site_skip(host, router=True)
    image = gb.host_packages(gb.REPO / "bench" / "gpu_host_packages.txt")
    assert {"torch", "numpy", "pyarrow", "scikit-learn"} <= image and "sglang" not in image


def test_prune_site_removes_what_a_text_server_never_loads(tmp_path) -> None:
    site = tmp_path / "site"
    keep = ["sglang/srt/server_args.py", "sglang/srt/rust_extensions/loader.py", "zstandard/backend_c.so",
            "sglang/test/test_utils.py"]
    drop = ["sglang/multimodal_gen/x.py", "sglang/srt/rust_extensions/_server.cpython-312.so",
            "zstandard/_cffi.cpython-312.so", "ipython-9.data/scripts/ipython", "sglang/__pycache__/a.pyc"]
    for rel in keep + drop:
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text("x")
    gone = gb.prune_site(site)
    assert all((site / rel).exists() for rel in keep)
    assert not any((site / rel).exists() for rel in drop)
    assert "sglang/multimodal_gen" in gone


def test_the_site_declares_the_projects_sglang_plugin(tmp_path) -> None:
    from importlib import metadata

    gb.entry_points_dist_info(tmp_path)
    eps = [ep for d in metadata.distributions(path=[str(tmp_path)]) for ep in d.entry_points]
    assert [(ep.group, ep.name, ep.value) for ep in eps] == [
        ("sglang.srt.plugins", "agent_workflow", "serving_hooks.sglang_plugin:register")]


@needs_stack
def test_the_site_closure_is_the_servers_packages_without_the_hosts() -> None:
    host = gb.host_packages(gb.REPO / "bench" / "gpu_host_packages.txt")
    pins = gb.closure([*gb.ROOTS, *gb.project_roots()], skip=gb.site_skip(host))
    assert {"sglang", "duckdb", "fastapi", "uvicorn", "xgrammar", "loguru", "transformers"} <= set(pins)
    assert not {"numpy", "pandas", "pyarrow", "torch", "sglang-router"} & set(pins)


def test_the_device_script_runs_the_gpu_bench_with_the_stand_ins() -> None:
    script = (gb.REPO / "bench" / "gpu_device_run.sh").read_text()
    assert "AWP_GPU_STANDINS=1" in script and "tests/sglang/cpu_standins" in script
    assert "bench/bench_engine.py --gpu" in script and "--attention-backend triton" in script
    assert subprocess.run(["bash", "-n", str(gb.REPO / "bench" / "gpu_device_run.sh")]).returncode == 0
