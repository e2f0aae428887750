#!/usr/bin/env bash
# The package installs whole: build the wheel, install it NON-editable (core dependencies only)
# into a fresh virtual environment, and from a folder outside the repository run every
# command's --help, `profiler --version`, and a generate -> fit -> eval -> report round trip plus
# `simulate --workload coding-assistant` (the built-in workload specs are package data).
# Usage: bash .ci/wheel_roundtrip.sh   (from the repository root; about 2-4 minutes)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install -q --upgrade pip
"$work/venv/bin/python" -m pip wheel -q --no-deps -w "$work/dist" "$repo"
wheel="$(ls "$work"/dist/*.whl)"
"$work/venv/bin/python" -m pip install -q "$wheel"
cd "$work"                                     # nothing from the repository on sys.path
export PATH="$work/venv/bin:$PATH" COLUMNS=100
# every layer's package is in the wheel (store/ at the bottom, fitting/, ..., profiler/ on top)
python -c "
import importlib, pathlib
for name in ('store', 'synth', 'predictors', 'fitting', 'serving_hooks', 'simulator', 'profiler'):
    mod = importlib.import_module(name)
    assert '$repo' not in mod.__file__, mod.__file__
import store.workloads
assert sorted(p.name for p in pathlib.Path(store.workloads.SPEC_DIR).glob('*.json')), 'no workload specs'
"
profiler --version
commands="$(COLUMNS=200 profiler --help | sed -n 's/^│ \([a-z][a-z_-]*\) .*/\1/p')"
n=0
for cmd in $commands; do
  profiler "$cmd" --help > /dev/null || { echo "wheel round trip: 'profiler $cmd --help' failed"; exit 1; }
  n=$((n + 1))
done
[ "$n" -ge 10 ] || { echo "wheel round trip: only $n commands found in 'profiler --help'"; exit 1; }
echo "wheel round trip: --help of $n commands ok"
profiler generate --workload coding-assistant --workflows 60 --seed 1 --out logs/all.jsonl
profiler split logs/all.jsonl --out split
profiler fit split/train --out profile
profiler eval --profile profile split/test > eval.txt
profiler report --profile profile --out report.html --eval split/test
profiler simulate --workload coding-assistant --workflows 20 --policies sglang-default,ours --json > sim.json
python - <<'PY'
import json, pathlib
assert pathlib.Path("report.html").stat().st_size > 10_000
assert "coverage" in pathlib.Path("eval.txt").read_text().lower()
sim = json.loads(pathlib.Path("sim.json").read_text())
assert sim, "empty simulate output"
print("wheel round trip: ok")
PY
