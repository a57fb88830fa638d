#!/usr/bin/env bash
# Regenerate the exit observer's protobuf modules from firewall/protos/*.proto (the subsets of
# the CRI and of containerd's API it reads) with grpcio-tools, pinned in requirements-dev.txt:
#   hack/gen_protos.sh            write firewall/src/deathwatch/firewall/protos/*_pb2.py{,i}
#   hack/gen_protos.sh DIR        write them to DIR instead (the unit test compares)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-firewall/src/deathwatch/firewall/protos}"
mkdir -p "$out"
python3 -m grpc_tools.protoc -Ifirewall/protos --python_out="$out" --pyi_out="$out" \
  firewall/protos/cri.proto firewall/protos/containerd.proto
