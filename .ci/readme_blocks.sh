#!/usr/bin/env bash
# Every ```bash block of README.md, in order, on a fresh copy of the repository with no virtual
# environment: what a new user runs top to bottom (issue 35). The README's first block makes the
# environment (without the SGLang stack: checked), the second runs the tests, the rest are the
# main path and the serving lines. How each line is run, and the rule for the long-running
# servers (start, check one call, stop), is in .ci/readme_blocks.py's docstring.
#
# Usage (from the repository root):
#   bash .ci/readme_blocks.sh                        # as CI runs it: the README's whole test run
#   README_TESTS=collect bash .ci/readme_blocks.sh   # a shared machine: collect the tests only
# The ports the README's serving lines name (8700, 8000, 8080, 30000, 10000) must be free.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
# A fresh tree: the tracked and not-ignored files only (no .venv, profile/, caches), and no
# ../shared beside it, as on a new user's machine (the tests that need it skip and say why).
mkdir "$work/repo"
(cd "$repo" && git ls-files -co --exclude-standard -z | tar --null -T - -cf -) | tar -xf - -C "$work/repo"
cd "$work/repo"
unset VIRTUAL_ENV PYTHONPATH
python3 "$repo/.ci/readme_blocks.py"
