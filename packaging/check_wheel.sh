#!/usr/bin/env bash
# Build hearth's wheel and prove it installs and runs in a fresh venv (no network needed beyond what pip has
# cached: dependencies are not reinstalled, --no-deps keeps this quick).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m pip wheel -q --no-deps -w "$work/dist" "$root"
python3 -m venv --system-site-packages "$work/venv"
"$work/venv/bin/pip" install -q --no-deps "$work"/dist/hearth_llm-*.whl
cd "$work"
"$work/venv/bin/hearth" --version
"$work/venv/bin/python" -c "import app, backends, hwprobe, kernels; print('packages ok')"
