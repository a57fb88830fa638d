#!/usr/bin/env bash
# Build the pinned Helm from its published Go module into a cache outside the repository,
# the way hack/build-k8s.sh builds Kubernetes:
#
#   hack/build-helm.sh      -> $DEATHWATCH_CACHE/helm/$HELM_VERSION/bin/helm
#
# `go install helm.sh/helm/v3/cmd/helm@version` is refused by this machine's module proxy (403
# on the version list), so: `go mod download -json`, copy that read-only directory to a
# writable one, build there with the module's own go.mod/go.sum. Idempotent: a binary that
# reports the pinned version is kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}
top=$cache/helm/$HELM_VERSION
log() { printf '[build-helm] %s\n' "$*" >&2; }

# a binary built as Helm's Makefile builds it: with the Kubernetes version of its client-go as
# the default of `helm template` and `helm lint` (without it, v1.20.0: a chart's kubeVersion
# then fails every render); the stamp says the binary was built so
if [ -x "$top/bin/helm" ] && [ -f "$top/bin/.k8s-version" ] \
    && "$top/bin/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"; then
  log "helm $HELM_VERSION cached in $top/bin"
  exit 0
fi
command -v go >/dev/null || { log "go not found: install Go to build Helm"; exit 1; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local}
mkdir -p "$top/bin"
start=$(date +%s)
dir=$(cd "$top" && go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { log "go mod download gave no directory for helm.sh/helm/v3@$HELM_VERSION"; exit 1; }
rm -rf "$top/src" && cp -r "$dir" "$top/src" && chmod -R u+w "$top/src"
log "building helm $HELM_VERSION (first build takes a few minutes)"
client_go=$(cd "$top/src" && go list -f '{{.Version}}' -m k8s.io/client-go)  # v0.35.1
k8s_minor=$(echo "$client_go" | cut -d. -f2)
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
done
(cd "$top/src" && go build -trimpath -ldflags "$ldflags" -o "$top/bin/helm.tmp.$$" ./cmd/helm)
mv "$top/bin/helm.tmp.$$" "$top/bin/helm"  # two builds at once: each moves its own
echo "1.$k8s_minor" > "$top/bin/.k8s-version"
got=$("$top/bin/helm" version --template '{{.Version}}')
[ "$got" = "$HELM_VERSION" ] || { log "helm reports '$got', wanted $HELM_VERSION"; exit 1; }
log "helm $got built in $(($(date +%s) - start))s"
