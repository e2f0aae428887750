#!/usr/bin/env python3
"""Run every ```bash block of README.md, in order, as a new user would (issue 35).

Run it through ``.ci/readme_blocks.sh``, which gives it a fresh copy of the repository (tracked
and not-ignored files only) and no virtual environment: the README's first block makes one.
Standard library only, since it runs before that environment exists.

The rule for each line of a block (blank and ``#`` lines skipped):

* A line that starts a server (``profiler serve ...`` or ``profiler gateway ...``) is started in
  the background; when it names an ``--upstream`` URL, a fake OpenAI-compatible engine
  (``python -m serving_hooks.fake_openai``) is started on that URL's port first. The script
  waits until the server answers its readiness probe (``/healthz`` for the sidecar, ``/readyz``
  for the gateway), sends one call (``POST /v1/annotate`` for a known workflow type and agent of
  the profile it serves; ``POST /v1/chat/completions`` through the gateway) and requires a 200
  with the expected answer, then stops both processes (SIGTERM to the process group, then
  SIGKILL after 20 s) before the next line: the README's serving lines are alternatives that
  share ports, so they run one at a time. The ports are used as written; a port already taken
  is a clear failure, not a silent change.
* Every other line runs in the foreground (``bash -euo pipefail -c LINE``) and must exit 0.
* After the first block the README's virtual environment stays active for the rest (its
  ``bin/`` first on ``PATH``), as it does in the reader's shell.
* The README's test line (``python -m pytest ...``) runs as written unless ``README_TESTS`` says
  otherwise: ``full`` (the default, CI), ``collect`` (``--collect-only``: every test module
  imports in this environment, what a run on a shared machine can afford) or ``skip``.

The virtual environment the README makes must hold neither sglang nor torch (issue 24: a test
that cannot be collected without them passes in CI's full environment and fails for every new
user); the script checks that after the first block.

Usage (from the repository root): ``bash .ci/readme_blocks.sh``. Exit status: the first failing
line's, with the line and the tail of its output printed.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

SERVER = re.compile(r"^profiler (serve|gateway)\b")
READY_TIMEOUT_S = 180.0
STOP_GRACE_S = 20.0


def bash_blocks(readme: str) -> list[list[str]]:
    """The lines of each ```bash block, in order (blank and comment-only lines dropped)."""
    blocks = re.findall(r"^```bash\n(.*?)^```$", readme, flags=re.S | re.M)
    return [[ln for ln in b.splitlines() if ln.strip() and not ln.lstrip().startswith("#")] for b in blocks]


def say(msg: str) -> None:
    print(f"[readme] {msg}", flush=True)


def env_with_venv(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    venv = root / ".venv"
    if venv.is_dir():
        env["VIRTUAL_ENV"] = str(venv)
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_foreground(line: str, root: Path) -> None:
    t0 = time.monotonic()
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", line], cwd=root, env=env_with_venv(root),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    tail = proc.stdout[-3000:]
    if proc.returncode != 0:
        print(tail, flush=True)
        fail(f"exit {proc.returncode}: {line}", proc.returncode)
    say(f"ok in {time.monotonic() - t0:.0f} s ({len(proc.stdout.splitlines())} lines of output)")


def fail(msg: str, code: int = 1) -> None:
    say(f"FAILED: {msg}")
    sys.exit(code or 1)


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def http(method: str, url: str, body: dict | None = None, timeout: float = 30.0) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def known_identity(root: Path, profile: str) -> dict[str, str]:
    """A workflow type and agent the profile at ``profile`` has a band for, read with the README's
    own environment (the profile format is the project's, not this script's)."""
    code = ("import json, sys; from store.profile_artifact import load_profile; "
            "a = load_profile(sys.argv[1]).data['output_length']['agents']; wt = next(iter(a)); "
            "print(json.dumps({'workflow_type_id': wt, 'agent_id': next(iter(a[wt]))}))")
    out = subprocess.run(["python", "-c", code, profile], cwd=root, env=env_with_venv(root),
                         capture_output=True, text=True, check=True).stdout
    return {**json.loads(out), "workflow_id": "readme-check-1"}


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_server(line: str, root: Path) -> None:
    argv = shlex.split(line, comments=True)
    kind = argv[1]
    opt = lambda name: argv[argv.index(name) + 1] if name in argv else None  # noqa: E731
    port = int(opt("--port") or (8700 if kind == "serve" else 8080))
    upstream = opt("--upstream") or opt("-u")
    ports = [port] + ([urlparse(upstream).port] if upstream else [])
    taken = [p for p in ports if not port_free(p)]
    if taken:
        fail(f"port(s) {taken} already in use on this machine; free them to run: {line}")
    env = env_with_venv(root)
    procs: list[subprocess.Popen] = []
    logs = root / ".readme-logs"
    logs.mkdir(exist_ok=True)
    try:
        if upstream:
            procs.append(subprocess.Popen(
                ["python", "-m", "serving_hooks.fake_openai", "--port", str(urlparse(upstream).port)],
                cwd=root, env=env, start_new_session=True, stdin=subprocess.DEVNULL,
                stdout=open(logs / f"engine-{port}.log", "w"), stderr=subprocess.STDOUT))
        log = logs / f"{kind}-{port}.log"
        server = subprocess.Popen(["bash", "-c", f"exec {line}"], cwd=root, env=env, start_new_session=True,
                                  stdin=subprocess.DEVNULL, stdout=open(log, "w"), stderr=subprocess.STDOUT)
        procs.append(server)
        base = f"http://127.0.0.1:{port}"
        probe = base + ("/readyz" if kind == "gateway" else "/healthz")
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            if server.poll() is not None:
                print(log.read_text()[-3000:], flush=True)
                fail(f"the server exited ({server.returncode}) before it was ready: {line}")
            try:
                if http("GET", probe, timeout=5)[0] == 200:
                    break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                fail(f"not ready after {READY_TIMEOUT_S:.0f} s ({probe}): {line}")
            time.sleep(0.5)
        meta = known_identity(root, opt("--profile") or "profile/")
        if kind == "serve":
            status, body = http("POST", base + "/v1/annotate", {"app_metadata": meta})
            ok = status == 200 and json.loads(body)["sys_annotations"].get("known") is True
        else:
            status, body = http("POST", base + "/v1/chat/completions",
                                {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                 "app_metadata": meta})
            ok = status == 200 and bool(json.loads(body).get("choices"))
        if not ok:
            fail(f"one call answered {status} {body[:300]!r}: {line}")
        say(f"ok: {kind} answered on port {port} ({meta['workflow_type_id']}/{meta['agent_id']}), stopped")
    finally:
        for p in reversed(procs):
            stop(p)


def check_no_sglang(root: Path) -> None:
    code = ("import importlib.util as u, sys; bad = [m for m in ('sglang', 'torch') if u.find_spec(m)]; "
            "sys.exit(f'the README venv has {bad}: this run must go without the SGLang stack' if bad else 0)")
    if subprocess.run(["python", "-c", code], cwd=root, env=env_with_venv(root)).returncode:
        fail("the README's environment holds the SGLang stack")


def main() -> None:
    root = Path.cwd()
    tests = os.environ.get("README_TESTS", "full")
    if tests not in ("full", "collect", "skip"):
        fail(f"README_TESTS must be full, collect or skip, got {tests!r}")
    blocks = bash_blocks((root / "README.md").read_text())
    if not blocks or "pip install -e" not in blocks[0][0]:
        fail("README.md's first ```bash block is not the install line")
    t0 = time.monotonic()
    for i, block in enumerate(blocks, 1):
        for line in block:
            if "pytest" in line and tests != "full":
                if tests == "skip":
                    say(f"block {i}: skipped (README_TESTS=skip): {line}")
                    continue
                line = line.replace("python -m pytest -q", "python -m pytest -q --collect-only -q", 1)
            say(f"block {i}: {line}")
            (run_server if SERVER.match(line) else run_foreground)(line, root)
        if i == 1:
            check_no_sglang(root)
    say(f"all {sum(map(len, blocks))} lines of {len(blocks)} blocks ran, rc 0, in {time.monotonic() - t0:.0f} s")


if __name__ == "__main__":
    main()
