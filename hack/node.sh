#!/usr/bin/env bash
# A real node (containerd + runc + CNI bridge + kubelet) joined to the local control plane:
#   hack/control-plane.sh up && hack/node.sh up     then: kubectl get nodes
#   hack/node.sh down                               removes every process, mount, cgroup,
#                                                   netns, bridge and nft table it created
# Needs root, Debian packages containerd runc containernetworking-plugins busybox-static
# (hack/setup.sh installs them) and the kubelet (hack/build-k8s.sh kubelet).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
case ${1:-} in
  up) hack/build-k8s.sh kubelet >&2 && exec python3 -m hack.localcluster.node up ;;
  down) exec python3 -m hack.localcluster.node down ;;
  *) echo "usage: $0 up|down" >&2; exit 2 ;;
esac
