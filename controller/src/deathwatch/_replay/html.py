"""`deathwatch replay --format html`: one self-contained page (every plot an inline SVG made
with matplotlib, no script, no external reference) of what the replay found: per-pod
timelines, the policies side by side on the same recording, detection delays, deaths per
cause and per node.

`Timelines` watches the replay as it runs (each event's pod, each step's verdict) and keeps
only what the page draws; `page` is pure. matplotlib is imported here only (the optional
`deathwatch[report]` extra): the rest of replay never pays for it.
"""

from __future__ import annotations

import html
import io
import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from deathwatch._engine.engine import Step
from deathwatch._engine.verdict import State
from deathwatch._replay.events import SkippedEvent, ViewEvent
from deathwatch._replay.run import Report

SHOWN_PODS = 30  # timelines drawn: the dead first, then the flapping, then the rest
_COLOURS = {State.ALIVE: "#2e7d32", State.SUSPECT: "#f9a825", State.DEAD: "#c62828",
            State.GONE: "#757575", State.PENDING: "#90a4ae"}  # fmt: skip


class MissingPlotting(Exception):
    """matplotlib is not installed (the `deathwatch[report]` extra)."""


@dataclass
class _Pod:
    namespace: str
    name: str
    node: str | None = None
    ready: list[tuple[datetime, bool]] = field(default_factory=list)
    states: list[tuple[datetime, State]] = field(default_factory=list)


class Timelines:
    """Per pod: its node, its Ready changes and its verdict's changes, as the replay saw them."""

    def __init__(self) -> None:
        self.pods: dict[str, _Pod] = {}

    def observe(
        self, item: ViewEvent | SkippedEvent, steps: Sequence[Step], now: datetime | None
    ) -> None:
        if isinstance(item, ViewEvent):
            pod = item.pod
            seen = self.pods.get(pod.uid)
            if seen is None:
                seen = self.pods[pod.uid] = _Pod(pod.namespace, pod.name)
            seen.node = pod.node_name or seen.node
            at = pod.ready_changed_at or now
            if at is not None and (not seen.ready or seen.ready[-1][1] != pod.ready):
                seen.ready.append((at, pod.ready))
        for step in steps:
            track = step.track
            seen = self.pods.get(track.uid)
            at = track.changed_at or now
            if seen is None or at is None:
                continue
            if not seen.states or seen.states[-1][1] is not track.state:
                seen.states.append((at, track.state))


def _plt() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise MissingPlotting(
            "--format html needs matplotlib: pip install 'deathwatch[report]'"
        ) from exc
    plt.rcParams.update({"font.size": 9, "svg.fonttype": "none", "figure.dpi": 96})
    return plt


def _svg(plt: Any, fig: Any) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]


def _timelines(plt: Any, timelines: Timelines, report: Report, end: datetime | None) -> str:
    dead = {(e.namespace, e.name) for e in report.dead}
    pods = sorted(
        timelines.pods.values(),
        key=lambda p: ((p.namespace, p.name) not in dead, -len(p.ready), p.namespace, p.name),
    )[:SHOWN_PODS]
    pods = [p for p in pods if p.ready or p.states]
    if not pods:
        return "<p>No pod became Ready.</p>"
    starts = [t for p in pods for t, _ in (p.ready[:1] or p.states[:1])]
    origin = min(starts)
    last = end or max(t for p in pods for t, _ in (p.ready + p.states))
    span = max((last - origin).total_seconds(), 1.0)
    fig, ax = plt.subplots(figsize=(10, 0.32 * len(pods) + 1.2))
    for row, p in enumerate(reversed(pods)):
        marks = [*p.ready, (last, p.ready[-1][1] if p.ready else False)]
        for (t0, ready), (t1, _) in itertools.pairwise(marks):
            x0 = (t0 - origin).total_seconds()
            width = max((t1 - t0).total_seconds(), span / 2000)
            ax.broken_barh([(x0, width)], (row - 0.3, 0.6),
                           color="#a5d6a7" if ready else "#eceff1")  # fmt: skip
        for t, state in p.states:
            if state in (State.SUSPECT, State.DEAD, State.GONE):
                ax.plot((t - origin).total_seconds(), row, marker="|" if state is not State.DEAD
                        else "X", color=_COLOURS[state], markersize=10)  # fmt: skip
    ax.set_yticks(range(len(pods)))
    ax.set_yticklabels([f"{p.namespace}/{p.name}" for p in reversed(pods)])
    ax.set_xlabel("seconds since the first pod shown became Ready (green: Ready)")
    ax.set_xlim(0, span * 1.02)
    for state in (State.SUSPECT, State.DEAD, State.GONE):
        ax.plot([], [], marker="X" if state is State.DEAD else "|", linestyle="",
                color=_COLOURS[state], label=str(state))  # fmt: skip
    ax.legend(loc="upper right", fontsize=8)
    return _svg(plt, fig)


def _bars(plt: Any, counts: Mapping[str, int], xlabel: str) -> str:
    if not counts:
        return "<p>None.</p>"
    items = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(items) + 0.9))
    ax.barh([k for k, _ in reversed(items)], [v for _, v in reversed(items)], color="#c62828")
    ax.set_xlabel(xlabel)
    ax.xaxis.get_major_locator().set_params(integer=True)
    return _svg(plt, fig)


def _histogram(plt: Any, delays: Sequence[float]) -> str:
    if not delays:
        return "<p>No death with a Ready drop.</p>"
    fig, ax = plt.subplots(figsize=(6, 2.6))
    ax.hist(delays, bins=min(30, max(5, len(delays) // 2)), color="#5c6bc0")
    ax.set_xlabel("seconds from the Ready drop to the Dead verdict")
    ax.set_ylabel("deaths")
    ax.yaxis.get_major_locator().set_params(integer=True)
    return _svg(plt, fig)


def _policies(plt: Any, by_policy: Mapping[str, Report]) -> str:
    names = list(by_policy)
    kinds: dict[str, list[int]] = {
        "Dead": [by_policy[n].verdicts.get(str(State.DEAD), 0) for n in names],
        "false positives": [by_policy[n].false_positives for n in names],
        "flaps": [by_policy[n].flaps for n in names],
    }
    fig, ax = plt.subplots(figsize=(7, 2.8))
    width = 0.8 / len(kinds)
    for i, (label, values) in enumerate(kinds.items()):
        ax.bar([x + i * width for x in range(len(names))], values, width, label=label)
    ax.set_xticks([x + width for x in range(len(names))])
    ax.set_xticklabels(names)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.legend(fontsize=8)
    return _svg(plt, fig)


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def page(report: Report, timelines: Timelines, by_policy: Mapping[str, Report], name: str) -> str:
    """The whole page, as text. Raises MissingPlotting without matplotlib."""
    plt = _plt()
    nodes = Counter(
        timelines.pods[e.pod_uid].node or "(unscheduled)"
        for e in report.dead
        if e.pod_uid in timelines.pods
    )
    delays = report.detection_delays
    policy_rows = [
        [p, r.sandboxes, r.verdicts.get(str(State.DEAD), 0), r.false_positives, r.flaps,
         f"{sorted(r.detection_delays)[len(r.detection_delays) // 2]:.1f}" if r.detection_delays
         else "-"]
        for p, r in by_policy.items()
    ]  # fmt: skip
    dead_rows = [
        [f"{e.namespace}/{e.name}", e.policy, str(e.cause), str(e.origin), e.exit_code or "",
         e.ready_drop_at.isoformat() if e.ready_drop_at else "", e.declared_at.isoformat()]
        for e in report.dead
    ]  # fmt: skip
    title = f"deathwatch replay: {name}"
    summary = (
        f"{report.events:,} events, {report.sandboxes:,} sandboxes (pods that became Ready), "
        f"{report.ready_drops:,} Ready drops, {report.flaps:,} flaps, "
        f"{report.verdicts.get(str(State.DEAD), 0):,} Dead, {report.false_positives} false "
        f"positives; policy per pod: "
        + ", ".join(f"{p} {n}" for p, n in sorted(report.policies.items()))
    )
    sections = [
        ("Pods over time", "The dead first, then those whose Ready dropped most; green is "
         "Ready; marks where the verdict turned Suspect, Dead (X) or Gone.",
         _timelines(plt, timelines, report, report.clock)),
        ("Each policy on this recording", "The same events judged by each policy alone, as "
         "if every DeathWatch had asked for it (false positives: a Dead pod that later became "
         "Ready again).", _policies(plt, by_policy)
         + _table(["policy", "sandboxes", "Dead", "false positives", "flaps",
                   "median delay s"], policy_rows)),
        ("Detection delay", f"{len(delays)} deaths.", _histogram(plt, delays)),
        ("Deaths per cause", "", _bars(plt, report.causes, "deaths")),
        ("Deaths per node", "", _bars(plt, dict(nodes), "deaths")),
        ("Deaths", "", _table(["pod", "policy", "cause", "origin", "exit", "Ready drop",
                               "declared"], dead_rows)),
    ]  # fmt: skip
    body = "".join(
        f"<section><h2>{html.escape(h)}</h2><p>{html.escape(text)}</p>{content}</section>"
        for h, text, content in sections
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{html.escape(title)}</title><style>"
        "body{font:14px/1.4 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}"
        "table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;"
        "padding:2px 6px;text-align:left}section{margin-bottom:2em}svg{max-width:100%;"
        "height:auto}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>{body}</body></html>\n"
    )
