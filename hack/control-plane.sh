#!/usr/bin/env bash
# A local control plane for people (the tests start their own):
#   hack/control-plane.sh up     build if needed, start etcd + kube-apiserver + kube-controller-manager
#   hack/control-plane.sh env    print the exports for kubectl: eval "$(hack/control-plane.sh env)"
#   hack/control-plane.sh down   stop everything and remove its files
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
case ${1:-} in
  up) "$root/hack/build-k8s.sh" >&2 && exec python3 -c "import sys; sys.path.insert(0, '$root'); from hack.localcluster import controlplane as c; sys.exit(c.cli_up())" ;;
  down) exec python3 -c "import sys; sys.path.insert(0, '$root'); from hack.localcluster import controlplane as c; sys.exit(c.cli_down())" ;;
  env) exec python3 -c "import sys; sys.path.insert(0, '$root'); from hack.localcluster import controlplane as c; sys.exit(c.cli_env())" ;;
  *) echo "usage: $0 up|down|env" >&2; exit 2 ;;
esac
