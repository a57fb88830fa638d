#!/usr/bin/env bash
# The README's pictures, taken in a real headless browser (Debian's chromium: apt-get install
# chromium), never drawn by hand:
#   hack/screenshots.sh      -> docs/images/replay-report.png
# The replay report of tests/data/disruptions.json (a recording of the cluster's own deaths on
# the real control plane: drains, preemption, taint evictions, pod GC, a silent node).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v chromium >/dev/null || { echo "screenshots: chromium not found (apt-get install chromium)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m deathwatch._cli replay tests/data/disruptions.json --format html > "$work/report.html"
# the flags a closed network needs (no background fetches, no first-run, no sandbox as root)
chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --user-data-dir="$work/profile" --hide-scrollbars --window-size=1150,2700 \
  --screenshot="$work/report.png" "file://$work/report.html" 2>/dev/null
mv "$work/report.png" docs/images/replay-report.png
echo "wrote docs/images/replay-report.png"
