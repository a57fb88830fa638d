#!/usr/bin/env bash
# A release made on this machine, pushed nowhere (hack/release.py says what it makes):
#   hack/release.sh VERSION [OUT]       e.g. hack/release.sh "$(cat VERSION)"
# Needs root, buildah and mmdebstrap for the images (hack/setup.sh), and Helm.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m hack.release "$@"
