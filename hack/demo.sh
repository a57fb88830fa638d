#!/usr/bin/env bash
# The main job on an embedded default: a local control plane, the controller under its own
# ServiceAccount, a fleet of sandbox pods (we play their kubelet), verdicts shown live.
# Leaves nothing running. (Replay without a cluster: deathwatch replay tests/data/sample-watch.json)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/hack/setup.sh"
cd "$root" && exec python3 -m hack.demo "$@"
