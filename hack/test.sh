#!/usr/bin/env bash
# The whole test suite: lint, format, types, import contracts, then pytest (every lane).
#   hack/test.sh                   every lane, the node's and the rest at once (hack/lanes.py)
#   hack/test.sh [pytest args...]  one pytest, as given (a lane, a test, -k ...)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [ $# -eq 0 ]; then
  # every lane: the builds only a few tests need go on beside them (hack/deferred.py)
  DEATHWATCH_DEFERRED=$(mktemp -d "${TMPDIR:-/tmp}/dw-deferred-XXXXXX")
  export DEATHWATCH_DEFERRED
fi
hack/setup.sh
echo "[test] ruff check" >&2 && ruff check .
echo "[test] ruff format --check" >&2 && ruff format --check .
echo "[test] mypy" >&2 && mypy
echo "[test] lint-imports (the layers: .importlinter)" >&2 && lint-imports --no-cache
if [ $# -eq 0 ]; then
  echo "[test] pytest: the node's lanes and the rest at once (hack/lanes.py)" >&2
  exec python3 -m hack.lanes
fi
echo "[test] pytest $*" >&2
exec python3 -m pytest "$@"
