#!/usr/bin/env bash
# Build both product images from controller/Dockerfile and firewall/Dockerfile with buildah
# (no Docker engine, no registry) into OCI archives in ~/.cache/deathwatch/images, keyed by
# content: nothing is rebuilt unless its inputs changed. Needs root, buildah and mmdebstrap.
#   hack/build-images.sh [--json]     prints each image's sizes and the firewall's packages
# (docs/adr/0010; hack/localcluster/productimages.py does the work)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 -m hack.localcluster.productimages "$@"
