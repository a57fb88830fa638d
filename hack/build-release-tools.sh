#!/usr/bin/env bash
# Build the release's tools from their published Go modules into a cache outside the
# repository, as hack/build-helm.sh builds Helm (`go install mod@version` is refused here):
#
#   hack/build-release-tools.sh   -> $DEATHWATCH_CACHE/release-tools/{cosign,syft}-VERSION/bin/
#
# cosign signs a release's checksums and chart (hack/release.py); syft writes each image's
# SBOM. Pinned in versions.env. Idempotent: a binary that reports its pinned version is kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}
log() { printf '[build-release-tools] %s\n' "$*" >&2; }
command -v go >/dev/null || { log "go not found: install Go to build cosign and syft"; exit 1; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0

# build TOOL MODULE VERSION PACKAGE LDFLAGS: the module's own go.mod/go.sum, in a writable copy
build() {
  local tool=$1 module=$2 version=$3 package=$4 ldflags=$5
  local top=$cache/release-tools/$tool-$version
  if [ -x "$top/bin/$tool" ] && "$top/bin/$tool" version 2>/dev/null | grep -q "${version#v}"; then
    log "$tool $version cached in $top/bin"
    return
  fi
  mkdir -p "$top/bin"
  local start dir
  start=$(date +%s)
  dir=$(cd "$top" && go mod download -json "$module@$version" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
  [ -d "$dir" ] || { log "go mod download gave no directory for $module@$version"; exit 1; }
  rm -rf "$top/src" && cp -r "$dir" "$top/src" && chmod -R u+w "$top/src"
  log "building $tool $version (a first build takes minutes)"
  (cd "$top/src" && go build -trimpath -ldflags "-s -w $ldflags" -o "$top/bin/$tool.tmp.$$" "$package")
  mv "$top/bin/$tool.tmp.$$" "$top/bin/$tool"
  rm -rf "$top/src"
  "$top/bin/$tool" version 2>/dev/null | grep -q "${version#v}" \
    || { log "$tool does not report $version"; exit 1; }
  log "$tool $version built in $(($(date +%s) - start))s"
}

build cosign github.com/sigstore/cosign/v3 "$COSIGN_VERSION" ./cmd/cosign \
  "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION -X sigs.k8s.io/release-utils/version.gitTreeState=clean"
build syft github.com/anchore/syft "$SYFT_VERSION" ./cmd/syft \
  "-X main.version=${SYFT_VERSION#v} -X main.gitTreeState=clean"
