#!/usr/bin/env bash
# End-to-end on a kind cluster (machines with Docker; changes a cluster, so opt-in):
#   hack/kind-e2e.sh
# Creates the kind cluster "deathwatch-e2e", builds and loads both images, applies
# manifests/, proves on real kubelets: a killed sandbox is Dead within 2 s; a hostNetwork pod
# is refused the agent port while an ordinary pod connects; an exec-probe sandbox becomes
# Ready while a tcpSocket-probe one never does and is flagged. Deletes the cluster at the end.
# Needs: docker, kind, kubectl on PATH. KEEP_CLUSTER=1 keeps it for debugging.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool not found" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "kind-e2e: no Docker engine reachable" >&2; exit 2; }
cd "$root"
DEATHWATCH_E2E=1 exec python3 -m pytest -m e2e -p no:cacheprovider tests/e2e/test_kind.py "$@"
