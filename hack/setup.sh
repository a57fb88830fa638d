#!/usr/bin/env bash
# Install what deathwatch needs on a fresh Debian machine; idempotent and quick when done.
#   hack/setup.sh            Python packages + test tools, nftables/iproute2, Prometheus (its
#                            promtool tests the alerts), Chromium (the documentation's pictures), Helm, the control plane
#                            (+ scheduler), a node's parts (containerd, runc, CNI plugins,
#                            busybox, kubelet, kube-proxy), and both product images built from
#                            their Dockerfiles (buildah + mmdebstrap; no engine, no registry)
# Heavy outputs (Go-built Kubernetes binaries, images) live in ~/.cache/deathwatch, outside
# the repo, keyed by version or content: a second run builds nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
log() { printf '[setup] %s\n' "$*" >&2; }

missing=()
for pkg in nftables iproute2 containerd runc containernetworking-plugins busybox-static openssl \
    buildah mmdebstrap prometheus chromium iptables ipset dnsmasq-base; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    log "installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    log "not root: cannot install ${missing[*]} (firewall and node tests will skip outside CI)"
  fi
fi

# keyed by this checkout too: the editable installs point at one directory, and each CI run
# is a fresh clone somewhere else
stamp=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}/pip-$( (cat "$root/requirements-dev.txt" "$root"/kube/pyproject.toml "$root"/controller/pyproject.toml "$root"/firewall/pyproject.toml; echo "$root") | sha256sum | cut -c1-16)
# the editable installs must point at this checkout (one site-packages serves every clone)
installed_here() {
  (cd / && python3 -c 'import sys, deathwatch.policy as p, deathwatch.firewall.cli as f, deathwatch._kube.errors as k
sys.exit(not all(m.__file__.startswith(sys.argv[1]) for m in (p, f, k)))' "$root/") 2>/dev/null
}
if [ ! -f "$stamp" ] || ! installed_here || ! command -v deathwatch >/dev/null \
    || ! command -v deathwatch-firewall >/dev/null; then
  log "installing the deathwatch distributions (editable) and test tools (pip)"
  (cd "$root" && python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore -r requirements-dev.txt)
  mkdir -p "$(dirname "$stamp")" && touch "$stamp"
fi

if command -v go >/dev/null; then
  "$root/hack/build-k8s.sh" etcd kube-apiserver kube-controller-manager kubectl kubelet \
    kube-scheduler kube-proxy
  # the shard lanes' API server, with KEP-5866's sharded list and watch (versions.env)
  # shellcheck source=versions.env
  "$root/hack/build-k8s.sh" --version "$(. "$root/hack/versions.env"; echo "$SHARDS_APISERVER_VERSION")" \
    kube-apiserver
  # the tools bench/peers.py measures deathwatch against (its smoke check, out of CI: python3 -m pytest bench), and peers the lanes run
  "$root/hack/build-peers.sh"
  # Helm: the chart's lint, render and install lanes
  "$root/hack/build-helm.sh"
  # what a few tests alone need (hack/deferred.py): gVisor's runsc and its containerd shim (the
  # node lane's gvisor RuntimeClass, issue #54), cosign and syft (a release's signature and
  # SBOMs), and the version lane's releases (each one's control plane, versions.env K8S_MATRIX).
  # In a CI run of every lane (hack/test.sh sets DEATHWATCH_DEFERRED) they build beside the
  # lanes, in a session of their own; the tests that need one wait for it.
  deferred=(gvisor release-tools k8s-matrix)
  if [ -n "${DEATHWATCH_DEFERRED:-}" ] && [ -f "$DEATHWATCH_DEFERRED/k8s-matrix.pid" ]; then
    log "already building beside the lanes: ${deferred[*]} (in $DEATHWATCH_DEFERRED)"
  elif [ -n "${DEATHWATCH_DEFERRED:-}" ]; then
    mkdir -p "$DEATHWATCH_DEFERRED"
    log "building beside the lanes, at once: ${deferred[*]} (logs in $DEATHWATCH_DEFERRED)"
    for name in "${deferred[@]}"; do
      # at the lowest CPU and I/O priority: the lanes' timing-sensitive tests (a SIGKILL's
      # cgroup read within milliseconds of its exit, a reshard's writer gap) keep the machine;
      # the builds take what the lanes leave, which is most of it (they wait, mostly)
      setsid nice -n 19 ionice -c 3 "$root/hack/build-deferred.sh" --record "$DEATHWATCH_DEFERRED" \
        "$name" </dev/null >>"$DEATHWATCH_DEFERRED/builds.log" 2>&1 &
      echo $! >"$DEATHWATCH_DEFERRED/$name.pid"
    done
  else
    "$root/hack/build-deferred.sh" "${deferred[@]}"
  fi
else
  log "go not found: the real control plane cannot be built; apiserver tests will skip outside CI"
fi

if [ "$(id -u)" = 0 ] && command -v buildah >/dev/null && command -v mmdebstrap >/dev/null; then
  "$root/hack/build-images.sh" >&2
else
  log "not root or no buildah/mmdebstrap: the product images are not built (deploy lane skips)"
fi
