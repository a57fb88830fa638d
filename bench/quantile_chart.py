"""The benches' one chart: p50, p95 and p99 as grouped bars, one panel per run, each
labelled with its value (bench/latency_chart.py's peers, bench/node_latency.py's spans)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

QUANTILES = (("p50", "#4c72b0"), ("p95", "#dd8452"), ("p99", "#c44e52"))
Rows = Sequence[tuple[str, dict[str, Any]]]  # a bar group's label, its quantiles (ms)


def draw(
    panels: Sequence[tuple[str, Rows]], out: Path, *, ylabel: str, title: str,
    cols: int, size: tuple[float, float], fmt: str = "%.1f", label_size: float = 7,
    rotation: float = 15, tick_size: float | None = None, title_size: float | None = None,
) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cols = max(1, min(cols, len(panels)))
    height = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(height, cols, figsize=(size[0] * cols, size[1] * height),
                             sharey=True, squeeze=False)  # fmt: skip
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (panel_title, rows) in zip(flat, panels, strict=False):
        for i, (q, colour) in enumerate(QUANTILES):
            xs = [j + (i - 1) * 0.27 for j in range(len(rows))]
            bars = ax.bar(xs, [max(0.0, lat.get(q) or 0) for _, lat in rows], 0.27, label=q,
                          color=colour)  # fmt: skip
            ax.bar_label(bars, fmt=fmt, fontsize=label_size, padding=1)
        # a size of None is not matplotlib's default (font.size, not axes.titlesize): omitted
        ticks = {"fontsize": tick_size} if tick_size else {}
        ax.set_xticks(range(len(rows)), [name for name, _ in rows], rotation=rotation, **ticks)
        ax.set_title(panel_title, **({"fontsize": title_size} if title_size else {}))
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(loc="upper left")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
