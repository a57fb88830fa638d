#!/usr/bin/env bash
# A release made on this machine from its tag, pushed nowhere (hack/release.py says what):
#   git worktree add /tmp/v0.1.0 v0.1.0 && /tmp/v0.1.0/hack/release.sh 0.1.0 --key cosign.key
# Needs root, buildah and mmdebstrap for the images (hack/setup.sh), Helm, cosign and syft
# (hack/build-release-tools.sh); the key's password in COSIGN_PASSWORD.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m hack.release "$@"
