"""The Grafana dashboard's panels (charts/deathwatch/files/dashboard.json), drawn from a real
Prometheus: each panel's own PromQL over a time range, plotted with matplotlib, one page.
Grafana itself is AGPL and not used here; this draws what its panels would show, from the
same queries and the same data (the Helm lane photographs it in headless Chromium).

    python3 -m hack.dashboard_preview http://127.0.0.1:9090 out.html [--minutes 30]
"""

from __future__ import annotations

import argparse
import html
import io
import json
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "charts" / "deathwatch" / "files" / "dashboard.json"
Series = tuple[str, list[tuple[float, float]]]


def query_range(prometheus: str, expr: str, start: float, end: float, step: float) -> list[Series]:
    query = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    with urllib.request.urlopen(f"{prometheus}/api/v1/query_range?{query}", timeout=30) as r:  # noqa: S310 - the caller's Prometheus
        body = json.load(r)
    out: list[Series] = []
    for result in body["data"]["result"]:
        labels = ", ".join(f"{k}={v}" for k, v in sorted(result["metric"].items())) or expr[:40]
        points = [(float(t), float(v)) for t, v in result["values"] if v not in ("NaN", "+Inf")]
        out.append((labels, points))
    return out


def fetch(prometheus: str, dashboard: dict[str, Any], start: float, end: float
          ) -> list[tuple[str, list[Series]]]:  # fmt: skip
    step = max(2.0, (end - start) / 240)
    return [(str(p.get("title", "")),
             [s for t in p.get("targets", []) for s in query_range(prometheus, t["expr"], start, end, step)])
            for p in dashboard["panels"]]  # fmt: skip


def page(panels: list[tuple[str, list[Series]]], title: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "svg.fonttype": "none"})
    figures = []
    for name, series in panels:
        fig, ax = plt.subplots(figsize=(5.4, 2.4))
        t0 = min((p[0][0] for _, p in series if p), default=0.0)
        for label, points in series[:8]:
            if points:
                ax.plot([(t - t0) / 60 for t, _ in points], [v for _, v in points],
                        label=label[:48], linewidth=1.2)  # fmt: skip
        ax.set_title(name, fontsize=9, loc="left")
        ax.set_xlabel("minutes")
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=6, loc="upper left")
        buf = io.StringIO()
        fig.savefig(buf, format="svg", bbox_inches="tight")
        plt.close(fig)
        svg = buf.getvalue()
        figures.append(f"<div class=panel>{svg[svg.index('<svg') :]}</div>")
    return ("<!doctype html><html lang=en><head><meta charset=utf-8><title>"
            f"{html.escape(title)}</title><style>body{{font-family:sans-serif;margin:16px;"
            "background:#fff}.grid{display:grid;grid-template-columns:1fr 1fr;gap:8px}"
            ".panel svg{width:100%;height:auto}</style></head><body>"
            f"<h2>{html.escape(title)}</h2><div class=grid>{''.join(figures)}</div></body></html>\n")  # fmt: skip


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("prometheus")
    ap.add_argument("out", type=Path)
    ap.add_argument("--minutes", type=float, default=30.0)
    args = ap.parse_args(argv)
    dashboard = json.loads(DASHBOARD.read_text())
    end = time.time()
    panels = fetch(args.prometheus, dashboard, end - args.minutes * 60, end)
    args.out.write_text(page(panels, f"{dashboard.get('title', 'deathwatch')} (from Prometheus)"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
