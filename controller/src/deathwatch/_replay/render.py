"""The two faces of a replay report: one JSON object for machines, a table for people."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

from deathwatch._engine.timeutil import format_time
from deathwatch._engine.verdict import State
from deathwatch._replay.run import Report


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile of already sorted values (q in 0..100)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[rank - 1]


def render_json(report: Report) -> str:
    return json.dumps(report.as_json(), indent=2, sort_keys=False)


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 600:
        return f"{value:.1f}s"
    return f"{value / 60:.1f}m"


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [
        [str(c) for c in headers],
        *[[("-" if c is None else str(c)) for c in r] for r in rows],
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return [
        "   ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]


def render_table(report: Report, source: str) -> str:
    out: list[str] = []
    out.append(
        f"{source}: {report.events} events, {report.pod_events} about selected pods, "
        f"clock ends {format_time(report.clock) or '-'}"
    )
    out.append("")
    states = [State.ALIVE, State.SUSPECT, State.DEAD, State.GONE]
    rows = []
    for policy, row in report.per_policy.items():
        rows.append(
            [
                policy,
                row.get("sandboxes", 0),
                row.get("ready_drops", 0),
                row.get("flaps", 0),
                *(row.get(str(s), 0) for s in states),
                row.get("false_positives", 0),
            ]
        )
    rows.append(
        [
            "total",
            report.sandboxes,
            report.ready_drops,
            report.flaps,
            *(sum(r.get(str(s), 0) for r in report.per_policy.values()) for s in states),
            report.false_positives,
        ]
    )
    headers = [
        "POLICY",
        "SANDBOXES",
        "DROPS",
        "FLAPS",
        "ALIVE",
        "SUSPECT",
        "DEAD",
        "GONE",
        "FALSE+",
    ]
    out.extend(_table(headers, rows))
    out.append("")
    never = report.verdicts.get(str(State.PENDING), 0)
    if never:
        out.append(f"{never} pod(s) never became Ready (Pending; no verdict is possible for them)")
    causes = ", ".join(f"{c} {n}" for c, n in sorted(report.causes.items(), key=lambda x: -x[1]))
    out.append(f"Death causes: {causes or 'none'}")
    origins = ", ".join(f"{o} {n}" for o, n in report.origins.items())
    out.append(f"Deaths by origin: {origins or 'none'}")
    d = report.detection_delays
    out.append(
        "Detection delay (Ready drop -> Dead): "
        + "  ".join(f"p{q} {_seconds(percentile(d, q))}" for q in (50, 90, 99))
        + f"  max {_seconds(d[-1] if d else None)}  (n={len(d)})"
    )
    if report.probe_blocked:
        out.append(
            f"{len(report.probe_blocked)} pod(s) have a network readiness probe on an agent port "
            "(ProbeBlockedByFirewall: the firewall refuses it; give them an exec probe):"
        )
        out.extend(f"  {pod}" for pod in report.probe_blocked)
    if report.dead:
        out.append("")
        out.extend(
            _table(
                [
                    "NAMESPACE",
                    "NAME",
                    "POLICY",
                    "CAUSE",
                    "ORIGIN",
                    "CONTAINER",
                    "EXIT",
                    "READY-DROP",
                    "DECLARED",
                ],
                [
                    [
                        e.namespace,
                        e.name,
                        e.policy,
                        e.cause,
                        e.origin,
                        e.container,
                        e.exit_code,
                        format_time(e.ready_drop_at),
                        format_time(e.declared_at),
                    ]
                    for e in report.dead
                ],
            )
        )
    if report.skipped.count:
        out.append("")
        out.append(f"Skipped {report.skipped.count} object(s) with missing or odd fields:")
        out.extend(f"  {line}" for line in report.skipped.examples)
    return "\n".join(out) + "\n"
