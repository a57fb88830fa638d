#!/usr/bin/env python3
"""The README's latency chart, drawn (matplotlib) from a `bench.peers --json` run:

    python3 -m bench.peers --pods 1000,10000 --tools deathwatch,agent-sandbox,kopf-noop \
        --json bench/results/peers.json
    python3 -m bench.latency_chart bench/results/peers.json docs/images/latency.png

One panel per N: each tool's p50, p95 and p99 from a pod status write to its verdict seen on
the bench's own watch, beside the watch baseline (the same write seen on a pod watch: what
any watcher pays); tools that give no verdict (kopf no-op) are left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def draw(results: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = results["runs"]
    fig, axes = plt.subplots(1, len(runs), figsize=(5.2 * len(runs), 3.6), sharey=True,
                             squeeze=False)  # fmt: skip
    for ax, run in zip(axes[0], runs, strict=True):
        rows = [(name, t["latency_ms"]) for name, t in run["tools"].items() if t.get("latency_ms")]
        base = run.get("baseline_watch_ms") or {}
        if base:
            rows.insert(0, ("watch baseline", base))
        labels = [name for name, _ in rows]
        for i, (q, colour) in enumerate((("p50", "#4c72b0"), ("p95", "#dd8452"),
                                         ("p99", "#c44e52"))):  # fmt: skip
            xs = [j + (i - 1) * 0.27 for j in range(len(rows))]
            ax.bar(xs, [lat.get(q) or 0 for _, lat in rows], 0.27, label=q, color=colour)
        ax.set_xticks(range(len(rows)), labels, rotation=15)
        ax.set_title(f"N = {run['pods']:,} sandboxes, {run.get('rate', 20):g} status writes/s")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("status write → verdict seen (ms)")
    axes[0][0].legend(loc="upper left")
    fig.suptitle("deathwatch next to agent-sandbox, one run each (bench/peers.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m bench.latency_chart RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        results = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as exc:
        print(f"latency_chart: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    draw(results, Path(argv[1]))
    print(f"wrote {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
