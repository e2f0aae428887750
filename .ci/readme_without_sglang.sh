#!/usr/bin/env bash
# The README's two commands, exactly as written, on a fresh copy of the repository with a fresh
# virtual environment and WITHOUT the SGLang stack (no sglang, no torch): what a new user runs.
# The full CI run (.ci/run) installs the CPU SGLang stack, so it cannot see a test that fails to
# collect without it (issue 24: tests/sglang/test_sglang_plugin_consensus.py had no skip guard).
# The two ```bash blocks at the top of README.md are read from the file, so the README and this
# check cannot drift apart. Usage: bash .ci/readme_without_sglang.sh   (from the repository root)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A fresh tree: the tracked and not-ignored files only (no .venv, profile/, caches).
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work"
cd "$work"
blocks="$(awk '/^```bash$/{n++; inb=1; next} /^```$/{inb=0} inb && n<=2 {print n "\t" $0}' README.md)"
install_cmd="$(printf '%s\n' "$blocks" | sed -n 's/^1\t//p')"
test_cmd="$(printf '%s\n' "$blocks" | sed -n 's/^2\t//p')"
case "$install_cmd" in *"pip install -e"*) ;; *) echo "README's first bash block is not the install line: $install_cmd"; exit 1;; esac
case "$test_cmd" in *"pytest"*) ;; *) echo "README's second bash block is not the test line: $test_cmd"; exit 1;; esac
unset VIRTUAL_ENV PYTHONPATH
echo "README install: $install_cmd"
bash -euo pipefail -c "$install_cmd"
# The point of this run: neither sglang nor torch is importable in the README's venv.
.venv/bin/python -c "import importlib.util as u, sys; bad = [m for m in ('sglang', 'torch') if u.find_spec(m)]; \
sys.exit(f'the README venv has {bad}: this run must go without the SGLang stack' if bad else 0)"
echo "README tests (no SGLang stack): $test_cmd"
bash -euo pipefail -c "$test_cmd"
