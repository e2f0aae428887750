"""stop_process_group (tests/sglang/real_server.py), the one way the test SGLang servers and the
benchmark's sglang-router are stopped: SIGTERM, then SIGKILL to the whole process group."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.sglang.real_server import stop_process_group

# A server that ignores SIGTERM and has a child of its own (as the SGLang launcher has its
# scheduler and detokenizer processes): it prints the child's pid, then says it is ready.
STUBBORN = """
import signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """The process has exited (reaped, or a zombie waiting for whoever adopted it)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.05)
    return False


def test_sigterm_first(tmp_path):
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('up', flush=True); time.sleep(120)"],
                            stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout.readline().strip() == b"up"
    stop_process_group(proc, grace_s=30.0, log=log)
    assert proc.returncode == -signal.SIGTERM and log.closed


def test_the_whole_group_is_killed_after_the_grace(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE, start_new_session=True)
    child = int(proc.stdout.readline())
    stop_process_group(proc, grace_s=0.5)
    assert proc.returncode == -signal.SIGKILL
    assert _gone(child), "the server's own child outlived the stop"


def test_nothing_to_stop():
    stop_process_group(None, grace_s=1.0)
    done = subprocess.Popen([sys.executable, "-c", "pass"], start_new_session=True)
    done.wait()
    stop_process_group(done, grace_s=1.0)
    assert done.returncode == 0
