#!/usr/bin/env bash
# Build the peers bench/peers.py runs next to deathwatch, from their published Go modules,
# into a cache outside the repository:
#
#   hack/build-peers.sh      -> $DEATHWATCH_CACHE/peers/<module>@<version>/{bin,src}
#
# `go install module@version` is refused by this machine's module proxy (403 on the version
# list), so: `go mod download -json module@version`, copy that read-only directory to a
# writable one, build there with the module's own go.mod/go.sum. Idempotent: a built binary
# is kept (its directory is keyed by the pinned version).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}
log() { printf '[build-peers] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go not found: install Go to build the peers"; exit 1; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# build MODULE VERSION PACKAGE BINARY [TAGS]
build() {
  local mod=$1 ver=$2 pkg=$3 name=$4 tags=${5:-}
  local top=$cache/peers/${mod//\//_}@$ver
  if [ -x "$top/bin/$name" ]; then
    log "$name $ver cached in $top/bin"
    return
  fi
  mkdir -p "$top/bin"
  local dir start=$(date +%s)
  dir=$(cd "$top" && go mod download -json "$mod@$ver" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "go mod download gave no directory for $mod@$ver"; exit 1; }
  rm -rf "$top/src" && cp -r "$dir" "$top/src" && chmod -R u+w "$top/src"
  log "building $name from $mod@$ver (first build takes a few minutes)"
  (cd "$top/src" && go build -trimpath -tags "$tags" -ldflags "-s -w" -o "$top/bin/$name.tmp" "$pkg")
  mv "$top/bin/$name.tmp" "$top/bin/$name"
  log "$name $ver built in $(($(date +%s) - start))s"
}

build k8s.io/kube-state-metrics/v2 "$KSM_VERSION" . kube-state-metrics
build sigs.k8s.io/agent-sandbox "$AGENT_SANDBOX_VERSION" ./cmd/agent-sandbox-controller agent-sandbox-controller
# not a peer: the network policy engine of the lanes that enforce NetworkPolicy (netpol.py)
build github.com/cloudnativelabs/kube-router/v2 "$KUBE_ROUTER_VERSION" ./cmd/kube-router kube-router
# not a peer: the node lane's modern runtime, beside Debian's containerd 1.6 (node.py,
# runtime="containerd2"): the CRI event stream (GetContainerEvents) the exits container reads
# there, and the kubelet's EventedPLEG baseline (ADR 0028). No btrfs, devmapper or zfs
# snapshotters (the node uses overlayfs): no cgo headers needed.
for cmd in containerd containerd-shim-runc-v2 ctr; do
  build github.com/containerd/containerd/v2 "$CONTAINERD_VERSION" "./cmd/$cmd" "$cmd" \
    "no_btrfs no_devmapper no_zfs"
done
# not a peer: the lanes' private registry (hack/localcluster/registry.py): go-containerregistry's
# registry behind basic auth, our few lines in hack/registry, keyed by their content
registry_key=$(cd "$here/registry" && cat go.mod go.sum main.go | sha256sum | cut -c1-16)
registry_bin=$cache/registry/$registry_key/registry
if [ -x "$registry_bin" ]; then
  log "registry cached in $(dirname "$registry_bin")"
else
  mkdir -p "$(dirname "$registry_bin")"
  (cd "$here/registry" && go build -trimpath -ldflags "-s -w" -o "$registry_bin.tmp" .)
  mv "$registry_bin.tmp" "$registry_bin"
  log "registry built in $(dirname "$registry_bin")"
fi
# not a peer: the Prometheus Operator's CRDs for the monitors the chart renders (the Helm lane
# applies them first, as a cluster with the Operator has them); files only, nothing built
operator=github.com/prometheus-operator/prometheus-operator
crds=$cache/peers/${operator//\//_}@$PROMETHEUS_OPERATOR_VERSION/crds
if [ -s "$crds/monitoring.coreos.com_servicemonitors.yaml" ]; then
  log "the Prometheus Operator's CRDs cached in $crds"
else
  dir=$(go mod download -json "$operator@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "go mod download gave no directory for $operator@$PROMETHEUS_OPERATOR_VERSION"; exit 1; }
  mkdir -p "$crds.tmp"
  for kind in servicemonitors podmonitors prometheusrules; do
    cp "$dir/example/prometheus-operator-crd/monitoring.coreos.com_$kind.yaml" "$crds.tmp/"
  done
  chmod -R u+w "$crds.tmp" && rm -rf "$crds" && mv "$crds.tmp" "$crds"
  log "the Prometheus Operator's CRDs in $crds"
fi
