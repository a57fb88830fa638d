#!/usr/bin/env bash
# Build the pinned Kubernetes components (and etcd) from Go modules into a cache
# outside the repository, the way envtest-style suites get a real control plane.
#
#   hack/build-k8s.sh [--version vX.Y.Z] [component...]
#                                        default: etcd kube-apiserver kube-controller-manager kubectl
#   --version: another release than K8S_VERSION (the shard lanes' kube-apiserver, with
#   KEP-5866's ShardedListAndWatch: SHARDS_APISERVER_VERSION), in its own cache directory
#   components: etcd kube-apiserver kube-controller-manager kubectl kubelet kube-scheduler kube-proxy
#
# Idempotent: a binary whose --version already reports the pinned version is kept.
# Output: $DEATHWATCH_CACHE/k8s/$K8S_VERSION/bin (DEATHWATCH_CACHE defaults to ~/.cache/deathwatch).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
if [ "${1:-}" = --version ]; then
  K8S_VERSION=$2
  shift 2
fi

cache=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}
bin=$cache/k8s/$K8S_VERSION/bin
src=$cache/k8s/$K8S_VERSION/src
mkdir -p "$bin" "$src"

components=("$@")
[ ${#components[@]} -gt 0 ] || components=(etcd kube-apiserver kube-controller-manager kubectl)

log() { printf '[build-k8s] %s\n' "$*" >&2; }

# The version a cached binary reports, or empty.
reported_version() {
  local b=$bin/$1
  [ -x "$b" ] || return 0
  case $1 in
    etcd) "$b" --version 2>/dev/null | sed -n 's/^etcd Version: /v/p' ;;
    kubectl) "$b" version --client 2>/dev/null | sed -n 's/^Client Version: //p' ;;
    *) "$b" --version 2>/dev/null | awk '{print $2}' ;;
  esac
}

want_version() { if [ "$1" = etcd ]; then echo "$ETCD_VERSION"; else echo "$K8S_VERSION"; fi; }

todo=()
for c in "${components[@]}"; do
  case $c in etcd | kube-apiserver | kube-controller-manager | kubectl | kubelet | kube-scheduler | kube-proxy) ;;
    *) log "unknown component: $c"; exit 2 ;;
  esac
  have=$(reported_version "$c")
  if [ "$have" = "$(want_version "$c")" ]; then
    log "$c $have cached in $bin"
  else
    todo+=("$c")
  fi
done
[ ${#todo[@]} -gt 0 ] || exit 0

command -v go >/dev/null || { log "go not found: install Go to build the control plane"; exit 1; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# --- the tools module for k8s.io/kubernetes -------------------------------------------
# k8s.io/kubernetes requires its staging modules at v0.0.0 and replaces them with
# ./staging paths, which do not exist in the published module. Replace each one with
# the published v0.X.Y of the same release, generated from the release's own go.mod.
kube_tools() {
  local dir=$src/kubernetes stage=${K8S_VERSION/#v1./v0.}
  mkdir -p "$dir"
  if [ ! -f "$dir/.ready" ]; then
    log "preparing tools module for k8s.io/kubernetes@$K8S_VERSION (staging at $stage)"
    local modfile
    modfile=$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')
    {
      echo "module deathwatch.local/k8s-tools"
      echo
      echo "go $(go env GOVERSION | sed 's/^go//; s/\.[0-9]*$//').0"
      echo
      echo "require k8s.io/kubernetes $K8S_VERSION"
      echo
      echo "replace ("
      # every "k8s.io/x => ./staging/src/k8s.io/x" line of the release's go.mod
      sed -n 's#^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$stage"'#p' "$modfile"
      echo ")"
    } >"$dir/go.mod"
    [ "$(grep -c ' => ' "$dir/go.mod")" -gt 20 ] || { log "replace list looks wrong:"; cat "$dir/go.mod" >&2; exit 1; }
    # resolve the dependency graph once; the builds below then only compile
    (cd "$dir" && go get "k8s.io/kubernetes@$K8S_VERSION" >&2)
    touch "$dir/.ready"
  fi
  echo "$dir"
}

etcd_tools() {
  local dir=$src/etcd
  mkdir -p "$dir"
  if [ ! -f "$dir/.ready" ]; then
    log "preparing tools module for go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    printf 'module deathwatch.local/etcd-tools\n\ngo %s\n' "$(go env GOVERSION | sed 's/^go//; s/\.[0-9]*$//').0" >"$dir/go.mod"
    (cd "$dir" && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null)
    touch "$dir/.ready"
  fi
  echo "$dir"
}

kube_ldflags() {
  local v=$K8S_VERSION major minor
  major=${v#v}; major=${major%%.*}
  minor=${v#v*.}; minor=${minor%%.*}
  local f="-s -w"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    f+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    f+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$f"
}

for c in "${todo[@]}"; do
  start=$(date +%s)
  if [ "$c" = etcd ]; then
    dir=$(etcd_tools)
    log "building etcd $ETCD_VERSION (first build takes a few minutes)"
    (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3)
  else
    dir=$(kube_tools)
    log "building $c $K8S_VERSION (first build takes several minutes)"
    (cd "$dir" && go build -trimpath -ldflags "$(kube_ldflags)" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c")
  fi
  mv "$bin/$c.tmp" "$bin/$c"
  got=$(reported_version "$c")
  [ "$got" = "$(want_version "$c")" ] || { log "$c reports '$got', wanted $(want_version "$c")"; exit 1; }
  log "$c $got built in $(($(date +%s) - start))s"
done
