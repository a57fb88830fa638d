"""One verdict as a document for whoever acts on it: `deathwatch explain -o json` prints it,
and every delivered CloudEvent carries it as its `data` (delivery/events.py). Typed, so a
receiver decodes it with the same structs (`deathwatch.client.VerdictDocument`).

A pure function of what a SandboxVerdict holds (its status, name, DeathWatch and labels) and
the Events that name its pod: `explain` reads those from the API, the controller has them in
memory when it sends an event (and no Events: they are the API's, `events` is empty there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

import msgspec

from deathwatch._api.resources import (
    ConditionType,
    DeliveryMark,
    DisruptionStatus,
    SandboxRef,
    SandboxVerdictStatus,
)
from deathwatch._engine.verdict import State

_TIMELINE = (
    ("Ready", "last_ready_at"),
    ("Ready dropped", "ready_drop_at"),
    ("deadline", "deadline"),
    ("declared", "declared_at"),
    ("pod deleted", "pod_deleted_at"),
)


class _Doc(msgspec.Struct, rename="camel", frozen=True, kw_only=True):
    """Camel-case keys, every field present (null when unknown): a receiver's schema."""


class EvidenceDoc(_Doc, frozen=True):
    container: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    restart_count: int | None = None
    node: str | None = None
    ready_drops: int = 0
    flaps: int = 0


class Moment(_Doc, frozen=True):
    at: datetime
    what: str


class ConditionDoc(_Doc, frozen=True):
    status: str
    reason: str
    message: str
    since: datetime | None = None


class EventDoc(_Doc, frozen=True):
    at: str | None
    type: str | None
    reason: str | None
    from_: str = msgspec.field(name="from")
    object: str | None
    count: int
    message: str | None


class VerdictDocument(_Doc, frozen=True):
    """What `deathwatch explain -o json` prints, and what each delivered event carries."""

    namespace: str
    pod: str
    pod_uid: str | None = msgspec.field(name="podUID")
    death_watch: str | None
    state: State
    cause: str | None
    origin: str | None
    disruption: DisruptionStatus | None
    policy: str | None
    sandbox: SandboxRef | None
    why: str | None
    evidence: EvidenceDoc
    timeline: list[Moment]
    shielded: ConditionDoc | None
    policy_error: ConditionDoc | None
    probe_blocked_by_firewall: ConditionDoc | None
    labels: dict[str, str]
    events: list[EventDoc]
    # how many times the state changed, and per sink the last event sent to an end
    transitions: int | None = None
    delivery: list[DeliveryMark] = msgspec.field(default_factory=list)


def document(
    namespace: str,
    pod: str,
    deathwatch: str | None,
    status: SandboxVerdictStatus | None,
    labels: Mapping[str, str],
    events: Iterable[Mapping[str, Any]] = (),
) -> VerdictDocument:
    s = status
    conditions = {
        c.type: ConditionDoc(status=str(c.status), reason=c.reason, message=c.message,
                             since=c.last_transition_time)
        for c in (s.conditions if s else [])
    }  # fmt: skip
    marks = [(getattr(s, attr), what) for what, attr in _TIMELINE if s and getattr(s, attr)]
    if s and s.disruption and s.disruption.since:
        marks.append((s.disruption.since, f"DisruptionTarget {s.disruption.reason}"))
    # by time, not by text: "10:05:00.2Z" sorts before "10:05:00Z" as a string
    timeline = [Moment(at=at, what=what) for at, what in sorted(marks, key=lambda m: m[0])]
    alive = conditions.get(ConditionType.ALIVE)
    evidence = EvidenceDoc(
        container=s.container, exit_code=s.exit_code, reason=s.reason,
        restart_count=s.restart_count, node=s.node, ready_drops=s.ready_drops, flaps=s.flaps,
    ) if s else EvidenceDoc()  # fmt: skip
    return VerdictDocument(
        namespace=namespace,
        pod=pod,
        pod_uid=s.pod_uid if s else None,
        death_watch=deathwatch,
        state=s.state if s else State.PENDING,
        cause=str(s.cause) if s and s.cause else None,
        origin=str(s.origin) if s and s.origin else None,
        disruption=s.disruption if s else None,
        policy=s.policy if s else None,
        sandbox=s.sandbox if s else None,
        why=alive.message if alive else None,
        evidence=evidence,
        timeline=timeline,
        shielded=conditions.get(ConditionType.SHIELDED),
        policy_error=conditions.get(ConditionType.POLICY_ERROR),
        probe_blocked_by_firewall=conditions.get(ConditionType.PROBE_BLOCKED),
        labels=dict(labels),
        events=[_event(e) for e in sorted(events, key=_event_time)],
        transitions=s.transitions if s else None,
        delivery=list(s.delivery or ()) if s else [],
    )


def _event_time(e: Mapping[str, Any]) -> str:
    return str(e.get("eventTime") or e.get("lastTimestamp") or e.get("firstTimestamp") or "")


def _event(e: Mapping[str, Any]) -> EventDoc:
    source = e.get("reportingComponent") or (e.get("source") or {}).get("component") or ""
    return EventDoc(
        at=_event_time(e) or None,
        type=e.get("type"),
        reason=e.get("reason"),
        from_=source,
        object=(e.get("involvedObject") or {}).get("kind"),
        count=e.get("count") or 1,
        message=e.get("message"),
    )
