#!/usr/bin/env python3
"""The performance page's chart and table (docs/performance.md), both from one `bench.peers --json` run:

    python3 -m bench.peers --pods 1000,10000 --tools deathwatch,agent-sandbox,kopf-noop \
        --json bench/results/peers.json
    python3 -m bench.latency_chart bench/results/peers.json docs/images/latency.png

One panel per N: each tool's p50, p95 and p99 from a pod status write to its verdict seen on
the bench's own watch, beside the watch baseline (the same write seen on a pod watch: what
any watcher pays); tools that give no verdict (kopf no-op) are left out of the chart and
shown in the table by their CPU and memory. It prints the page's table (`markdown`), which
tests/unit/test_latency_chart.py holds the page to, so the numbers there are this file's.

A file that is not a peers result is one line naming what is missing, and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import quantile_chart

QUANTILES = ("p50", "p95", "p99", "max")
LABELS = {"agent-sandbox": "agent-sandbox", "kopf-noop": "kopf no-op"}


class ResultsError(ValueError):
    """The file is not a `bench.peers --json` result; the message names where."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ResultsError(f"{where}: expected a number, got {value!r}")
    return float(value)


def validate(results: Any) -> dict[str, Any]:
    """The result itself if it has what the chart and table read, else ResultsError."""
    if not isinstance(results, dict):
        raise ResultsError("not a bench.peers result: the top level is not an object")
    runs = results.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ResultsError("not a bench.peers result: no 'runs' (run bench.peers with --json)")
    for i, run in enumerate(runs):
        where = f"runs[{i}]"
        if not isinstance(run, dict):
            raise ResultsError(f"{where}: not an object")
        _number(run.get("pods"), f"{where}.pods")
        tools = run.get("tools")
        if not isinstance(tools, dict) or not tools:
            raise ResultsError(f"{where}.tools: missing or empty")
        for name, tool in tools.items():
            at = f"{where}.tools.{name}"
            if not isinstance(tool, dict):
                raise ResultsError(f"{at}: not an object")
            for key in ("rss_at_n_mib", "cpu_s_load", "writes_per_lifecycle"):
                _number(tool.get(key), f"{at}.{key}")
            latency = tool.get("latency_ms")
            if latency is not None:
                if not isinstance(latency, dict):
                    raise ResultsError(f"{at}.latency_ms: not an object")
                for q in QUANTILES:
                    _number(latency.get(q), f"{at}.latency_ms.{q}")
    return results


def load(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ResultsError(exc.strerror or str(exc)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ResultsError(f"not JSON: {exc}") from None
    return validate(data)


def _label(name: str, versions: dict[str, Any]) -> str:
    if name == "agent-sandbox" and versions.get("AGENT_SANDBOX_VERSION"):
        return f"agent-sandbox {versions['AGENT_SANDBOX_VERSION']}"
    return LABELS.get(name, name)


def ratios(run: dict[str, Any]) -> str | None:
    """deathwatch next to agent-sandbox (latency) and to kopf no-op (CPU per replica: both
    deathwatch replicas are counted together in the bench), or None without them."""
    tools = run["tools"]
    dw, sandbox, noop = (tools.get(t) for t in ("deathwatch", "agent-sandbox", "kopf-noop"))
    if not (dw and sandbox and dw["latency_ms"] and sandbox["latency_ms"]):
        return None
    p50 = dw["latency_ms"]["p50"] / sandbox["latency_ms"]["p50"]
    p99 = dw["latency_ms"]["p99"] / sandbox["latency_ms"]["p99"]
    line = f"- At {run['pods']:,}: p50 {p50:.2f}x agent-sandbox's, p99 {p99:.2f}x"
    if noop and noop["cpu_s_load"]:
        per_replica = dw["cpu_s_load"] / 2
        line += (
            f"; CPU per replica {per_replica / noop['cpu_s_load']:.2f}x kopf no-op's"
            f" ({per_replica:.2f} s against {noop['cpu_s_load']})"
        )
    return line + "."


def markdown(results: dict[str, Any]) -> str:
    """The performance page's one table, and a line of ratios per N."""
    versions = results.get("versions") or {}
    lines = [
        "| N | tool | p50 ms | p95 ms | p99 ms | max ms | seen | RSS at N MiB | CPU s in load "
        "| writes/lifecycle |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results["runs"]:
        for name, tool in run["tools"].items():
            lat = tool["latency_ms"]
            cells = [str(lat[q]) for q in QUANTILES] if lat else ["—"] * 4
            seen = str(tool.get("seen", "—")) if lat else "—"
            lines.append(
                f"| {run['pods']:,} | {_label(name, versions)} | {' | '.join(cells)} | {seen}"
                f" | {tool['rss_at_n_mib']} | {tool['cpu_s_load']} | {tool['writes_per_lifecycle']} |"
            )
    said = [r for r in (ratios(run) for run in results["runs"]) if r]
    return "\n".join(lines) + ("\n\n" + "\n".join(said) if said else "")


def draw(results: dict[str, Any], out: Path) -> None:
    versions = results.get("versions") or {}
    panels = []
    for run in results["runs"]:
        rows = [(_label(name, versions), t["latency_ms"])
                for name, t in run["tools"].items() if t["latency_ms"]]  # fmt: skip
        base = run.get("baseline_watch_ms") or {}
        if base:
            rows.insert(0, ("watch baseline", base))
        panels.append(
            (f"N = {run['pods']:,} sandboxes, {run.get('rate', 20):g} status writes/s", rows)
        )
    quantile_chart.draw(
        panels, out, ylabel="status write → verdict seen (ms)",
        title="deathwatch next to agent-sandbox on one API server, one run (bench/peers.py)",
        cols=len(panels), size=(5.2, 3.6),
    )  # fmt: skip


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m bench.latency_chart RESULTS.json OUT.png", file=sys.stderr)
        return 2
    try:
        results = load(Path(argv[0]))
    except ResultsError as exc:
        print(f"latency_chart: {argv[0]}: {exc}", file=sys.stderr)
        return 2
    try:
        draw(results, Path(argv[1]))
    except OSError as exc:
        print(f"latency_chart: {argv[1]}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {argv[1]}; the performance page's table:\n\n{markdown(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
