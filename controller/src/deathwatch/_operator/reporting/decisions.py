"""What one step of the engine means for the outside world, decided in one pure function:
what to announce (Events), whether the verdict is written, the sandbox's shield and what its
DeathWatch now counts for it. No I/O, no clock (the caller passes `now`), no state, and no
document: how each thing is said is the next stage's (sandbox_verdicts, pod_events).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from deathwatch._api.resources import ConditionStatus, EventReason
from deathwatch._engine.engine import SignalKind, Step, Track
from deathwatch._engine.verdict import Cause, Evidence, State
from deathwatch._operator.reporting.shield import NodeCoverage, Shield


@dataclass(frozen=True, slots=True)
class Facts:
    """What one sandbox contributes to its DeathWatch's status and to the gauges."""

    state: State
    flaps: int = 0
    false_positive: bool = False
    shield: ConditionStatus | None = None  # a live sandbox's Shielded status, when judged
    exposed_on: str | None = None  # its node, while it is live and not shielded
    node: str | None = None  # its node, while it is live
    audited: bool = False  # live, and not shielded because its node audits on purpose
    death: Evidence | None = None  # while Dead


@dataclass(frozen=True, slots=True)
class Announcement:
    """An Event to post on the pod (sandbox_verdicts.events builds it): its reason, and what its
    message needs beyond the track."""

    reason: EventReason
    last_seen: State | None = None  # SandboxLostTrack: the state it was last seen in
    shield: Shield | None = None  # SandboxUnshielded: why
    spell: str | None = None  # SandboxUnshielded: which spell (the same on every replica)


@dataclass(frozen=True, slots=True)
class Before:
    """What the controller knew of the sandbox before this step."""

    persisted: bool  # its SandboxVerdict exists (or is being created)
    shield: Shield | None
    shield_since: datetime | None
    node: str | None


@dataclass(frozen=True, slots=True)
class Consequence:
    forget: bool  # never a running sandbox and never written: nothing to keep
    write: bool  # its verdict must say what the track says now
    urgent: bool  # Dead: the write jumps the queue
    events: tuple[Announcement, ...]
    shield: Shield | None
    shield_since: datetime | None
    facts: Facts | None  # what its DeathWatch counts for it (None when forgotten)


FORGOTTEN = Consequence(True, False, False, (), None, None, None)


def decide(
    step: Step,
    before: Before,
    now: datetime,
    shield: Shield | None,
    claim: NodeCoverage | None,
) -> Consequence:
    """`shield`: the sandbox's shield as judged now, or `before.shield` when nothing it
    depends on changed (None: no firewall is configured, or nothing read yet). `claim`: its
    node's coverage claim, naming the spell of an Unshielded Event."""
    track = step.track
    if not track.ever_ready and track.state.terminal and not before.persisted:
        return FORGOTTEN
    write = track.ever_ready or track.probe_blocked or before.persisted
    if not write:
        # nothing is said of it yet (never Ready): its shield is judged, and its spell
        # announced, with its first verdict, not lost with a write that never happens
        facts_now = facts(track, before.shield, before.node)
        return Consequence(False, False, False, (), before.shield, before.shield_since, facts_now)
    events = list(_events(step))
    # a final verdict keeps the shield it had when it was declared
    if track.state.terminal and before.shield is not None:
        shield = before.shield
    since = before.shield_since
    if shield is not None and (before.shield is None or before.shield.status is not shield.status):
        since = now
        if shield.exposed and not track.state.terminal:
            spell = f"{before.node}/{shield.reason}/{claim.renew_time if claim else 'none'}"
            events.append(Announcement(EventReason.SANDBOX_UNSHIELDED, shield=shield, spell=spell))
    return Consequence(
        forget=False,
        write=True,
        urgent=track.state is State.DEAD,
        events=tuple(events),
        shield=shield,
        shield_since=since,
        facts=facts(track, shield, before.node),
    )


def _events(step: Step) -> list[Announcement]:
    track = step.track
    out = []
    for signal in step.signals:
        if signal.kind is SignalKind.STATE_CHANGED:
            if track.state is State.DEAD:
                out.append(Announcement(EventReason.SANDBOX_DEAD))
            elif track.cause is Cause.UNOBSERVED:
                out.append(Announcement(EventReason.SANDBOX_LOST_TRACK, last_seen=signal.previous))
        elif signal.kind is SignalKind.FALSE_POSITIVE:
            out.append(Announcement(EventReason.SANDBOX_FALSE_POSITIVE))
        elif signal.kind is SignalKind.PROBE_BLOCKED:
            out.append(Announcement(EventReason.PROBE_BLOCKED))
        elif signal.kind is SignalKind.DISPUTED:
            out.append(Announcement(EventReason.NODE_EXIT_DISPUTED))
        elif signal.kind is SignalKind.SIDECAR_RESTARTED and not track.state.terminal:
            out.append(Announcement(EventReason.SIDECAR_RESTARTED))
    return out


def facts(track: Track, shield: Shield | None, node: str | None) -> Facts:
    live = not track.state.terminal
    return Facts(
        state=track.state,
        flaps=track.flaps,
        false_positive=track.false_positive,
        shield=shield.status if shield is not None and live else None,
        exposed_on=node if shield is not None and live and shield.exposed and node else None,
        node=node if live else None,
        audited=shield is not None and live and shield.audited,
        death=track.evidence if track.state is State.DEAD else None,
    )
