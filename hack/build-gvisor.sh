#!/usr/bin/env bash
# Build gVisor's runsc and its containerd shim (containerd-shim-runsc-v1) from the pinned
# gvisor.dev/gvisor module (its `go` branch, pure Go) into a cache outside the repository,
# as hack/build-helm.sh builds Helm:
#
#   hack/build-gvisor.sh    -> $DEATHWATCH_CACHE/gvisor/$GVISOR_VERSION/bin/{runsc,containerd-shim-runsc-v1}
#
# Statically (CGO_ENABLED=0): a cgo build links the host's loader, which is gone after runsc's
# pivot_root ("error executing umounter: fork/exec /proc/self/exe: no such file or directory").
# For this machine only (the test harness, never a shipped artifact): root here lacks
# CAP_SYS_RESOURCE, so lowering an oom_score_adj fails (EACCES); the shim's -999 for itself
# and runsc's for a sandbox's processes are tolerated (logged) instead of failing the start.
# Idempotent: binaries whose stamp names the version and patch are kept.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
. "$here/versions.env"
cache=${DEATHWATCH_CACHE:-$HOME/.cache/deathwatch}
top=$cache/gvisor/$GVISOR_VERSION
log() { printf '[build-gvisor] %s\n' "$*" >&2; }
stamp="$GVISOR_VERSION permission-tolerant-oom-score-adj"
if [ -x "$top/bin/runsc" ] && [ -x "$top/bin/containerd-shim-runsc-v1" ] \
    && [ "$(cat "$top/bin/.stamp" 2>/dev/null)" = "$stamp" ]; then
  log "runsc and its shim $GVISOR_VERSION cached in $top/bin"
  exit 0
fi
command -v go >/dev/null || { log "go not found: install Go to build gVisor"; exit 1; }
export GOFLAGS=-mod=mod GOTOOLCHAIN=${GOTOOLCHAIN:-local} CGO_ENABLED=0
mkdir -p "$top/bin"
start=$(date +%s)
dir=$(cd "$top" && go mod download -json "gvisor.dev/gvisor@$GVISOR_VERSION" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
[ -d "$dir" ] || { log "go mod download gave no directory for gvisor.dev/gvisor@$GVISOR_VERSION"; exit 1; }
rm -rf "$top/src" && cp -r "$dir" "$top/src" && chmod -R u+w "$top/src"
# the two oom_score_adj writes, a refusal tolerated (this machine's missing CAP_SYS_RESOURCE)
python3 - "$top/src" <<'PY'
import sys
from pathlib import Path

src = Path(sys.argv[1])
edits = {
    "pkg/shim/v1/manager.go": (
        "\tif err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {\n",
        "\tif err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil && !errors.Is(err, os.ErrPermission) {\n",
    ),
    "runsc/container/container.go": (
        "\t\treturn fmt.Errorf(\"setting oom_score_adj to %d: %v\", scoreAdj, err)\n",
        "\t\tif errors.Is(err, os.ErrPermission) {\n\t\t\tlog.Warningf(\"oom_score_adj %d refused (no CAP_SYS_RESOURCE): %v\", scoreAdj, err)\n\t\t\treturn nil\n\t\t}\n\t\treturn fmt.Errorf(\"setting oom_score_adj to %d: %v\", scoreAdj, err)\n",
    ),
}
for path, (old, new) in edits.items():
    text = (src / path).read_text()
    if text.count(old) != 1:
        sys.exit(f"{path}: the line to patch is not there once: {old.strip()}")
    (src / path).write_text(text.replace(old, new))
PY
for file in pkg/shim/v1/manager.go runsc/container/container.go; do
  for imp in '"errors"' '"os"'; do
    grep -q "^\s*$imp$" "$top/src/$file" || sed -i "0,/^import (/s//import (\n\t$imp/" "$top/src/$file"
  done
done
log "building runsc and containerd-shim-runsc-v1 $GVISOR_VERSION (static)"
(cd "$top/src" && go build -trimpath -ldflags "-s -w" -o "$top/bin/runsc.tmp.$$" ./runsc \
  && go build -trimpath -ldflags "-s -w" -o "$top/bin/containerd-shim-runsc-v1.tmp.$$" ./shim)
mv "$top/bin/runsc.tmp.$$" "$top/bin/runsc"
mv "$top/bin/containerd-shim-runsc-v1.tmp.$$" "$top/bin/containerd-shim-runsc-v1"
rm -rf "$top/src"
echo "$stamp" > "$top/bin/.stamp"
log "built in $(($(date +%s) - start))s"
