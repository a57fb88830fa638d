#!/usr/bin/env bash
# The documentation's pictures, taken in a real headless browser (Debian's chromium: apt-get install
# chromium), never drawn by hand:
#   hack/screenshots.sh [DIR]      -> DIR/replay-report.png (DIR: docs/images)
# The replay report of tests/data/disruptions.json (a recording of the cluster's own deaths on
# the real control plane: drains, preemption, taint evictions, pod GC, a silent node). The
# browser lane (tests/browser/) runs this same script in CI.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/images}
command -v chromium >/dev/null || { echo "screenshots: chromium not found (apt-get install chromium)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m deathwatch._cli replay tests/data/disruptions.json --format html > "$work/report.html"
python3 -m hack.browser "$work/report.html" "$work/report.png" 1150 2700
mkdir -p "$out"
mv "$work/report.png" "$out/replay-report.png"
echo "wrote $out/replay-report.png"
