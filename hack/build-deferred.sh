#!/usr/bin/env bash
# The builds only a few tests need, each by its own script, in turn (hack/deferred.py):
#
#   hack/build-deferred.sh NAME...                 build each here (hack/setup.sh, by default)
#   hack/build-deferred.sh --record DIR NAME...    and record each one's DIR/NAME.log and,
#                                                  when it ends, DIR/NAME.rc (its exit status)
#
# NAME: gvisor (the node lane's gVisor tests), release-tools (cosign and syft: a release's
# signature and SBOMs), k8s-matrix (the version lane's control planes, versions.env K8S_MATRIX).
# In a CI run of every lane, hack/setup.sh starts this with --record in its own session, beside
# the lanes: a cold machine builds these while the lanes wait on what they prove.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
record=
if [ "${1:-}" = --record ]; then
  record=$2
  shift 2
  mkdir -p "$record"
fi

build() {
  case $1 in
    gvisor) "$root/hack/build-gvisor.sh" ;;
    release-tools) "$root/hack/build-release-tools.sh" ;;
    k8s-matrix)
      # shellcheck source=versions.env
      for version in $(. "$root/hack/versions.env"; echo "$K8S_MATRIX"); do
        # `|| return`: under `build ... || rc=$?` bash ignores set -e, so each step says its own
        "$root/hack/build-k8s.sh" --version "$version" kube-apiserver kube-controller-manager \
          kube-scheduler || return $?
      done
      ;;
    *) printf '[build-deferred] unknown build: %s (gvisor, release-tools, k8s-matrix)\n' "$1" >&2; return 2 ;;
  esac
}

for name in "$@"; do
  if [ -z "$record" ]; then
    build "$name"
    continue
  fi
  start=$(date +%s)
  rc=0
  build "$name" >"$record/$name.log" 2>&1 </dev/null || rc=$?
  printf '[build-deferred] %s: exit %s after %ss\n' "$name" "$rc" "$(($(date +%s) - start))" >>"$record/$name.log"
  # the status last, whole: a reader that sees the file sees the build over
  echo "$rc" >"$record/$name.rc.tmp" && mv "$record/$name.rc.tmp" "$record/$name.rc"
done
