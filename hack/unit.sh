#!/usr/bin/env bash
# The fast loop: the unit tests (tests/unit: pure logic, fakes, no cluster), in seconds.
#   hack/unit.sh [pytest args...]      e.g. hack/unit.sh -k writer -x
# Needs only the Python packages (pip install -r requirements-dev.txt), not hack/setup.sh.
# Property tests try a tenth of their examples here (tests/examples.py); hack/test.sh (and
# CI) runs everything in full, every lane.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEATHWATCH_QUICK=${DEATHWATCH_QUICK:-1}
exec python3 -m pytest -q -p no:cacheprovider tests/unit "$@"
