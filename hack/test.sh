#!/usr/bin/env bash
# The whole test suite: lint, format, types, import contracts, then pytest (every lane).
#   hack/test.sh [pytest args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
hack/setup.sh
echo "[test] ruff check" >&2 && ruff check .
echo "[test] ruff format --check" >&2 && ruff format --check .
echo "[test] mypy" >&2 && mypy
echo "[test] lint-imports (the layers: .importlinter)" >&2 && lint-imports --no-cache
echo "[test] pytest" >&2
exec python3 -m pytest "$@"
