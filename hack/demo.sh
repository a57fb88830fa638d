#!/usr/bin/env bash
# The main job on an embedded default: replay the bundled recording of a sandbox fleet.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/hack/setup.sh"
exec deathwatch replay "$root/controller/data/sample-watch.json" "$@"
