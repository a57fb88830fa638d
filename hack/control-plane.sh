#!/usr/bin/env bash
# A local control plane for people (the tests start their own):
#   hack/control-plane.sh up     build if needed, start etcd + kube-apiserver + kube-controller-manager
#   hack/control-plane.sh env    print the exports for kubectl: eval "$(hack/control-plane.sh env)"
#   hack/control-plane.sh down   stop everything and remove its files
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
case ${1:-} in
  up) hack/build-k8s.sh >&2 && exec python3 -m hack.localcluster.controlplane up ;;
  down | env) exec python3 -m hack.localcluster.controlplane "$1" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
